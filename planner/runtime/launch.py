"""Run a function on several local ranks, one process each, and fail cleanly when one rank fails.

:func:`run_ranks` starts ``world_size`` processes with the torch.distributed environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), opens the process group, calls
``fn(rank, world_size, *args)`` in each and returns the results in rank order. When a rank raises,
hangs past the time-out or dies, the others are terminated (then killed) and one
:class:`ExecutionError` names the rank that failed first; no process is left behind. Each rank leads a
process group of its own, and the whole group is stopped, so a subprocess started by user code inside a
rank goes with it (also when the parent is interrupted: the CLI turns SIGTERM and SIGHUP into that).

Test hook: ``PIPEPLAN_TEST_FAULT="<rank>:<raise|hang|kill>"`` in the environment makes that rank
raise ``RuntimeError("boom")``, sleep forever, or SIGKILL itself right after the process group is
opened (or, ``"<rank>:<kind>@<point>"``, at a point a caller names: :func:`inject_fault`). It exists for the fault
tests only.

The ranks are forked from multiprocessing's fork server, which imports torch and the heavy modules the caller
has loaded once (:func:`_preloaded`), rather than spawned fresh: a spawned rank spends several seconds
importing torch and transformers before its first line of work, and a process that launches ranks again and
again (calibration, a learning run, the tests) would pay it every time. The server is a fresh single-threaded
process, so forking it is safe where forking the caller (OpenMP threads, open process groups) is not; each
rank takes the caller's environment and standard output and error as they are at launch, as a spawned rank
would.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import random
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from planner.errors import ExecutionError
from planner.runtime.progress import ProgressBar, Show, report_to
from profiles.cores import rank_threads

__all__ = [
    "Signalled",
    "signals_interrupt",
    "run_ranks",
    "rank_threads",
    "pin_rank_cpus",
    "free_port",
    "each_rank_in_turn",
    "every_rank_at_once",
    "FAULT_ENV",
    "PIN_ENV",
    "inject_fault",
    "prepare_rank",
    "rank_context",
]

FAULT_ENV = "PIPEPLAN_TEST_FAULT"
PIN_ENV = "PIPEPLAN_PIN_CPUS"
"""``PIPEPLAN_PIN_CPUS=1`` binds each rank of :func:`run_ranks` to cores of its own (:func:`pin_rank_cpus`)."""
# After the first failure, how long to keep listening so the root cause (the earliest error, not a
# peer's "connection closed") is the one reported.
_GRACE_S = 1.0
_TERMINATE_S = 3.0
# Below the registered ports of common services (databases, web servers in the 1-10k range).
_LOWEST_PORT = 20000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, drawn from below the OS's ephemeral range.

    The port is bound seconds later by a process that first imports torch; a port from the ephemeral range can be
    taken in between by any outgoing connection on the machine (gloo opens many), and the rendezvous then fails.
    Ports below the range are handed out only to those who bind them by number."""
    first_ephemeral = _first_ephemeral_port()
    draws = random.Random()
    for _ in range(64):
        port = draws.randrange(_LOWEST_PORT, first_ephemeral)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the low ports all taken: let the OS pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _first_ephemeral_port() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; macOS's range starts at 49152
    return max(low, _LOWEST_PORT + 1024)


def inject_fault(rank: int, point: str = "") -> None:
    """The test hook of :data:`FAULT_ENV`: raise, hang or die here if it names ``rank`` and this ``point``
    (``"3:kill@barrier4"``: at the point a caller names ``barrier4``; no ``@``: right after the process group
    opens, where ``point`` is empty)."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    target, _, rest = spec.partition(":")
    kind, _, at = rest.partition("@")
    if target.strip() != str(rank) or at != point:
        return
    if kind == "raise":
        raise RuntimeError("boom")
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    # Plain pickle copies tensor data by value; multiprocessing's pickler would share it through a
    # file descriptor that dies with this process.
    conn.send_bytes(pickle.dumps(message))


class _CallersEnvironment:
    """The launching process's environment, stdout and stderr, handed to a rank as they are at launch: a rank
    forked from the fork server would otherwise inherit the server's, fixed when it started."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)

    def __reduce__(self) -> tuple[Any, ...]:
        # DupFd hands the descriptors over only while a process is being started, so it is taken when pickled.
        return (_adopt_environment, (self.environ, reduction.DupFd(1), reduction.DupFd(2)))


def _adopt_environment(environ: dict[str, str], stdout: Any, stderr: Any) -> None:
    os.environ.clear()
    os.environ.update(environ)
    for fd, handed in ((1, stdout), (2, stderr)):
        received = handed.detach()
        if received != fd:
            os.dup2(received, fd)
            os.close(received)


def _worker(
    callers: None,
    fn: Callable[..., Any],
    args: Sequence[Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str | None,
    threads: int,
    conn: Connection,
    lifeline: Connection,
) -> None:
    # ``callers`` did its work as the process was unpickled, before the rest of its arguments (_adopt_environment).
    del callers
    # A process group of its own: stopping the rank stops what user code started inside it too.
    os.setpgid(0, 0)
    _stop_with_caller(lifeline)
    if rank == 0:  # one rank's steps stand for the launch's
        report_to(lambda done, total, what: _send(conn, ("progress", done, total, what)))
    if os.environ.get(PIN_ENV) == "1":
        pin_rank_cpus(rank, world_size, threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        prepare_rank(threads)
        if backend is not None:
            import torch.distributed as dist

            dist.init_process_group(backend, rank=rank, world_size=world_size)
        inject_fault(rank)
        result = fn(rank, world_size, *args)
        if backend is not None:
            dist.destroy_process_group()
        _send(conn, ("ok", result, time.time()))
    except BaseException as exc:  # report everything, even KeyboardInterrupt, to the parent
        try:
            from planner.runtime.failure import where

            place = where(exc)
        except Exception:  # naming the place must never hide the error itself
            place = ""
        _send(conn, ("error", f"{type(exc).__name__}: {exc}", time.time(), traceback.format_exc(), place))
    finally:
        conn.close()


def _stop_with_caller(lifeline: Connection) -> None:
    """Stop this rank's process group once the launching process is gone, however it went.

    A caller stopped by a signal it does not handle (a script calling the API, SIGKILL) runs no ``finally`` that
    stops its ranks, and the fork server they came from outlives it, so a rank's parent does not change: the
    caller holds the only write end of ``lifeline``, and its end of file is the caller's exit. A thread blocked on
    the read costs the rank nothing while it runs."""

    def watch() -> None:
        with contextlib.suppress(OSError, EOFError):
            lifeline.poll(None)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="pipeplan-lifeline", daemon=True).start()


def prepare_rank(threads: int) -> None:
    """Set up this process as a rank before its process group opens: ``threads`` torch threads, freed memory
    kept as the profiler kept it, and nothing left to print after pipeplan's last line."""
    # torch's deprecation warnings would land on stderr after the one error line.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import torch

    from profiles.allocator import keep_freed_memory

    torch.set_num_threads(threads)
    keep_freed_memory()  # as the profiler measured (profiles/allocator.py)
    # torch.fx's Interpreter builds a tqdm bar, whose default lock is a multiprocessing semaphore that a
    # rank never frees: the resource tracker would then warn after pipeplan's last line.
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _signal_group(p: mp.process.BaseProcess, sig: int) -> None:
    """Send ``sig`` to the rank's process group (the rank and whatever it started); gone is fine."""
    if p.pid is None:
        return
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(procs: Sequence[mp.process.BaseProcess]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
        # A rank may be gone while a process it started lives on in its group: no orphans.
        _signal_group(p, signal.SIGKILL)


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def pin_rank_cpus(local_rank: int, local_world_size: int, threads: int) -> tuple[int, ...] | None:
    """Bind every thread of this process to the ``threads`` cores of ``local_rank``: rank r gets the r-th
    block of the cores this process may use. Returns the cores, or None where nothing was bound (fewer
    cores than ranks x threads, or no ``os.sched_setaffinity``: not Linux).

    Opt-in (``PIPEPLAN_PIN_CPUS=1`` for :func:`run_ranks`), because it helps some models and not others.
    Unbound, a rank's gloo threads (the socket loop that completes a receive, the worker of a collective)
    may run on the other rank's core, and messages arrive later and less steadily, which costs a model of short
    actions; bound, those threads cannot use a core the other rank leaves idle, which costs a model of long
    actions (``python benchmarks/bench_runtime_probes.py --only delivery``, ``--only binding``). Call it first
    thing in a rank, before the process group opens, with torchrun's ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE``.
    """
    if not hasattr(os, "sched_setaffinity") or threads < 1:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if local_world_size * threads > len(cores) or not 0 <= local_rank < local_world_size:
        return None
    mine = cores[local_rank * threads : (local_rank + 1) * threads]
    # Every thread, not only this one: torch or a library may already have started some.
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]:
        try:
            os.sched_setaffinity(int(tid), mine)
        except OSError:  # a thread that has just exited
            pass
    return tuple(mine)


def each_rank_in_turn(rank: int, world_size: int, tag: str, fn: Callable[[], object]) -> None:
    """Run ``fn`` on one rank at a time, in rank order, inside a process group: a measurement of each rank
    alone. The others wait on the default TCP store, a socket read that takes no core (a gloo barrier's
    wait would). ``tag`` must be new for every call: the store keeps its keys."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    for turn in range(world_size):
        key = f"pipeplan-in-turn-{tag}-{turn}"
        if rank == turn:
            fn()
            store.set(key, "done")
        else:
            store.wait([key])
    _leave_store(store, rank, world_size, f"in-turn-{tag}")


def every_rank_at_once(
    rank: int, world_size: int, tag: str, timed: Callable[[], object], keep_busy: Callable[[], object]
) -> None:
    """Run ``timed`` on every rank at the same moment, inside a process group: a measurement of each rank while
    the others compute, as they do in a pipeline. The ranks start together (each waits on the default TCP store
    for the others' arrival); a rank whose ``timed`` ends first runs ``keep_busy`` until every rank's has ended,
    so each measurement runs beside work from start to end. ``tag`` must be new for every call."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    store.set(f"pipeplan-at-once-{tag}-ready-{rank}", "ready")
    store.wait([f"pipeplan-at-once-{tag}-ready-{r}" for r in range(world_size)])
    timed()
    store.set(f"pipeplan-at-once-{tag}-done-{rank}", "done")
    done = [f"pipeplan-at-once-{tag}-done-{r}" for r in range(world_size)]
    while not store.check(done):
        keep_busy()
    _leave_store(store, rank, world_size, f"at-once-{tag}")


def _leave_store(store: Any, rank: int, world_size: int, tag: str) -> None:
    """Rank 0 leaves last: its process hosts the job's store (a local launch's), and a rank that reads the store
    after its host has moved on and exited finds it gone (DistNetworkError, "Failed to recv"). Every other rank's
    last request is the write that says it has left."""
    if rank == 0:
        store.wait([f"pipeplan-left-{tag}-{r}" for r in range(1, world_size)])
    else:
        store.set(f"pipeplan-left-{tag}-{rank}", "left")


def run_ranks(
    fn: Callable[..., Any],
    args: Sequence[Any],
    world_size: int,
    *,
    timeout_s: float,
    backend: str | None = "gloo",
    threads: int | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; results in rank order.

    ``fn`` and ``args`` must be picklable (a module-level function). ``backend=None`` opens no
    process group. Each process uses ``threads`` torch threads (default :func:`rank_threads`); with
    ``PIPEPLAN_PIN_CPUS=1`` in the environment, bound to cores of its own where there are enough
    (:func:`pin_rank_cpus`).

    Raises:
        ExecutionError: ``"rank 1 failed: RuntimeError: boom"``, ``"rank 0 did not finish within 30 s"``
            or ``"rank 1 was killed (signal 9)"``; every process is gone when it is raised.
    """
    port = free_port()
    threads = threads or rank_threads(world_size)
    procs, conns, lifeline = _start_ranks(fn, args, world_size, port, backend, threads)
    bar = ProgressBar()
    try:
        results, failures = _collect(procs, conns, timeout_s, bar)
    finally:
        bar.close()
        _stop(procs)
        for c in conns:
            c.close()
        lifeline.close()  # after _stop: a rank that sees its end of file stops at once
    if failures:
        rank = min(failures, key=lambda r: failures[r][:2])
        error = ExecutionError(failures[rank][2])
        error.remote_traceback = failures[rank][3]  # type: ignore[attr-defined]
        raise error
    unfinished = [r for r in range(world_size) if r not in results]
    if unfinished:
        raise ExecutionError(f"{_ranks_text(unfinished)} did not finish within {timeout_s:g} s")
    return [results[r] for r in range(world_size)]


def _start_ranks(
    fn: Callable[..., Any], args: Sequence[Any], world_size: int, port: int, backend: str | None, threads: int
) -> tuple[list[mp.process.BaseProcess], list[Connection], Connection]:
    """Start one process per rank; the processes, the read ends of the pipes their results come back on, and the
    write end of the ranks' lifeline (:func:`_stop_with_caller`), to close once they are stopped."""
    ctx = rank_context(fn)
    procs, conns = [], []
    watched, lifeline = ctx.Pipe(duplex=False)
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker,
            args=(_CallersEnvironment(), fn, args, rank, world_size, port, backend, threads, child, watched),
            daemon=True,
            name=f"pipeplan-rank-{rank}",
        )
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    watched.close()
    return procs, conns, lifeline


_ALWAYS_PRELOADED = ("torch", "torch.distributed", "torch.distributed.pipelining")


def _preloaded(fn: Callable[..., Any]) -> list[str]:
    """What the fork server imports before it forks a rank: torch, the rank's own module, and the model
    libraries the caller has loaded (a rank building a transformers model imports them too; one that does not is
    not made to pay for them)."""
    modelling = [
        name
        for name in sys.modules
        if name.startswith("transformers.models.") and name.rpartition(".")[2].startswith("modeling_")
    ]
    own = [fn.__module__] if fn.__module__ not in ("__main__", "__mp_main__") else []
    return [*_ALWAYS_PRELOADED, *own, *modelling]


def rank_context(fn: Callable[..., Any]) -> mp.context.BaseContext:
    """The context that starts processes running ``fn``: the fork server's where the platform has one (Linux,
    macOS), else spawn's. The server starts at the first launch of this process and serves every later one; its
    preload (:func:`_preloaded`) is fixed then, so a caller starting processes of its own asks here first."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_preloaded(fn))  # no effect once the server runs
    return ctx


_Failure = tuple[int, float, str, str]
"""How a rank failed: (priority, time, message, traceback); the least (priority, time) is reported."""


def _receive(rank: int, conn: Connection, proc: mp.process.BaseProcess, progress: Show) -> tuple[bool, Any] | None:
    """What a rank sent: ``(True, result)``, or ``(False, failure)`` (:data:`_Failure`) when it raised or died;
    None while it has only reported its progress (handed to ``progress``) and runs on."""
    message, ended = None, False
    while message is None and conn.poll():
        try:
            sent = pickle.loads(conn.recv_bytes())
        except EOFError:
            ended = True
            break
        if sent[0] == "progress":
            progress(*sent[1:])
        else:
            message = sent
    if message is None and not ended and proc.is_alive():
        return None
    if message is not None and message[0] == "ok":
        return True, message[1]
    if message is not None:
        # A raised error: ordered by when it was raised, so the root cause wins over peers.
        # The place before the message: the CLI cuts the line at 300 characters, a torch message is long.
        place = f" {message[4]}" if message[4] else ""
        return False, (1, message[2], f"rank {rank} failed{place}: {message[1]}", message[3])
    proc.join(_TERMINATE_S)
    code = proc.exitcode
    why = f"was killed (signal {-code})" if code is not None and code < 0 else f"exited with code {code}"
    # Death by a signal is never a peer's reaction, so it outranks raised errors.
    return False, (0, time.time(), f"rank {rank} {why}", "")


def _collect(
    procs: Sequence[mp.process.BaseProcess],
    conns: Sequence[Connection],
    timeout_s: float,
    progress: Show,
) -> tuple[dict[int, Any], dict[int, _Failure]]:
    """Every rank's result or failure, as they come, until all are in, the time-out passes, or :data:`_GRACE_S`
    after the first failure; the ranks' progress reports meanwhile to ``progress``."""
    world_size = len(procs)
    results: dict[int, Any] = {}
    failures: dict[int, _Failure] = {}
    deadline = time.monotonic() + timeout_s
    first_failure: float | None = None
    while len(results) + len(failures) < world_size:
        now = time.monotonic()
        limit = deadline if first_failure is None else min(deadline, first_failure + _GRACE_S)
        if now >= limit:
            break
        waiting = {conns[r]: r for r in range(world_size) if r not in results and r not in failures}
        sentinels = {procs[r].sentinel: r for r in waiting.values()}
        ready = wait(list(waiting) + list(sentinels), timeout=limit - now)
        for obj in ready:
            rank = waiting.get(obj, sentinels.get(obj))  # type: ignore[arg-type]
            if rank is None or rank in results or rank in failures:
                continue
            received = _receive(rank, conns[rank], procs[rank], progress)
            if received is None:
                continue
            ok, value = received
            if ok:
                results[rank] = value
                continue
            failures[rank] = value
            if first_failure is None:
                first_failure = time.monotonic()
    return results, failures


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
