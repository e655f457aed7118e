"""ASCII and PNG pictures of simulated iterations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.errors import UsageError
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import simulate
from planner.schedule.timeline import ascii_timeline, render_comparison_png, render_png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ascii_gpipe_rows_and_boxes() -> None:
    # P=4, M=4, f=b=1: iteration 14 time units; width 42 gives each action exactly 3 cells.
    r = simulate(Pipeline([1.0] * 4, [1.0] * 4, 4, "gpipe"))
    text = ascii_timeline(r, width=42)
    lines = text.splitlines()
    rows = [line for line in lines if line.startswith("rank")]
    assert len(rows) == 4
    assert lines[0] == "gpipe: P=4, M=4, iteration 14.0 s, bubble 42.9%"
    for rank, row in enumerate(rows):
        cells = row.split("|")[1]
        assert len(cells) == 42
        assert re.findall(r"F(\d)F", cells) == ["0", "1", "2", "3"]
        assert re.findall(r"B(\d)B", cells) == ["0", "1", "2", "3"]
        assert cells.count(".") == 3 * 2 * 3  # 2 (P - 1) idle slots of 3 cells
        assert cells.startswith("." * 3 * rank + "F0F")
    assert "F = forward, B = backward" in lines[-1]
    assert "1 cell = 333 ms" in lines[-1]


def test_ascii_zero_bubble_shows_weight_grad() -> None:
    r = simulate(Pipeline([1.0] * 2, [2.0] * 2, 2, "zero-bubble", weight_s=[1.0] * 2))
    text = ascii_timeline(r, width=40)
    assert "I = input-grad backward, W = weight-grad backward" in text
    assert "W0" in text and "I1" in text


def test_ascii_rejects_tiny_width() -> None:
    with pytest.raises(ValueError, match="at least 10"):
        ascii_timeline(simulate(Pipeline([1.0], [1.0], 1, "naive")), width=5)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5000
    # atomic write: no temp file left next to it
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_render_png(tmp_path: Path) -> None:
    out = tmp_path / "one.png"
    render_png(simulate(Pipeline([1.0] * 4, [2.0] * 4, 8, "1f1b")), out)
    _assert_png(out)


def test_render_png_interleaved_with_title(tmp_path: Path) -> None:
    out = tmp_path / "il.png"
    render_png(simulate(Pipeline([0.5] * 8, [1.0] * 8, 8, "interleaved-1f1b")), out, title="interleaved")
    _assert_png(out)


def test_render_comparison_png(tmp_path: Path) -> None:
    out = tmp_path / "cmp.png"
    results = [simulate(Pipeline([1.0] * 4, [2.0] * 4, 8, s)) for s in ("gpipe", "1f1b", "zero-bubble")]
    results.append(simulate(Pipeline([0.5] * 8, [1.0] * 8, 8, "interleaved-1f1b")))
    render_comparison_png(results, out)
    _assert_png(out)


def test_png_into_missing_folder_fails_early(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="output folder does not exist"):
        render_png(simulate(Pipeline([1.0], [1.0], 1, "naive")), tmp_path / "nope" / "x.png")
    with pytest.raises(ValueError, match="at least one result"):
        render_comparison_png([], tmp_path / "x.png")
