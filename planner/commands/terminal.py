"""What a command does around the library: SIGTERM and SIGHUP turned into an exception (so that ranks are
stopped in ``finally``), and the library's warnings and notes turned into ``pipeplan: ...`` lines on stderr."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from planner.errors import PipeplanWarning

__all__ = ["Signalled", "signals_interrupt", "library_words", "quiet_torch"]


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread is so that every ``finally`` (stopping ranks) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop verify like Ctrl-C: the ranks and their process groups are stopped first."""

    def handler(signum: int, _frame: object) -> None:
        raise Signalled(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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
