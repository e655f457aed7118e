"""How far a run has gone, shown while it runs: ``verify``, ``calibrate --model`` and the pipeline run that ends
``pipeplan profile`` take minutes on a CPU, and print nothing else until their report.

A rank started by :func:`planner.runtime.launch.run_ranks` reports through :func:`report_progress` (rank 0's
reports are sent to the launching process on the pipe its result later takes); the launching process shows them
as a bar (:class:`ProgressBar`). A run in this process (replay mode) shows its own bar, and so does a torchrun
job's rank 0. The bar is drawn on a terminal only: where stderr is a file or a pipe (CI, a script, a torchrun
job's logs redirected), the report is the output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Phases", "ProgressBar", "Show", "report_progress", "report_to"]

Show = Callable[[int, int, str], None]
"""What shows a report: ``show(done, total, what)``."""

_channel: Show | None = None
"""Where this process's reports go: rank 0's result pipe in a rank of a local launch, a torchrun job's rank 0's own
bar; None elsewhere."""


def report_to(channel: Show | None) -> None:
    """Hand this process's later :func:`report_progress` calls to ``channel``, or to nobody (None)."""
    global _channel
    _channel = channel


def report_progress(done: int, total: int, what: str) -> None:
    """``done`` of ``total`` phases of ``what`` (``"verify"``, ``"18 plans in 24 rounds"``) are done; a no-op where
    nobody shows it (:func:`report_to`)."""
    if _channel is not None:
        _channel(done, total, what)


class ProgressBar:
    """A bar on stderr, on a terminal only, made at the first report: the average rate since then gives its ETA
    (a run's phases take about alike)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def __call__(self, done: int, total: int, what: str) -> None:
        if self._bar is None:
            from tqdm import tqdm

            # Drawn at every report (mininterval 0): a report comes as a phase ends, seconds apart.
            self._bar = tqdm(
                total=total,
                desc=what,
                disable=None,
                file=sys.stderr,
                unit="step",
                leave=False,
                smoothing=0,
                mininterval=0,
            )
        self._bar.total = max(total, done)
        self._bar.set_description(what, refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Phases:
    """A run's phases done of those it will run (a warm-up, a timed step, a round, a memory step), shown as each
    ends: by ``show``, :func:`report_progress` unless given (a rank's, for its launching process)."""

    def __init__(self, total: int, what: str, show: Show = report_progress) -> None:
        self.done, self.total, self.what, self.show = 0, total, what, show
        show(0, total, what)

    def end(self, left: int | None = None) -> None:
        """One more phase is done; ``left``: how many are still to come, where a time floor can add steps."""
        self.done += 1
        self.total = self.total if left is None else self.done + left
        self.show(self.done, self.total, self.what)
