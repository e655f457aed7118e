"""docs/BENCHMARKS.md is its rendering from the records (benchmarks/render.py), and records carry their fields."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import render  # noqa: E402
from common import RECORD_FORMAT, run_started, table_from_markdown, write_record  # noqa: E402


def test_pages_match_their_rendering() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    results, docs = tmp_path / "results", tmp_path / "docs"
    shutil.copytree(ROOT / "benchmarks" / "results", results, ignore=shutil.ignore_patterns(".trial"))
    docs.mkdir()
    for _, page in render.PAGES:
        shutil.copy(ROOT / "docs" / page, docs / page)
    return results, docs


def test_a_changed_record_changes_the_page(tmp_path: Path) -> None:
    results, docs = _copy(tmp_path)
    assert render.check(results, docs) == []
    path, record = render.latest_records(results)["ratios"]
    record["numbers"]["pair_error_worst_pct"] = 99.9
    path.write_text(json.dumps(record), encoding="utf-8")
    problems = render.check(results, docs)
    assert len(problems) == 1 and problems[0].startswith("BENCHMARKS.md differs from its rendering")
    assert "99.9" in render.render_all(results, docs)[docs / "BENCHMARKS.md"]


def test_a_later_record_replaces_the_earlier(tmp_path: Path) -> None:
    results, docs = _copy(tmp_path)
    path, record = render.latest_records(results)["default_path"]
    record["date"] = "2999-01-01"
    record["numbers"]["median_abs_error_at_speed_pct"] = 1.23
    (path.parent / "2999-01-01.json").write_text(json.dumps(record), encoding="utf-8")
    page = render.render_all(results, docs)[docs / "BENCHMARKS.md"]
    assert "1.23 % at the machine's speed" in page and "2999-01-01" in page


def test_a_missing_table_is_one_line(tmp_path: Path) -> None:
    results, _ = _copy(tmp_path)
    with pytest.raises(render.RenderError, match="has no table 'nope'"):
        render.render_page("{{table:ratios.nope}}", render.latest_records(results))


def test_check_exits_1_with_one_line(tmp_path: Path) -> None:
    results, docs = _copy(tmp_path)
    (docs / "BENCHMARKS.md").write_text("edited by hand\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "render.py"),
            "--check",
            "--results",
            str(results),
            "--docs",
            str(docs),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "BENCHMARKS.md differs from its rendering" in done.stderr


def test_write_record_writes_the_fields(tmp_path: Path) -> None:
    started = run_started(["benchmarks/bench_example.py", "--flag", "2"])
    table = table_from_markdown("| a | b |\n|---|---|\n| 1 | x y |\n")
    path = write_record(
        "example", {"wall_s": 1.5}, started=started, tables={"t": table}, conditions="quiet", results_dir=tmp_path
    )
    assert path == tmp_path / "example" / f"{started.started_utc[:10]}.json"
    record = json.loads(path.read_text())
    assert record["format"] == RECORD_FORMAT and record["version"] == 1 and record["benchmark"] == "example"
    assert record["date"] == started.started_utc[:10] and record["started"].endswith("Z") and record["finished"]
    assert record["command"] == "python benchmarks/bench_example.py --flag 2"
    assert set(record["machine"]) == {"cpu", "cores", "memory_gib", "gpu", "os"} and record["machine"]["cores"] >= 1
    versions = record["versions"]
    assert versions["python"] and versions["torch"] and set(versions["solvers"]) == {"pulp", "highspy"}
    assert "pipeplan" in versions
    assert set(record["load"]) == {"before", "after", "conditions"} and record["load"]["conditions"] == "quiet"
    assert record["numbers"] == {"wall_s": 1.5}
    assert record["tables"]["t"] == {"columns": ["a", "b"], "rows": [["1", "x y"]]}


def test_a_trial_record_is_not_read(tmp_path: Path) -> None:
    started = run_started(["benchmarks/bench_example.py", "--quick"])
    path = write_record("example", {}, started=started, results_dir=tmp_path, trial=True)
    assert path.parent.parent.name == ".trial"
    assert "example" not in render.latest_records(tmp_path)
