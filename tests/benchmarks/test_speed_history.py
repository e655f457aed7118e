"""A speed record beside the previous one: which record is the previous, and which steps are named slower."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from speed_history import SLOWER, against_previous, previous_record  # noqa: E402


def test_the_previous_record_is_the_latest_of_an_earlier_date(tmp_path: Path) -> None:
    folder = tmp_path / "own_speed"
    folder.mkdir()
    for date, seconds in (("2026-12-04", 4.0), ("2026-12-06", 6.0), ("2026-12-07", 7.0)):
        (folder / f"{date}.json").write_text(json.dumps({"numbers": {"start_up_s": seconds}}))
    (folder / "2026-12-05.json.tmp").write_text("{}")  # not a record
    name, record = previous_record("own_speed", "2026-12-07", tmp_path)  # type: ignore[misc]
    assert name == "2026-12-06.json" and record["numbers"]["start_up_s"] == 6.0
    assert previous_record("own_speed", "2026-12-04", tmp_path) is None
    assert previous_record("suite", "2026-12-07", tmp_path) is None


def test_a_step_20_percent_slower_is_named_and_flagged() -> None:
    now = {"start-up": 0.31, "cluster search": 12.1, "calibrate": 50.0, "new step": 1.0}
    before = {"start-up": 0.25, "cluster search": 10.0, "calibrate": 60.0}
    table, slower = against_previous(now, before, "2026-12-06.json")
    assert SLOWER == 0.20 and slower == ["start-up", "cluster search"]
    assert table["columns"] == ["step", "wall", "in 2026-12-06.json", "change"]
    assert table["rows"] == [
        ["start-up", "0.31 s", "0.25 s", "+24% (slower by 20% or more)"],
        ["cluster search", "12.1 s", "10.0 s", "+21% (slower by 20% or more)"],
        ["calibrate", "50.0 s", "60.0 s", "-17%"],
        ["new step", "1.00 s", "-", "-"],
    ]
