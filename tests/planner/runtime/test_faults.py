"""run_ranks: a rank that raises, hangs or is killed ends in one ExecutionError naming it; nothing is left."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from planner.errors import ExecutionError
from planner.runtime.launch import FAULT_ENV, run_ranks

torch.set_num_threads(1)


def _all_reduce(rank: int, world_size: int) -> float:
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def _rank0_raises_after_barrier(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        raise ValueError("bad batch")
    dist.all_reduce(torch.ones(1))  # blocks until rank 0's death breaks the connection


def _rank0_lingers(rank: int, world_size: int) -> int:
    """No collective, rank 0 returning after a second: one that returns at once tears down its end of the process
    group while the other rank may still be joining it (gloo's connectFullMesh then fails there, "Connection closed
    by peer", before that rank reaches its fault: seen under load)."""
    if rank == 0:
        time.sleep(1.0)
    return rank * 10


def _spawned_children() -> list[int]:
    """Pids of live processes whose parent is this one and that run multiprocessing's spawn_main."""
    me = os.getpid()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    yield
    assert multiprocessing.active_children() == []
    assert _spawned_children() == []


def test_results_come_back_in_rank_order() -> None:
    assert run_ranks(_all_reduce, (), 2, timeout_s=60) == [3.0, 3.0]


def test_a_raising_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "1:raise")
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match=r"^rank 1 failed: RuntimeError: boom$"):
        run_ranks(_all_reduce, (), 2, timeout_s=60)
    assert time.monotonic() - t0 < 60


def test_the_root_cause_wins_over_the_peer_error() -> None:
    # Rank 1 also fails (its all_reduce loses its peer), later: rank 0's error is the one reported.
    # The message leads with where the user's code raised (planner/runtime/failure.py).
    lines, first = inspect.getsourcelines(_rank0_raises_after_barrier)
    line = first + next(k for k, text in enumerate(lines) if "raise ValueError" in text)
    where = rf"at test_faults\.py:{line} in _rank0_raises_after_barrier"
    with pytest.raises(ExecutionError, match=rf"^rank 0 failed {where}: ValueError: bad batch$"):
        run_ranks(_rank0_raises_after_barrier, (), 2, timeout_s=60)


def test_a_hanging_rank_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "1:hang")
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match=r"^rank 1 did not finish within 15 s$"):
        run_ranks(_rank0_lingers, (), 2, timeout_s=15)
    # Not before the time-out; within the bound every fault test holds (the hung process terminated, no hang).
    elapsed = time.monotonic() - t0
    assert 15 <= elapsed < 60


def test_a_killed_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "1:kill")
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match=r"^rank 1 was killed \(signal 9\)$"):
        run_ranks(_all_reduce, (), 2, timeout_s=60)
    assert time.monotonic() - t0 < 60
