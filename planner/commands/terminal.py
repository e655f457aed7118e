"""What a command does around the library: SIGTERM and SIGHUP turned into an exception (so that ranks are
stopped in ``finally``; :func:`planner.runtime.launch.signals_interrupt`, which scripts that launch ranks use
too), and the library's warnings and notes turned into ``pipeplan: ...`` lines on stderr."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from planner.errors import PipeplanWarning
from planner.runtime.launch import Signalled, signals_interrupt

__all__ = ["Signalled", "signals_interrupt", "library_words", "quiet_torch"]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StderrLines(logging.Handler):
    """The library's notes as ``pipeplan: ...`` lines on whatever ``sys.stderr`` is at the time."""

    def emit(self, record: logging.LogRecord) -> None:
        _say(f"pipeplan: {record.getMessage()}")


@contextmanager
def library_words() -> Iterator[None]:
    """While a command runs: ``PipeplanWarning`` as ``pipeplan: warning: ...``, every time it is raised (other
    warnings as Python shows them), and the ``pipeplan`` logger's notes on stderr."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *rest: object, **kwargs: object) -> None:
        if issubclass(category, PipeplanWarning):
            _say(f"pipeplan: warning: {message}")
        else:
            shown(message, category, *rest, **kwargs)

    logger = logging.getLogger("pipeplan")
    handler, level, propagate = StderrLines(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    with warnings.catch_warnings():
        warnings.simplefilter("always", PipeplanWarning)
        warnings.showwarning = show
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


@contextmanager
def quiet_torch() -> Iterator[None]:
    """torch's deprecation and resource warnings are not the user's concern, and would follow the error line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", module=r"torch(\..*)?$")
        yield
