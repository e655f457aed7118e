"""Silence what a native solver library prints on the process's stdout, which may carry a command's JSON."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["quiet_stdout"]


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence the banner highspy's C++ core prints on stdout even with msg=False: stdout may carry JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
