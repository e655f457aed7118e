"""Progress while a run runs: phases counted as they end, rank 0's reports carried to the launching process, a bar
drawn on a terminal only."""

from __future__ import annotations

import io
import sys

import planner.runtime.launch as launch
from planner.runtime.launch import run_ranks
from planner.runtime.progress import Phases, ProgressBar


def test_phases_count_up_and_a_time_floor_can_add_some() -> None:
    shown: list[tuple[int, int, str]] = []
    phases = Phases(4, "verify", lambda *report: shown.append(report))
    phases.end()
    phases.end(left=3)  # a time floor asked for one more step than planned
    phases.end(left=0)
    assert shown == [(0, 4, "verify"), (1, 4, "verify"), (2, 5, "verify"), (3, 3, "verify")]


def _three_phases(rank: int, world_size: int) -> int:
    phases = Phases(3, "three phases")
    for _ in range(3):
        phases.end()
    return rank


def test_rank_0s_progress_reaches_the_launching_process_before_the_results(monkeypatch) -> None:
    shown: list[object] = []

    class Recording:
        def __call__(self, done: int, total: int, what: str) -> None:
            shown.append((done, total, what))

        def close(self) -> None:
            shown.append("closed")

    monkeypatch.setattr(launch, "ProgressBar", Recording)
    assert run_ranks(_three_phases, (), 2, timeout_s=60, backend=None) == [0, 1]
    assert shown == [(k, 3, "three phases") for k in range(4)] + ["closed"]  # rank 1 reports nothing


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_a_terminal_only(monkeypatch) -> None:
    for stream, drawn in ((_Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        bar = ProgressBar()
        bar(0, 4, "verify")
        bar(2, 4, "verify")
        bar.close()
        assert ("verify:  50%" in stream.getvalue() and "2/4" in stream.getvalue()) is drawn, stream.getvalue()
