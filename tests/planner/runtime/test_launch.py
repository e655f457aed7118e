"""pin_rank_cpus: each local rank's threads on cores of its own, where there are enough; every_rank_at_once;
free_port outside the ephemeral range."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from planner.runtime.launch import PIN_ENV, every_rank_at_once, free_port, pin_rank_cpus, run_ranks

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")


def _cores_of_every_thread(rank: int, world_size: int) -> list[list[int]]:
    import torch.distributed as dist

    dist.barrier()  # gloo's threads exist by now: they must be bound too
    tids = os.listdir("/proc/self/task")
    return [sorted(os.sched_getaffinity(int(tid))) for tid in tids]


@pytest.fixture
def restore_affinity():
    before = os.sched_getaffinity(0)
    yield before
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), before)
        except OSError:
            pass


@linux_only
def test_run_ranks_binds_each_rank_and_its_threads_to_its_own_core(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.setenv(PIN_ENV, "1")
    per_rank = run_ranks(_cores_of_every_thread, (), 2, timeout_s=120)
    threads_0, threads_1 = per_rank
    assert len(threads_0) > 1  # the main thread and gloo's
    half = len(cores) // 2
    assert all(c == cores[:half] for c in threads_0)
    assert all(c == cores[half : 2 * half] for c in threads_1)


@linux_only
def test_pin_binds_threads_started_before_it(restore_affinity):
    cores = sorted(restore_affinity)
    started = threading.Event()
    stop = threading.Event()

    def idle() -> None:
        started.set()
        stop.wait()

    t = threading.Thread(target=idle)
    t.start()
    started.wait()
    try:
        assert pin_rank_cpus(0, 1, 1) == (cores[0],)
        assert os.sched_getaffinity(t.native_id) == {cores[0]}
        assert os.sched_getaffinity(0) == {cores[0]}
    finally:
        stop.set()
        t.join()


@linux_only
def test_pin_leaves_affinity_alone_when_the_cores_do_not_suffice(restore_affinity):
    n = len(restore_affinity)
    assert pin_rank_cpus(0, n + 1, 1) is None  # more ranks than cores
    assert pin_rank_cpus(0, 1, n + 1) is None  # more threads than cores
    assert pin_rank_cpus(3, 2, 1) is None  # not a local rank
    assert os.sched_getaffinity(0) == restore_affinity


@linux_only
def test_ranks_stay_unbound_unless_asked(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    monkeypatch.delenv(PIN_ENV, raising=False)
    for threads in run_ranks(_cores_of_every_thread, (), 2, timeout_s=120):
        assert all(c == cores for c in threads)


def _timed_at_once(rank: int, world_size: int) -> tuple[float, float, float, int]:
    """Rank 0 arrives 0.3 s late; rank 1's timed work is 0.3 s longer: (start, end, return, busy calls)."""
    if rank == 0:
        time.sleep(0.3)
    window: list[float] = []
    busy = [0]

    def timed() -> None:
        window.append(time.time())
        time.sleep(0.1 + 0.3 * rank)
        window.append(time.time())

    def keep_busy() -> None:
        busy[0] += 1
        time.sleep(0.01)

    every_rank_at_once(rank, world_size, "test", timed, keep_busy)
    return window[0], window[1], time.time(), busy[0]


def test_every_rank_at_once_starts_together_and_keeps_company_until_the_last_ends():
    (start0, end0, back0, busy0), (start1, end1, back1, busy1) = run_ranks(_timed_at_once, (), 2, timeout_s=60)
    # rank 1 waited for rank 0's late arrival: their timed work began together (0.3 s apart otherwise)
    assert abs(start0 - start1) < 0.1
    # rank 0 ended first and kept computing until rank 1's timed work was over; rank 1 had no one to wait for
    assert end0 < end1 <= back0
    assert busy0 >= 10 and busy1 == 0


def _says_hello(rank: int, world_size: int, word: str) -> tuple[str, bool]:
    import sys

    print(f"{word} from rank {rank}", flush=True)
    print(f"{word} on stderr from rank {rank}", file=sys.stderr, flush=True)
    return os.environ.get("PIPEPLAN_TEST_WORD", ""), sys.modules.get("torch") is not None


def test_each_launch_hands_its_ranks_the_callers_environment_and_output_as_they_are_then(monkeypatch, capfd):
    # The first launch starts the fork server (if no test before did); the second must not see its environment.
    monkeypatch.setenv("PIPEPLAN_TEST_WORD", "first")
    assert [r[0] for r in run_ranks(_says_hello, ("hi",), 2, timeout_s=60, backend=None)] == ["first", "first"]
    capfd.readouterr()
    monkeypatch.setenv("PIPEPLAN_TEST_WORD", "second")
    results = run_ranks(_says_hello, ("hello",), 2, timeout_s=60, backend=None)
    assert results == [("second", True), ("second", True)]  # torch came preloaded with the server
    out, err = capfd.readouterr()
    assert sorted(out.splitlines()) == ["hello from rank 0", "hello from rank 1"]
    assert sorted(err.splitlines()) == ["hello on stderr from rank 0", "hello on stderr from rank 1"]


def _host_ends_first(rank: int, world_size: int) -> int:
    """Rank 0, whose process holds the job's store, ends its timed work last and returns at once; rank 1 is
    still in a long ``keep_busy`` then."""
    calls = [0]

    def timed() -> None:
        time.sleep(0.4 if rank == 0 else 0.05)

    def keep_busy() -> None:
        calls[0] += 1
        time.sleep(0.6)

    every_rank_at_once(rank, world_size, "host-ends-first", timed, keep_busy)
    return calls[0]


def test_every_rank_at_once_lets_no_rank_find_the_store_gone_when_the_host_ends_first():
    # Rank 0 hosts the store: had it returned as soon as it saw every rank done, rank 1's next look at the store,
    # after its keep_busy, would find it gone (DistNetworkError, "Failed to recv").
    assert run_ranks(_host_ends_first, (), 2, timeout_s=60) == [0, 1]


@pytest.mark.skipif(not os.path.exists("/proc/sys/net/ipv4/ip_local_port_range"), reason="Linux's port range")
def test_free_port_is_below_the_ephemeral_range_and_free():
    """An outgoing connection takes its port from the ephemeral range: a port drawn from there could be taken
    between free_port and the bind by a rank started seconds later."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        first_ephemeral = int(f.read().split()[0])
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and all(20000 <= p < first_ephemeral for p in ports), ports
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
