"""The other ranks of the machine, running while a profile is measured (issue 9, fidelity).

Local CPU ranks share the machine's cores, caches and memory bandwidth, so a unit timed with the other
cores idle runs at a speed the pipeline never sees. On the 2-core development VM the gap was also not
stable: gpt2-tiny's forward+backward (one thread) took 10 ms alone at 19:20 UTC and 12-17 ms alone at
19:45, while with a second process running the same model beside it took 16-17 ms both times; what the
model is bound by decides how much a neighbour costs (the 13-unit CNN and llama-small 1.01-1.04x, the
small-operator models up to 1.9x), and calibrate's one probe layer cannot say that for every model.

So ``pipeplan profile --ranks P`` on a CPU times the units while ``P - 1`` neighbour processes, each
with the threads a rank gets, run the same model's forward+backward at the micro-batch size being
measured: the load the other stages put on the machine, with the same operators in the same mix. The
planner then takes no co-location factor from the calibration (it is in the numbers).
:func:`measure_colocation` gives the factor itself (step time with the neighbours over step time
alone, per size), for the benchmark that measures the claim above.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from planner.errors import ProfilingError, UsageError
from profiles.workload import Workload

__all__ = ["Colocation", "Neighbours", "measure_colocation"]

ROUNDS = 6
"""Alone, then with the neighbours, this many times; the factor is the median of the rounds' ratios. On
the development VM one round's ratio for the same model ranged 1.01-1.67 within a minute (the speed alone
moves), so one round is not enough."""
MIN_PHASE_S = 0.25
"""Each phase (alone, with neighbours) runs for at least this long, and at least 2 steps."""


@dataclass(frozen=True)
class Colocation:
    """What the neighbours run: the model ``spec`` (with ``load_workload``'s ``seq_len`` and ``task``
    where given) on ``ranks - 1`` processes of ``threads`` CPU threads each."""

    spec: str
    ranks: int
    threads: int
    seq_len: int | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        if self.ranks < 2:
            raise UsageError(f"co-location needs at least 2 ranks on the machine, got {self.ranks}")
        if self.threads < 1:
            raise UsageError(f"threads must be >= 1, got {self.threads}")


def _build(colocation: Colocation, dtype: torch.dtype) -> Workload:
    from profiles.workload import adapt_workload, load_workload

    torch.manual_seed(0)
    options = {k: v for k, v in (("seq_len", colocation.seq_len), ("task", colocation.task)) if v is not None}
    workload = adapt_workload(load_workload(colocation.spec, **options))
    workload.model.to(dtype=dtype).train()
    return workload


def _step_fn(workload: Workload, size: int, dtype: torch.dtype) -> Callable[[], None]:
    """One forward+backward of the whole model on CPU at ``size``, as the profile's whole model runs."""
    from profiles.profiler import device_batch

    model = workload.model
    inputs, target = device_batch(workload, size, torch.device("cpu"), dtype)

    def step() -> None:
        loss = workload.loss_fn(model(*inputs), target)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def _neighbour(colocation: Colocation, dtype: torch.dtype, conn: Connection) -> None:
    """Build the model, say ``ready``, then run it at the size the parent sends until it says stop;
    ``None`` ends the process."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(colocation.threads)
    steps: dict[int, Callable[[], None]] = {}
    try:
        workload = _build(colocation, dtype)
        conn.send("ready")
        while (size := conn.recv()) is not None:
            if size not in steps:
                steps[size] = _step_fn(workload, size, dtype)
                steps[size]()  # the first step allocates: not part of the load
            conn.send("running")
            while not conn.poll():
                steps[size]()
            conn.recv()
            conn.send("stopped")
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass


def _median_step_s(step: Callable[[], None], min_s: float) -> float:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 2 or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _ask(conns: Sequence[Connection], procs: Sequence[BaseProcess], message: Any, reply: str, timeout_s: float) -> None:
    for c in conns:
        c.send(message)
    _wait(conns, procs, reply, timeout_s)


def _wait(conns: Sequence[Connection], procs: Sequence[BaseProcess], reply: str, timeout_s: float) -> None:
    for c, p in zip(conns, procs, strict=True):
        deadline = time.monotonic() + timeout_s
        while not c.poll(0.1):
            if not p.is_alive():
                raise ProfilingError(
                    f"a co-location neighbour exited with code {p.exitcode} (could it build the model?)"
                )
            if time.monotonic() > deadline:
                raise ProfilingError(f"a co-location neighbour did not answer within {timeout_s:.0f} s")
        got = c.recv()
        if got != reply:
            raise ProfilingError(f"a co-location neighbour failed: {got}")


class Neighbours:
    """``ranks - 1`` neighbour processes, started once; ``with n.running(size):`` keeps them computing."""

    def __init__(self, colocation: Colocation, dtype: torch.dtype = torch.float32, timeout_s: float = 600.0) -> None:
        ctx = mp.get_context("spawn")  # a fork would copy torch's thread pools mid-state
        pipes = [ctx.Pipe() for _ in range(colocation.ranks - 1)]
        self._conns = [parent for parent, _ in pipes]
        self._procs = [
            ctx.Process(target=_neighbour, args=(colocation, dtype, child), daemon=True) for _, child in pipes
        ]
        self._timeout_s = timeout_s
        for p in self._procs:
            p.start()
        try:
            _wait(self._conns, self._procs, "ready", timeout_s)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def running(self, size: int) -> Iterator[None]:
        _ask(self._conns, self._procs, size, "running", self._timeout_s)
        try:
            yield
        finally:
            _ask(self._conns, self._procs, "stop", "stopped", self._timeout_s)

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> Neighbours:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measure_colocation(
    colocation: Colocation,
    sizes: Sequence[int],
    dtype: torch.dtype = torch.float32,
    *,
    rounds: int = ROUNDS,
    min_phase_s: float = MIN_PHASE_S,
) -> tuple[float, ...]:
    """Per micro-batch size: the model's step time with the neighbours running over its time alone, the
    median of ``rounds`` ratios each taken close in time, on this process's current threads. CPU only."""
    if rounds < 1:
        raise UsageError(f"rounds must be >= 1, got {rounds}")
    factors = []
    workload = _build(colocation, dtype)
    with Neighbours(colocation, dtype) as neighbours:
        for size in sizes:
            step = _step_fn(workload, size, dtype)
            step()
            ratios = []
            for _ in range(rounds):
                alone = _median_step_s(step, min_phase_s)
                with neighbours.running(size):
                    loaded = _median_step_s(step, min_phase_s)
                ratios.append(loaded / alone)
            factors.append(statistics.median(ratios))
    return tuple(factors)
