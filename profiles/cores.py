"""The cores a machine shares out among its local ranks, and torch's threads set around a piece of work (torch is
imported only there: the launcher and the CLI import this module to start)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager

__all__ = ["rank_threads", "intra_op_threads", "untimed_on_every_core"]


def rank_threads(world_size: int) -> int:
    """torch intra-op threads each of ``world_size`` local processes gets: the cores shared out, at least 1."""
    return max(1, (os.cpu_count() or 1) // world_size)


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count``, restored after."""
    import torch  # here: this module is imported without torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def untimed_on_every_core(device_type: str) -> AbstractContextManager[None]:
    """Around work whose time is not measured (a memory-tracking step, a model's splits): on a CPU, every core's
    threads; elsewhere nothing. What such work counts, the tensors held, is the same at any thread count.

    Not where other work keeps the cores busy (the 1-minute load average, this process's own work included, within
    half a core of every core): more threads than cores would slow that work, timed or not, and this alike."""
    cores = os.cpu_count() or 1
    if device_type != "cpu" or os.getloadavg()[0] > cores - 0.5:
        return contextlib.nullcontext()
    return intra_op_threads(cores)
