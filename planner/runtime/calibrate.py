"""``pipeplan calibrate``: measure what the runtime adds to compute, on the real backend.

One short run on ``P`` ranks (gloo on CPU, NCCL on GPUs), each rank with the threads it gets in a real
run (``cores // P`` on a CPU machine):

1. **Point-to-point**: ping-pong between ranks 0 and 1 at 4 KiB .. 4 MiB, a quarter second of it per size;
   one-way time = round trip / 2 (median), then the alpha-beta line ``t = latency + bytes / bandwidth``
   through the smallest and the largest size (``_link``).
2. **Co-location**: a transformer encoder layer's forward+backward timed alone by the profiler's harness,
   then inside torch's 1F1B running that layer on every rank, six short rounds; the factor is pipelined / alone
   on the same rank and round, the median over ranks and rounds, at least 1. This is the slowdown a
   profiled unit meets in a real run: other ranks compute and gloo's threads poll for the pending transfers
   (a pending ``irecv`` alone slowed gpt2-tiny's compute by 16 % here).
3. **Optimizer**: the schedule's gradient scaling (torch's ``PipelineStage.scale_grads`` divides every
   gradient by the micro-batch count at the end of ``step``), then ``optimizer.step()`` + ``zero_grad()``
   of Adam and SGD, every rank at once (as in training), on 2^18 parameters in 8 tensors, 2^21 in 8 and
   2^18 in 256 (a quarter second each), solved for ``per_step + per_param * parameters + per_tensor *
   tensors`` (torch's CPU optimizers loop over tensors, so a model of many small tensors pays per tensor);
   each set again after a 5 ms pause, and the median extra joins ``per_step`` (:mod:`planner.runtime.optimizer_probe`).
4. **Compute lost to transfers** (CPU): torch's 1F1B over the ranks, stages of an MLP block that also pass on a
   4 MiB tensor (and its gradient back), against the same without it, alternated round by round; the compute per
   byte sent or received at which the simulator, with the fitted link, predicts the measured slowdown (median of
   the rounds' ratios). gloo copies each message on the ranks' own cores, so a transfer the simulator lets overlap
   compute still slows that compute. Not measured on CUDA (NCCL's copies run beside the compute stream): 0.
5. **Per-action overhead** of each schedule: torch's own schedule runs stages of one tiny ``Linear`` at
   several micro-batch counts, each timed for at least a second (rank 0's clock sets the step count).
   Their compute is measured by the profiler's harness (what a profile would say); the overhead is the
   value per action for which the simulator, given that compute and the fitted links, reproduces the
   measured iteration (bisection), median over the micro-batch counts.

Everything it measured is kept in the calibration's ``notes.samples``. With one rank (one GPU) there is no
link to measure and nobody to share the machine with: the point-to-point constants are then the shipped
calibration's for that device (said so in ``notes``) and the co-location factor is 1.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from planner.calibration import BACKEND_OF_DEVICE, Calibration, shipped_calibration
from planner.errors import UsageError
from planner.runtime.launch import each_rank_in_turn, run_ranks
from planner.runtime.optimizer_probe import fit_optimizers, time_optimizers
from planner.runtime.progress import Phases
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule, stage_to_rank
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, simulate

__all__ = [
    "calibrate",
    "fit_overhead",
    "solve_increasing",
    "transfer_run_times",
    "fit_transfer_cost",
    "CALIBRATED_SCHEDULES",
    "TRANSFER_PROBE_BYTES",
]

CALIBRATED_SCHEDULES: tuple[tuple[Schedule, int], ...] = (
    (Schedule.GPIPE, 1),
    (Schedule.ONE_F_ONE_B, 1),
    (Schedule.INTERLEAVED_1F1B, 2),
    (Schedule.ZERO_BUBBLE, 1),
)
"""(schedule, virtual stages) measured for their per-action overhead."""

_P2P_SIZES = (4 << 10, 64 << 10, 512 << 10, 4 << 20)
MIN_MEASURE_S = 1.0
"""Each schedule run is timed for at least this long (and warmed up for a quarter of it); each ping-pong
size and optimizer set for a quarter of it."""
_MAX_STEPS = 1000
_WIDTH = 64  # features of the tiny stages: compute far below the overhead being measured


def solve_increasing(
    f: Callable[[float], float], target: float, low: float, high: float, limit: float = math.inf
) -> float:
    """The ``x >= low`` with ``f(x) == target`` for a non-decreasing ``f``, by bisection (60 halvings).

    ``low`` when ``f(low)`` already reaches the target; the upper end doubles until ``f`` reaches it or
    passes ``limit``.
    """
    if f(low) >= target:
        return low
    while f(high) < target and high < limit:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) < target else (low, mid)
    return (low + high) / 2


def fit_overhead(measured_s: float, simulate_with: Callable[[float], float]) -> float:
    """The per-action overhead ``o >= 0`` with ``simulate_with(o) == measured_s`` (the simulation is monotone in o).

    Returns 0 when even ``o = 0`` over-predicts: the runtime then adds nothing measurable.
    """
    return solve_increasing(simulate_with, measured_s, 0.0, measured_s)


def _p2p(
    rank: int, dev: torch.device, sync: Callable[[], None], repeats: int, min_measure_s: float
) -> list[tuple[int, float]]:
    """Per message size, the median one-way time: ``repeats`` ping-pongs at least, and at least a quarter
    of ``min_measure_s`` of them (15 round trips of 4 KiB gave 136-273 us from one run to the next)."""
    import torch.distributed as dist

    samples: list[tuple[int, float]] = []
    if dist.get_world_size() < 2:
        return samples
    for size in _P2P_SIZES:
        buf = torch.zeros(size // 4, dtype=torch.float32, device=dev)

        def one_way(buf: torch.Tensor = buf) -> float:
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync()
            return (time.perf_counter() - t0) / 2

        warm = [one_way() for _ in range(2)]
        times = [one_way() for _ in range(_agreed_steps(2 * warm[-1], min_measure_s / 4, repeats, dev))]
        samples.append((size, statistics.median(times)))
    return samples


def _probe_block() -> tuple[nn.Module, tuple[int, ...]]:
    """The co-location probe and its input shape: a transformer encoder layer (attention, LayerNorms, MLP),
    shaped like the blocks people pipeline and about 40 ms forward+backward on one CPU core. An MLP block
    of 5 ms measured 0.79, 1.36 and 1.32 in three runs back to back on the development VM (one process's
    memory placement decides it); this layer 1.05-1.08."""
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    return layer, (4, 128, 256)


_COLOCATION_ROUNDS = 6
"""Alone, then pipelined, this many times, each short: on the development VM one round's ratio ranged
0.87-1.30 within a run, and with three rounds of 9 alone / 7 pipelined steps the factor (the median of
six ratios) came out anywhere in 1.00-1.19 from one calibration to the next."""
_COLOCATION_ALONE_REPEATS = 5


def _colocation(rank: int, world: int, dev: torch.device, steps: int, rounds: int) -> list[tuple[float, float]]:
    """``(alone, pipelined)`` on this rank, per round of ``rounds``: the probe's forward+backward timed alone by the
    profiler's harness (each rank in turn, the others blocked on the store, a socket read that takes no
    core), then inside torch's 1F1B on every rank, where the other ranks compute and transfers are pending
    (gloo's threads poll for them). Both on the same rank and close in time: memory-bound work runs at one
    speed in one process and at another in the next on a shared VM, so a ratio taken within a process
    cancels that."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    from profiles.dataflow import Piece
    from profiles.measure import measure_piece

    torch.manual_seed(0)
    block, shape = _probe_block()
    block = block.to(dev)
    x = torch.randn(*shape, device=dev)
    n = 4 * world
    stage = pipelining.PipelineStage(
        block,
        rank,
        world,
        dev,
        input_args=(x.clone().requires_grad_(rank > 0),),
        output_args=(x.clone().requires_grad_(True),),
    )
    timed: list[float] = []
    for method in ("forward_one_chunk", "backward_one_chunk"):
        original = getattr(stage, method)

        def wrapper(*args: Any, _fn: Callable[..., Any] = original, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = _fn(*args, **kwargs)
            timed.append(time.perf_counter() - t0)
            return out

        setattr(stage, method, wrapper)
    schedule = pipelining.Schedule1F1B(stage, n_microbatches=n, loss_fn=nn.MSELoss())
    batch = torch.randn(shape[0] * n, *shape[1:], device=dev)
    target = torch.randn(shape[0] * n, *shape[1:], device=dev)
    pairs = []
    for round_ in range(rounds):
        dist.barrier()
        alone = 0.0

        def time_alone() -> None:
            nonlocal alone
            m = measure_piece(
                Piece("block", block, (x,), (True,)), device=dev, repeats=_COLOCATION_ALONE_REPEATS, warmup=2
            )
            alone = m.forward_s + m.backward_s

        each_rank_in_turn(rank, world, f"calibrate-alone-{round_}", time_alone)
        per_step = []
        warmup = 2 if round_ == 0 else 1
        for i in range(max(2, steps // 2) + warmup):
            timed.clear()
            dist.barrier()
            if rank == world - 1:
                schedule.step(*((batch,) if rank == 0 else ()), target=target, losses=[])
            else:
                schedule.step(*((batch,) if rank == 0 else ()))
            if i >= warmup:
                per_step.append(sum(timed) / n)  # one micro-batch's forward + backward
        pairs.append((alone, statistics.median(per_step)))
    dist.barrier()
    return pairs


TRANSFER_PROBE_BYTES = 4 << 20
"""The extra tensor each stage of the transfer probe passes on (and its gradient back): larger than the cuts where
the cost showed (cnn13's: 0.25-1.3 MiB a micro-batch), whose slowdown is within the rounds' noise at 1 MiB (0.0-0.7 ns
a byte in two runs, 0.39-0.41 at 4 MiB: ``python benchmarks/bench_transfer_cost.py``), and about 2 ms on the link
here, against actions of 5-15 ms."""
_TRANSFER_ROUNDS = 8
_TRANSFER_BLOCK = 2  # steps per timed block
_TRANSFER_WIDTH = 512


class _PassStage(nn.Module):
    """A stage of the transfer probe: an MLP block on ``x``, and ``pad`` passed on as it came (a view: no compute
    on it), so that the stage sends ``pad``'s bytes forward and receives its gradient back."""

    def __init__(self) -> None:
        super().__init__()
        width = _TRANSFER_WIDTH
        self.net = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(x) + x, pad.view_as(pad)


def _pass_loss(output: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    y, pad = output
    return nn.functional.mse_loss(y, target) + 0.0 * pad[:1].sum()  # pad gets a gradient, at no compute


def transfer_run_times(
    rank: int, world: int, rounds: int = _TRANSFER_ROUNDS, sizes: tuple[int, ...] = (0, TRANSFER_PROBE_BYTES)
) -> dict[int, list[float]]:
    """Per size, per round: one step of torch's 1F1B over ``world`` CPU ranks (``2 * world`` micro-batches of 64
    rows) of :class:`_PassStage`, each stage passing on a tensor of that many bytes and its gradient. The sizes
    alternate round by round (each round starting at another), so a drift of the machine's speed falls on all of
    them alike; a round's time is the median of :data:`_TRANSFER_BLOCK` steps."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    m = 2 * world
    runs = {}
    for size in sizes:
        torch.manual_seed(0)
        x, pad = torch.randn(64, _TRANSFER_WIDTH), torch.randn(max(size // 4, 1))
        stage = pipelining.PipelineStage(
            _PassStage(),
            rank,
            world,
            torch.device("cpu"),
            input_args=(x.clone().requires_grad_(rank > 0), pad.clone().requires_grad_(True)),
            output_args=(x.clone().requires_grad_(True), pad.clone().requires_grad_(True)),
        )
        schedule = pipelining.Schedule1F1B(stage, n_microbatches=m, loss_fn=_pass_loss)
        batch = (torch.randn(64 * m, _TRANSFER_WIDTH), torch.randn(m * pad.numel()).requires_grad_(True))
        runs[size] = (schedule, batch, torch.randn(64 * m, _TRANSFER_WIDTH))

    def step(size: int) -> float:
        schedule, batch, target = runs[size]
        dist.barrier()
        t0 = time.perf_counter()
        args = batch if rank == 0 else ()
        if rank == world - 1:
            schedule.step(*args, target=target, losses=[])
        else:
            schedule.step(*args)
        dist.barrier()
        return time.perf_counter() - t0

    for size in sizes:  # warm-up: the first step builds the stages' buffers
        step(size)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for index in range(rounds):
        k = index % len(sizes)
        for size in sizes[k:] + sizes[:k]:
            times[size].append(statistics.median(step(size) for _ in range(_TRANSFER_BLOCK)))
    return times


def fit_transfer_cost(times: dict[int, list[float]], world: int, latency_s: float, bytes_per_s: float) -> float:
    """The compute per byte sent or received (``transfer_compute_s_per_byte``) at which the simulator predicts the
    probe's measured slowdown (:func:`transfer_run_times`: the largest size over 0, the median of the rounds'
    ratios), its stages equal with B = 2 F, scaled to the run at 0 bytes, and the calibrated link both ways: the
    link's time on the critical path is the model's already, what is left is compute the copies took."""
    large = max(times)
    ratio = statistics.median(t / t0 for t, t0 in zip(times[large], times[0], strict=True))

    def iteration(forward_s: float, num_bytes: int, per_byte_s: float) -> float:
        link = [latency_s + num_bytes / bytes_per_s] * (world - 1)
        return simulate(
            Pipeline(
                [forward_s] * world,
                [2 * forward_s] * world,
                2 * world,
                Schedule.ONE_F_ONE_B,
                comm_forward_s=link,
                comm_backward_s=link,
                runtime=RuntimeTerms(transfer_compute_s_per_byte=per_byte_s),
                cut_forward_bytes=[num_bytes] * (world - 1),
                cut_backward_bytes=[num_bytes] * (world - 1),
            ),
        ).iteration_s

    # The stages' forward at which the step without the extra tensor takes what it measured.
    step_s = statistics.median(times[0])
    forward_s = solve_increasing(lambda f: iteration(f, 0, 0.0), step_s, step_s * 1e-6, step_s)
    plain = iteration(forward_s, 0, 0.0)
    return solve_increasing(lambda c: iteration(forward_s, large, c) / plain, ratio, 0.0, 1e-9, limit=1e-6)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(_WIDTH, _WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def _tiny_compute(dev: torch.device) -> tuple[float, float]:
    """Forward and backward of one tiny stage, by the profiler's own harness (what a profile would say)."""
    from profiles.dataflow import Piece
    from profiles.measure import measure_piece

    x = torch.randn(1, _WIDTH, device=dev)
    piece = Piece("tiny", _Tiny().to(dev), (x,), (True,))
    m = measure_piece(piece, device=dev, repeats=21, warmup=5)
    return m.forward_s, m.backward_s


def _schedule_runs(
    rank: int, world: int, dev: torch.device, steps: int, microbatch_counts: tuple[int, ...], min_measure_s: float
) -> dict[str, list[tuple[int, float]]]:
    """Per schedule, ``(M, median iteration)`` of the tiny stages: a quarter of ``min_measure_s`` of warm-up,
    then at least ``steps`` timed, and at least ``min_measure_s`` of them. Seven steps of a 2-10 ms
    iteration fitted overheads that ranged 2x from one calibration to the next on the development VM."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    out: dict[str, list[tuple[int, float]]] = {}
    for schedule, v in CALIBRATED_SCHEDULES:
        num_stages = world * v
        placement = stage_to_rank(schedule, num_stages, world)
        mine = [s for s in range(num_stages) if placement[s] == rank]
        points = []
        for m in microbatch_counts:
            torch.manual_seed(0)
            modules = [_Tiny().to(dev) for _ in range(num_stages)]
            example = torch.randn(1, _WIDTH, device=dev)
            stages = [
                pipelining.PipelineStage(
                    modules[s],
                    s,
                    num_stages,
                    dev,
                    input_args=(example.clone().requires_grad_(s > 0),),
                    output_args=(example.clone().requires_grad_(True),),
                )
                for s in mine
            ]
            cls = getattr(pipelining, TORCH_SCHEDULE_CLASS[schedule])
            loss_fn = nn.MSELoss()
            sched = cls(stages if schedule.multi_stage else stages[0], n_microbatches=m, loss_fn=loss_fn)
            batch = torch.randn(m, _WIDTH, device=dev)
            target = torch.randn(m, _WIDTH, device=dev)
            first, last = 0 in mine, num_stages - 1 in mine

            def step(sched: Any = sched, first: bool = first, last: bool = last, io: Any = (batch, target)) -> float:
                batch, target = io
                dist.barrier()
                t0 = time.perf_counter()
                if last:
                    sched.step(*((batch,) if first else ()), target=target, losses=[])
                else:
                    sched.step(*((batch,) if first else ()))
                dist.barrier()
                return time.perf_counter() - t0

            warm = [step() for _ in range(2)]
            for _ in range(_agreed_steps(warm[-1], min_measure_s / 4, 0, dev)):
                step()
            times = [step() for _ in range(_agreed_steps(warm[-1], min_measure_s, steps, dev))]
            points.append((m, statistics.median(times)))
        out[schedule.value] = points
    return out


def _agreed_steps(step_s: float, min_s: float, at_least: int, dev: torch.device) -> int:
    """Steps that fill ``min_s`` at rank 0's ``step_s`` (at least ``at_least``, at most
    :data:`_MAX_STEPS`), broadcast from rank 0: every rank must run as many, or the barriers hang.
    ``dev``: this rank's device (NCCL broadcasts device tensors only)."""
    import torch.distributed as dist

    wanted = max(at_least, min(_MAX_STEPS, math.ceil(min_s / max(step_s, 1e-6))))
    count = torch.tensor([wanted], device=dev)
    dist.broadcast(count, src=0)
    return int(count.item())


def _rank_main(
    rank: int, world: int, device: str, repeats: int, steps: int, min_measure_s: float = 0.0
) -> dict[str, Any]:
    dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    counts = (max(world, 2), 2 * world, 4 * world)
    transfer = dev.type == "cpu" and world > 1
    # A quick calibration (tests: no least time) takes one round of each ratio's probe; a real one, the rounds a
    # ratio needs.
    quick = min_measure_s <= 0
    phases = Phases(5 + int(transfer), "calibrate")
    result: dict[str, Any] = {"p2p": _p2p(rank, dev, sync, repeats, min_measure_s)}
    phases.end()
    result["colocation"] = _colocation(rank, world, dev, steps, 1 if quick else _COLOCATION_ROUNDS)
    phases.end()
    if transfer:
        result["transfer"] = transfer_run_times(rank, world, 1 if quick else _TRANSFER_ROUNDS)
        phases.end()
    result["optimizer"] = time_optimizers(dev, sync, repeats, min_measure_s)
    phases.end()
    result["compute"] = _tiny_compute(dev)
    phases.end()
    result["schedules"] = _schedule_runs(rank, world, dev, steps, counts, min_measure_s)
    phases.end()
    result["threads"] = torch.get_num_threads()
    return result


def _link(samples: list[tuple[int, float]], device: str) -> tuple[float, float, str]:
    """``(latency, bandwidth, how)``: the alpha-beta fit, or the shipped values when one rank measured no link.

    The line runs through the smallest and the largest message: over the widest span the small message's
    noise (tens of microseconds on a loaded machine) moves the slope by under 1 %, and a middle size's
    outlier cannot tilt it (512 KiB once took 1.83 ms instead of about 0.3, and the slope from the two
    largest sizes then said 41 GB/s).
    """
    if len(samples) < 2:
        shipped = shipped_calibration(device)
        return shipped.p2p_latency_s, shipped.p2p_bytes_per_s, f"not measured (one rank): shipped {shipped.source}"
    (small, t_small), *_, (large, t_large) = samples
    per_byte = max((t_large - t_small) / (large - small), 1e-15)
    latency = max(t_small - small * per_byte, 0.0)
    return latency, 1.0 / per_byte, "measured: ping-pong between ranks 0 and 1"


def _overheads(
    forward_s: float, backward_s: float, transfer_s: float, runs: dict[str, list[tuple[int, float]]], world: int
) -> tuple[dict[str, float], dict[str, list[float]]]:
    overheads, per_count = {}, {}
    for schedule, v in CALIBRATED_SCHEDULES:
        n = world * v
        fitted = []
        for m, measured in runs[schedule.value]:

            def iteration(o: float, m: int = m, n: int = n, schedule: Schedule = schedule) -> float:
                return simulate(
                    Pipeline(
                        [forward_s] * n,
                        [backward_s] * n,
                        m,
                        schedule,
                        num_ranks=world,
                        comm_forward_s=[transfer_s] * (n - 1),
                        comm_backward_s=[transfer_s] * (n - 1),
                        # The stages are one square Linear: its input and weight gradients are one matmul of
                        # the same size each, so I = W = B / 2 by construction (not a guess about a model).
                        weight_s=[backward_s / 2] * n if schedule.splits_backward else (),
                        runtime=RuntimeTerms(action_overhead_s=o),
                    ),
                ).iteration_s

            fitted.append(fit_overhead(measured, iteration))
        overheads[schedule.value] = statistics.median(fitted)
        per_count[schedule.value] = fitted
    return overheads, per_count


def calibrate(
    num_ranks: int = 2,
    *,
    device: str = "cpu",
    repeats: int = 15,
    steps: int = 7,
    min_measure_s: float = MIN_MEASURE_S,
    timeout_s: float = 300.0,
) -> Calibration:
    """Measure the runtime constants on ``num_ranks`` local ranks; see the module docstring.

    ``repeats`` and ``steps`` are the least samples per measurement; ``min_measure_s`` the least time per
    schedule run (a quarter of it per ping-pong size and optimizer set): 0 for a quick check (tests), which also
    takes one round of the co-location and transfer probes instead of the rounds their ratios need.

    Raises:
        UsageError: fewer than 1 rank, an unknown device, or CUDA asked for without enough GPUs.
        ExecutionError: a rank failed or hung.
    """
    _check_request(num_ranks, device)
    backend = BACKEND_OF_DEVICE[device]
    load_before = os.getloadavg()[0]
    results = run_ranks(
        _rank_main, (device, repeats, steps, min_measure_s), num_ranks, timeout_s=timeout_s, backend=backend
    )
    head = results[0]
    latency, bandwidth, link_source = _link(head["p2p"], device)
    forward_s, backward_s = head["compute"]
    runs = _slowest_runs(results)
    overheads, per_count = _overheads(forward_s, backward_s, latency + _WIDTH * 4 / bandwidth, runs, num_ranks)
    transfer_cost, transfer_source = _transfer_cost(head, num_ranks, latency, bandwidth)
    return Calibration(
        device_kind=device,
        backend=backend,
        num_ranks=num_ranks,
        threads_per_rank=int(head["threads"]),
        p2p_latency_s=latency,
        p2p_bytes_per_s=bandwidth,
        transfer_compute_s_per_byte=transfer_cost,
        action_overhead_s=overheads,
        optimizer=fit_optimizers([r["optimizer"] for r in results]),
        colocation_factor=_colocation_factor(results, device),
        source="measured",
        notes={
            "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": platform.node(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "p2p": link_source,
            "transfer_compute": transfer_source,
            "samples": _samples(results, runs, per_count),
        },
    )


def _check_request(num_ranks: int, device: str) -> None:
    """:class:`UsageError` for no rank, an unknown device, or more ranks than this machine has GPUs."""
    if num_ranks < 1:
        raise UsageError(f"calibrate needs at least 1 rank (got {num_ranks})")
    if device not in BACKEND_OF_DEVICE:
        raise UsageError(f"unknown device {device!r}: use cpu or cuda")
    if device == "cuda" and torch.cuda.device_count() < num_ranks:
        raise UsageError(f"--ranks {num_ranks} needs {num_ranks} GPUs, this machine has {torch.cuda.device_count()}")


def _slowest_runs(results: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per schedule, ``(M, iteration)`` of the slowest rank: what the iteration waits for."""
    head = results[0]
    return {
        name: [(m, max(r["schedules"][name][i][1] for r in results)) for i, (m, _) in enumerate(pts)]
        for name, pts in head["schedules"].items()
    }


def _transfer_cost(head: dict[str, Any], world: int, latency_s: float, bytes_per_s: float) -> tuple[float, str]:
    """The compute per byte transferred (:func:`fit_transfer_cost`) and how it was had; 0 where not measured."""
    if "transfer" not in head:
        return 0.0, "not measured (one rank, or CUDA)"
    cost = fit_transfer_cost(head["transfer"], world, latency_s, bytes_per_s)
    return cost, f"measured: 1F1B stages passing {TRANSFER_PROBE_BYTES >> 20} MiB on, against none"


def _colocation_factor(results: list[dict[str, Any]], device: str) -> float:
    """The median over ranks and rounds of pipelined over alone, at least 1; 1 on CUDA."""
    ratios = [t / a for r in results for a, t in r["colocation"] if a > 0]
    # Sharing a machine cannot make compute faster: a ratio below 1 is noise, and 1 is what it means. On
    # CUDA a rank is a device and shares no compute units: an H200 with one rank read 1.04 and 1.06, noise.
    return max(statistics.median(ratios), 1.0) if ratios and device != "cuda" else 1.0


def _samples(
    results: list[dict[str, Any]], runs: dict[str, list[tuple[int, float]]], per_count: dict[str, list[float]]
) -> dict[str, Any]:
    """Everything the calibration measured, for its ``notes.samples``."""
    head = results[0]
    forward_s, backward_s = head["compute"]
    return {
        "p2p_one_way_s": [[s, t] for s, t in head["p2p"]],
        "colocation_s": [[list(pair) for pair in r["colocation"]] for r in results],
        "transfer_step_s": {str(size): values for size, values in head.get("transfer", {}).items()},
        "optimizer_step_s": {k: [[n, c, t] for n, c, t, _ in v] for k, v in head["optimizer"].items()},
        "optimizer_step_after_pause_s": {k: [[n, c, t] for n, c, _, t in v] for k, v in head["optimizer"].items()},
        "tiny_stage_s": {"forward": forward_s, "backward": backward_s},
        "schedule_iteration_s": {k: [[m, t] for m, t in v] for k, v in runs.items()},
        "overhead_per_microbatch_count_s": per_count,
    }
