"""A speed record beside the benchmark's previous one: each time, the previous record's, and the change, with the
steps 20 % slower or more named, so that a slowdown is seen in review (bench_own_speed.py writes them).

The machine's speed moves by up to 1.5x within a minute, so one change between two records is a flag to look at
(rerun, compare interleaved), not a verdict; each record's load says what shared the machine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from common import RESULTS

__all__ = ["SLOWER", "previous_record", "against_previous"]

SLOWER = 0.20
"""A time at least this much above the previous record's is named as slower."""

_DATED = re.compile(r"^(\d{4}-\d{2}-\d{2})\.json$")


def previous_record(benchmark: str, date: str, results_dir: Path | None = None) -> tuple[str, dict[str, Any]] | None:
    """The benchmark's latest record dated before ``date`` (``YYYY-MM-DD``), with its file name; None: none."""
    folder = (results_dir or Path(os.environ.get("PIPEPLAN_RESULTS_DIR", RESULTS))) / benchmark
    if not folder.is_dir():
        return None
    earlier = sorted(p for p in folder.iterdir() if (m := _DATED.match(p.name)) and m.group(1) < date)
    return (earlier[-1].name, json.loads(earlier[-1].read_text(encoding="utf-8"))) if earlier else None


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def against_previous(
    times_s: dict[str, float], previous_s: dict[str, float], previous_name: str
) -> tuple[dict[str, list], list[str]]:
    """The table of ``times_s`` (seconds by step) beside ``previous_s`` (the previous record's, from
    ``previous_name``), and the steps :data:`SLOWER` or more slower than there."""
    rows, slower = [], []
    for step, seconds in times_s.items():
        before = previous_s.get(step)
        if not before:
            rows.append([step, _seconds(seconds), "-", "-"])
            continue
        change = seconds / before - 1.0
        if change >= SLOWER:
            slower.append(step)
        flag = f" (slower by {SLOWER:.0%} or more)" if change >= SLOWER else ""
        rows.append([step, _seconds(seconds), _seconds(before), f"{change:+.0%}{flag}"])
    return {"columns": ["step", "wall", f"in {previous_name}", "change"], "rows": rows}, slower
