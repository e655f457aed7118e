"""Bounded failure for a rank of a ``torchrun`` job: a heartbeat in the job's store, and the rank that failed named.

Under :mod:`planner.runtime.launch` one parent watches every rank; a torchrun job has no such parent, and its
agents only watch the processes of their own node. So each rank watches the others through the job's TCP store
(the one ``MASTER_ADDR:MASTER_PORT`` names, torchrun's agent store): a background thread sets the rank's beat
every :data:`BEAT_S` (a counter, the barriers this rank entered, its local rank and host) and reads every
other rank's. A rank whose beat has not changed for :data:`STALE_S` stopped responding (killed, or its node
gone); one whose beat goes on while it entered fewer barriers than this rank, when this rank's collective
times out, stalled. A rank that fails by itself (not a peer's "connection closed") records its one line in the
store, and every other rank reports that line.

The watcher reads its own client of the store: a blocking ``store.wait`` in the main thread (planner/runtime/
launch.py, ``each_rank_in_turn``) would otherwise hold its beats back. Where the main thread is blocked in a
collective that cannot return, the watcher ends the process itself, with the one line and exit code 2: a thread
stuck in native code cannot be interrupted any other way.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ["BEAT_S", "STALE_S", "ABORT_PREFIX", "Beat", "JobWatch", "is_peer_reaction"]

BEAT_S = 1.0
"""How often a rank beats and reads the others' beats."""
STALE_S = 10.0
"""A beat unchanged this long: the rank stopped responding. Ten beats: a busy rank's thread still gets the GIL
many times in that while, so only a dead or frozen process goes quiet this long."""
ABORT_PREFIX = "pipeplan verify: error: "
"""The watcher's own line starts as the command line's error lines do (cli.py)."""

_FAILURES = "failures"
_PEER_WORDS = ("gloo", "nccl", "connection closed", "connection reset", "broken pipe", "timed out", "timeout")


def is_peer_reaction(exc: BaseException) -> bool:
    """Whether ``exc`` is this rank's collective failing because of another rank (or a signal from this node's
    agent, which stops its other ranks when one fails) rather than a failure of its own."""
    import torch.distributed as dist

    if isinstance(exc, (KeyboardInterrupt, dist.DistError)):
        return True
    text = str(exc).lower()
    return any(word in text for word in _PEER_WORDS)


@dataclass(frozen=True)
class Beat:
    """A rank's heartbeat as it lies in the store."""

    count: int
    barriers: int
    local_rank: int
    host: str
    done: bool
    waiting: bool = False
    """The rank's main thread is inside ``torch.distributed`` (in a collective, or waiting on a transfer)."""

    def text(self) -> str:
        return f"{self.count} {self.barriers} {self.local_rank} {int(self.done)} {int(self.waiting)} {self.host}"

    @classmethod
    def parse(cls, text: str) -> Beat:
        count, barriers, local_rank, done, waiting, host = text.split(" ", 5)
        return cls(int(count), int(barriers), int(local_rank), host, done == "1", waiting == "1")


_DISTRIBUTED = os.sep + os.path.join("torch", "distributed") + os.sep


def _main_thread_waiting() -> bool:
    """Whether the main thread is inside ``torch.distributed`` now (its Python stack, seen from this thread)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if _DISTRIBUTED in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class JobWatch:
    """This rank's heartbeat and its view of the others' (see the module's docstring)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        host: str,
        store_address: tuple[str, int],
        prefix: str,
        timeout_s: float,
    ) -> None:
        """``prefix``: the store keys' prefix, new for every job (a restarted job must not read old beats).
        ``timeout_s``: how long the whole run may take (``--timeout``), and so how long a rank may take to send its
        first beat (a rank that loads a large model before its first beat is not late)."""
        self.rank, self.world_size, self.local_rank, self.host = rank, world_size, local_rank, host
        self.store_address, self.prefix, self.timeout_s = store_address, prefix, timeout_s
        self.barriers = 0
        self._count = 0
        self._done = False
        self._naming = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._beats: dict[int, Beat] = {}
        self._changed: dict[int, float] = {}
        self._store: Any = None
        self._store_lost: float | None = None
        self._failure: str | None = None
        self._thread: threading.Thread | None = None

    # --- the watcher's thread -----------------------------------------------------------------------------

    def start(self) -> None:
        """Connect to the job's store and start beating (before or after the process group opens)."""
        import torch.distributed as dist

        addr, port = self.store_address
        client = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=max(STALE_S, 5.0)))
        self._store = dist.PrefixStore(self.prefix, client)
        self._started = time.monotonic()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="pipeplan-job-watch", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def _key(self, rank: int) -> str:
        return f"alive/{rank}"

    def _beat(self) -> None:
        self._count += 1
        beat = Beat(self._count, self.barriers, self.local_rank, self.host, self._done, _main_thread_waiting())
        self._store.set(self._key(self.rank), beat.text())

    def _read(self) -> None:
        """Every rank's beat that is there, and the first failure recorded."""
        store, now = self._store, time.monotonic()
        # New dictionaries, swapped in whole: the main thread reads them while this thread writes.
        beats, changed = dict(self._beats), dict(self._changed)
        for rank in range(self.world_size):
            key = self._key(rank)
            if rank not in beats and not store.check([key]):
                continue  # not there yet: get() would block until it is
            beat = Beat.parse(store.get(key).decode())
            if beats.get(rank) != beat:
                beats[rank], changed[rank] = beat, now
        self._changed, self._beats = changed, beats
        if self._failure is None and int(store.add(_FAILURES, 0)) > 0:
            self._failure = store.get(f"failed/{0}").decode()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._beat()
                self._read()
                self._store_lost = None
            except Exception:  # the store stopped answering: its host has ended, or the network is down
                self._store_lost = self._store_lost or time.monotonic()
            line = self.culprit()
            if line is not None:
                self._abort(line)

    def _abort(self, line: str) -> None:
        with self._lock:
            if self._naming or self._done:
                return  # the main thread names the failure itself, or this rank has finished
            os.write(2, (ABORT_PREFIX + line + "\n").encode("utf-8", "backslashreplace"))
            os._exit(2)

    # --- what the main thread asks ------------------------------------------------------------------------

    def where(self, rank: int) -> str:
        beat = self._beats.get(rank)
        return f"(node {beat.host}, local rank {beat.local_rank})" if beat is not None else "(never seen)"

    def culprit(self) -> str | None:
        """The one line that names why this job cannot finish, as far as this rank can tell now; None if all is
        well."""
        if self._done:
            return None
        if self._failure is not None:
            return self._failure
        now, beats, changed = time.monotonic(), self._beats, self._changed
        for rank in range(self.world_size):
            beat = beats.get(rank)
            if rank == self.rank or (beat is not None and beat.done):
                continue
            if beat is None and now - self._started > self.timeout_s:
                return f"rank {rank} never joined the job's heartbeat within {self.timeout_s:g} s"
            if beat is not None and now - changed.get(rank, now) > STALE_S:
                return f"rank {rank} stopped responding {self.where(rank)}: no heartbeat for {STALE_S:g} s"
        if self._store_lost is not None and now - self._store_lost > STALE_S:
            addr, port = self.store_address
            return f"the job's store at {addr}:{port} stopped answering: the node that hosts it (node rank 0) is gone"
        if now - self._started > self.timeout_s:
            return self.stalled() or f"rank {self.rank} did not finish within {self.timeout_s:g} s (--timeout)"
        return None

    def stalled(self) -> str | None:
        """The rank the others wait for: alive, but outside any collective while all the others are in one, or
        behind them by the barriers it entered; None where no rank stands out."""
        beats = {r: b for r, b in self._beats.items() if not b.done}
        if len(beats) < 2:
            return None
        busy = [r for r, b in beats.items() if not b.waiting]
        if len(busy) == 1:
            return (
                f"rank {busy[0]} stalled {self.where(busy[0])}: alive, but outside any collective while the others "
                "wait in one"
            )
        least = min(beats, key=lambda r: (beats[r].barriers, r))
        usual = statistics.median(b.barriers for b in beats.values())
        if beats[least].barriers >= usual:
            return None
        return (
            f"rank {least} stalled {self.where(least)}: alive, but it has not reached the barrier the others wait "
            f"in (barrier {beats[least].barriers + 1})"
        )

    def record_failure(self, line: str) -> None:
        """Tell every rank that this one failed by itself, with the line they report (the first recorded wins)."""
        with self._lock:
            self._naming = True  # this rank's main thread reports its own failure
        try:
            index = int(self._store.add(_FAILURES, 1)) - 1
            self._store.set(f"failed/{index}", line)
        except Exception:  # the store is gone: the others find this rank's beat stopped instead
            pass

    def name_failure(self, exc: BaseException) -> str | None:
        """Why this rank's collective failed: wait (at most a stale beat's time and two beats) until a recorded
        failure, a stopped or a stalled rank names it; None if nothing does."""
        with self._lock:
            self._naming = True
        deadline = time.monotonic() + STALE_S + 2 * BEAT_S
        while time.monotonic() < deadline:
            line = self.culprit()
            if line is not None:
                return line
            if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                line = self.stalled()
                if line is not None:
                    return line
            time.sleep(BEAT_S / 4)
        return None

    @contextmanager
    def counting_barriers(self) -> Iterator[None]:
        """Count this rank's ``torch.distributed.barrier`` calls in its beat: how far each rank has come. (The
        fault tests' hook can strike at the n-th: ``PIPEPLAN_TEST_FAULT="3:kill@barrier4"``, in the middle of a
        run, where each step opens and closes with a barrier.)"""
        import torch.distributed as dist

        from planner.runtime.launch import inject_fault

        original: Callable[..., Any] = dist.barrier

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.barriers += 1
            inject_fault(self.rank, f"barrier{self.barriers}")
            return original(*args, **kwargs)

        dist.barrier = counted  # rank_timing looks it up on the module at each call
        try:
            yield
        finally:
            dist.barrier = original

    def stop(self) -> None:
        """This rank has finished: its last beat says so, so that the others do not take its silence for a failure."""
        with self._lock:
            self._done = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * BEAT_S)
        try:
            self._beat()
        except Exception:  # the store may already be gone when the last ranks finish
            pass
