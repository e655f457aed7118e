"""The rank side of verify's processes mode: what one rank runs (:func:`rank_main`, started by
:func:`planner.runtime.launch.run_ranks` in its own process) and how it times itself.

Each stage's forward and backward of every micro-batch (``PipelineStage.forward_one_chunk`` /
``backward_one_chunk``, :class:`_StageTimer`), the waits on point-to-point transfers (torch's
``_wait_batch_p2p``, :class:`_WaitTimer`), the step tail (tied-gradient sum, ``optimizer.step()`` and
``zero_grad``) and the iteration between two barriers, for as many steps as the time floors ask
(:func:`_repeat`). After each timed step each rank in turn times its own units alone, as the profile timed
them (:func:`own_unit_reference`): how fast the machine runs on this rank's share of the model at that moment.
The rank hands back raw samples in a :class:`RankResult`; the parent (:mod:`planner.runtime.verify`) takes the
medians and holds them against the plan.

A module of its own because it runs in another process than the one that reads the results: what it
needs is here, and what crosses the process boundary is one picklable value.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from planner.plan import Plan
from planner.runtime.apply import apply_plan
from planner.runtime.launch import each_rank_in_turn, every_rank_at_once
from planner.runtime.progress import Phases
from planner.runtime.run_options import MIN_TIME_S, MIN_WARMUP_S
from planner.runtime.run_setup import captured_units, make_optimizer
from planner.runtime.stage_memory import track_rank_memory
from profiles.dataflow import Piece
from profiles.memory import MemorySample
from profiles.model_reference import UnitReference
from profiles.reference import SpeedReference
from profiles.workload import Workload, as_tuple, load_workload

__all__ = [
    "MIN_WARMUP_S",
    "MAX_WARMUP_STEPS",
    "MIN_TIME_S",
    "MAX_TIMED_STEPS",
    "RankResult",
    "rank_main",
    "rank_main_interleaved",
    "step_batch",
    "own_unit_reference",
]

MAX_WARMUP_STEPS = 100
"""The warm-up floor's limit in steps, for plans of a few milliseconds a step."""
MAX_TIMED_STEPS = 1000
"""The timed floor's limit in steps."""


@dataclass(frozen=True)
class RankResult:
    """What one rank measured, as it crosses back to the parent process (pickled: plain values, CPU tensors).

    Raw samples, one per timed step; the parent takes their medians.
    """

    stage_indices: tuple[int, ...]
    """The plan's stages this rank ran, in the order of :attr:`stage_records`."""
    replica: int
    """The data-parallel replica this rank belongs to (cluster plans; 0 otherwise)."""
    warmup_steps: int
    """Untimed steps run: ``warmup``, or more to fill the warm-up's time floor."""
    timed_steps: int
    """Timed steps run: ``steps``, or more to fill the timed floor."""
    stage_records: tuple[tuple[tuple[str, float], ...], ...]
    """Per stage, every timed step's ``(kind, seconds)`` records in order: ``F`` forward (the last stage's
    with its loss), ``B`` and ``W`` (a split backward's input and weight gradients; ``B`` alone otherwise),
    ``R`` the schedule's gradient scaling, ``L`` a loss not counted in a forward."""
    iteration_s: tuple[float, ...]
    """Per timed step: from the opening barrier to the closing barrier's return."""
    busy_s: tuple[float, ...]
    """Per timed step: every stage's compute (all records but the gradient scaling)."""
    wait_s: tuple[float, ...]
    """Per timed step: inside torch's waits on point-to-point transfers."""
    tail_s: tuple[float, ...]
    """Per timed step: the gradient scaling, plus from the schedule's return to the optimizer step's end."""
    own_s: tuple[float, ...]
    """Per timed step: from the opening barrier to this rank's optimizer step's end (the closing barrier
    only waits for the slowest rank)."""
    reference_s: float | None
    """The speed reference's median, timed after each timed step with each rank alone: this rank's own units
    added up (:attr:`reference` ``units``), else the fixed layer (profiles/reference.py)."""
    loss: float | None = None
    """The numerics step's loss; None without numerics, or on a rank that does not compute it."""
    grads: dict[str, torch.Tensor] | None = None
    """The numerics step's gradients by parameter FQN (whole CPU tensors); None without numerics."""
    stage_memory: tuple[MemorySample, ...] = ()
    """Per stage (in :attr:`stage_indices` order): its peak of live tensor bytes in one step, by category
    (:mod:`planner.runtime.stage_memory`)."""
    rank_memory: MemorySample | None = None
    """The rank's peak: all its stages at once."""
    device_allocated_bytes: int | None = None
    """CUDA: the allocator's peak of allocated bytes over the timed steps (``max_memory_allocated``); None on CPU."""
    device_reserved_bytes: int | None = None
    """CUDA: the allocator's peak of reserved bytes (``max_memory_reserved``), what the device really gave."""
    step_rounds: tuple[int, ...] = ()
    """Per timed step: the round it ran in, when several plans ran interleaved (all 0 otherwise)."""
    reference: str = "layer"
    """What :attr:`reference_s` timed: ``units`` (the units of this rank's stages, :func:`own_unit_reference`)
    or ``layer``."""
    reference_together_s: float | None = None
    """The units' median timed right after, every rank at once (:func:`time_units_together`); None for the
    layer. Over :attr:`reference_s`, what running beside the other ranks costs this rank's units now."""


class _StageTimer:
    """Wraps a PipelineStage's compute methods on the instance and records their durations."""

    def __init__(self, stage: Any, device: torch.device) -> None:
        self.records: list[tuple[str, float]] = []
        # R: the schedule's gradient scaling at the end of step, which the cost model counts in the step
        # tail (calibrate measures it with the optimizer), so verify moves it there too.
        for method, kind in (
            ("forward_one_chunk", "F"),
            ("backward_one_chunk", "B"),
            ("backward_weight_one_chunk", "W"),
            ("perform_reduce_grad", "R"),
        ):
            setattr(stage, method, self._wrap(getattr(stage, method), kind, device))

    def time_loss(self, schedule: Any, device: torch.device) -> None:
        """Count the schedule's loss as part of this (last) stage's forward, as the profile's last unit does:
        torch computes it right after the forward, outside ``forward_one_chunk``."""
        timed = self._wrap(schedule._compute_loss, "L", device)

        def into_forward(*args: Any, **kwargs: Any) -> Any:
            out = timed(*args, **kwargs)
            if len(self.records) > 1 and self.records[-2][0] == "F":
                loss_s = self.records.pop()[1]
                self.records[-1] = ("F", self.records[-1][1] + loss_s)
            return out  # else the loss stays its own record: in the rank's compute, in no stage's times

        schedule._compute_loss = into_forward

    def _wrap(self, fn: Callable[..., Any], kind: str, device: torch.device) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.records.append((kind, time.perf_counter() - t0))
            return out

        return timed


class _WaitTimer:
    """Times torch's waits on point-to-point work by wrapping ``schedules._wait_batch_p2p`` in this process."""

    def __init__(self) -> None:
        from torch.distributed.pipelining import schedules

        self.total_s = 0.0
        original = schedules._wait_batch_p2p

        def timed(work: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(work)
            finally:
                self.total_s += time.perf_counter() - t0

        schedules._wait_batch_p2p = timed  # the schedules look the function up by name at each call


def step_batch(plan: Plan) -> int:
    """Samples in one step: all replicas' under a cluster plan."""
    return plan.mesh.global_batch_size if plan.mesh is not None else plan.global_batch_size


def _repeat(step: Callable[[], object], at_least: int, min_s: float, at_most: int, dev: torch.device) -> int:
    """Run ``step`` at least ``at_least`` times, and on until ``min_s`` have passed (at most ``at_most``
    times); returns how many. Rank 0's clock decides, so every rank runs as many."""
    import torch.distributed as dist

    started, done = time.perf_counter(), 0
    while True:
        if done >= at_least:
            more = done < at_most and time.perf_counter() - started < min_s
            flag = torch.tensor([int(more)], device=dev)  # NCCL broadcasts device tensors only
            dist.broadcast(flag, src=0)
            if not flag.item():
                return done
        step()
        done += 1


class _PlanSteps:
    """One plan's training loop on this rank, timed: the stages from :func:`apply_plan`, their timers, the
    optimizer, and every timed step's samples. Several can live in one process (:func:`rank_main_interleaved`):
    each has its own model, and only one steps at a time."""

    def __init__(
        self,
        spec: str,
        plan: Plan,
        dev: torch.device,
        waits: _WaitTimer,
        numerics: bool,
        captured: dict[int, tuple[tuple[Piece, ...], torch.Tensor]] | None = None,
        loaded: dict[str, Workload] | None = None,
        unit_reference: bool = True,
    ) -> None:
        """``captured``: every unit's pieces and the micro-batch's target by micro-batch size, shared by the plans
        of one process (each size captured once, by the first plan that needs it); ``loaded``: the workloads built
        so far in this process (:func:`_own_workload`); ``unit_reference``: whether the plan's own units are its
        speed reference (else none is made here, and the run takes the machine's)."""
        workload = _own_workload(spec, loaded)
        inputs, target = workload.make_batch(step_batch(plan))
        self.inputs = tuple(t.to(dev) for t in as_tuple(inputs))
        self.target = target.to(dev)
        self.dev, self.waits = dev, waits
        # Before the model is split into stages: its units are captured as the profile captured them.
        units = _captured_units(plan, workload, dev, {} if captured is None else captured) if unit_reference else None
        self.run = apply_plan(plan, workload.model, self.inputs, workload.loss_fn, device=dev, tp_plan=workload.tp_plan)
        self.reference = None
        if units is not None:
            pieces, mb_target = units
            self.reference = own_unit_reference(plan, pieces, mb_target, self.run.stage_indices, workload.loss_fn, dev)
        self.loss: float | None = None
        self.grads: dict[str, torch.Tensor] | None = None
        if numerics:
            loss = self.run.step(self.inputs, self.target)
            self.loss = None if loss is None else loss.item()
            self.grads = self.run.full_gradients()
        self.timers = [_StageTimer(stage, dev) for stage in self.run.stages]
        for stage, timer in zip(self.run.stages, self.timers, strict=True):
            if stage.is_last:
                timer.time_loss(self.run.schedule, dev)
        zero = plan.mesh is not None and plan.mesh.shard == "optimizer"
        self.optimizer = make_optimizer(
            str(plan.constraints.get("optimizer", "adam")),
            self.run.parameters(),
            self.run.replica_group if zero else None,
        )
        self.warmup_steps = 0
        self.iteration: list[float] = []
        self.busy: list[float] = []
        self.wait: list[float] = []
        self.tail: list[float] = []
        self.own: list[float] = []
        self.rounds: list[int] = []
        self.records: list[list[tuple[str, float]]] = [[] for _ in self.timers]

    def step(self) -> tuple[float, float, float]:
        """One training step between barriers: (start, schedule returned, optimizer done)."""
        import torch.distributed as dist

        for t in self.timers:
            t.records.clear()
        self.waits.total_s = 0.0
        dist.barrier()
        t0 = time.perf_counter()
        self.run.schedule_step(self.inputs, self.target)
        t1 = time.perf_counter()
        self.run.sync_tied_grads()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        t2 = time.perf_counter()
        dist.barrier()
        return t0, t1, t2

    def warm_up(self, at_least: int, min_s: float) -> None:
        self.warmup_steps += _repeat(self.step, at_least, min_s, MAX_WARMUP_STEPS, self.dev)

    def timed_step(self, round_index: int = 0) -> None:
        t0, t1, t2 = self.step()
        self.iteration.append(time.perf_counter() - t0)
        scaling = sum(d for t in self.timers for kind, d in t.records if kind == "R")
        self.busy.append(sum(d for t in self.timers for kind, d in t.records if kind != "R"))
        self.wait.append(self.waits.total_s)
        self.tail.append(t2 - t1 + scaling)
        self.own.append(t2 - t0)
        self.rounds.append(round_index)
        for k, t in enumerate(self.timers):
            self.records[k].extend(t.records)

    def result(self, reference: SpeedReference | UnitReference, track_memory: bool = True) -> RankResult:
        """The samples so far, with one step's memory tracked now where asked (after the timed steps: the
        tracker's bookkeeping would slow the steps it watched)."""
        stage_memory: tuple[MemorySample, ...] = ()
        rank_memory: MemorySample | None = None
        if track_memory:
            stage_memory, rank_memory = track_rank_memory(self.run, self.optimizer, self.step, self.inputs, self.target)
        return RankResult(
            stage_indices=tuple(self.run.stage_indices),
            replica=self.run.replica,
            warmup_steps=self.warmup_steps,
            timed_steps=len(self.iteration),
            stage_records=tuple(tuple(r) for r in self.records),
            iteration_s=tuple(self.iteration),
            busy_s=tuple(self.busy),
            wait_s=tuple(self.wait),
            tail_s=tuple(self.tail),
            own_s=tuple(self.own),
            reference_s=reference.median_s,
            reference="units" if isinstance(reference, UnitReference) else "layer",
            reference_together_s=reference.together_median_s if isinstance(reference, UnitReference) else None,
            loss=self.loss,
            grads=self.grads,
            stage_memory=stage_memory,
            rank_memory=rank_memory,
            step_rounds=tuple(self.rounds),
        )


def _own_workload(spec: str, loaded: dict[str, Workload] | None) -> Workload:
    """The workload ``spec`` names, with a model of its own: built once per process in ``loaded``, then
    copied. Building gpt2-small takes seconds (its weights initialised at random), a copy a fraction of one,
    and the copy has the same weights, as every build with the model's seed has."""
    if loaded is None:
        return load_workload(spec)
    if spec not in loaded:
        loaded[spec] = load_workload(spec)
    return replace(loaded[spec], model=copy.deepcopy(loaded[spec].model))


def _captured_units(
    plan: Plan, workload: Workload, dev: torch.device, captured: dict[int, tuple[tuple[Piece, ...], torch.Tensor]]
) -> tuple[tuple[Piece, ...], torch.Tensor] | None:
    """:func:`~planner.runtime.run_setup.captured_units`, once per micro-batch size in ``captured``; None also where
    the plan's stages are split across tensor-parallel ranks."""
    if plan.mesh is not None and plan.mesh.tp > 1:
        return None
    b = plan.micro_batch_size
    if b not in captured:
        found = captured_units(plan, workload, dev)
        if found is None:
            return None
        captured[b] = found
    return captured[b]


def own_unit_reference(
    plan: Plan,
    pieces: tuple[Piece, ...],
    target: torch.Tensor,
    stage_indices: tuple[int, ...],
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    device: torch.device,
) -> UnitReference:
    """The units of the stages ``stage_indices`` among ``pieces`` (every unit, in the model's order), one
    micro-batch each, the last with the loss (``loss_fn`` on ``target``) where the rank holds the model's last unit.

    The speed reference of a rank: its own share of the model, timed alone as the profile timed it. The fixed
    layer (profiles/reference.py) is one kind of work; a long model's units slow down by their own amount, which
    only they measure.
    """
    mine = {u for s in stage_indices for u in plan.stages[s].units}
    own = tuple(p for p in pieces if p.name in mine)
    last = plan.num_stages - 1 in stage_indices
    return UnitReference(own, device, loss_fn if last else None, target)


def time_units_together(rank: int, world_size: int, tag: str, references: Sequence[UnitReference]) -> None:
    """Each of ``references`` timed once more, every rank at once (:func:`planner.runtime.launch.every_rank_at_once`).

    The reference timed alone reads the machine's speed; it does not read how much the ranks slow each other,
    and that moves within minutes on a shared machine: the same units timed together, against the co-location
    factor the plan was predicted with, say how much (docs/cost-model.md, "The machine's speed").
    """

    def timed() -> None:
        for k, reference in enumerate(references):
            reference.time_together(wake=k == 0)

    every_rank_at_once(rank, world_size, tag, timed, references[0].keep_busy)


def rank_main(
    rank: int,
    world_size: int,
    spec: str,
    plan: Plan,
    steps: int,
    warmup: int,
    min_warmup_s: float,
    min_time_s: float,
    numerics: bool,
    device: str,
    local_rank: int | None = None,
) -> RankResult:
    """One rank of the processes mode, or of a torchrun job (``local_rank``: its GPU on its node; else
    ``rank``); returns its measurements (and first-step grads if asked)."""
    gpu = rank if local_rank is None else local_rank
    dev = torch.device(f"cuda:{gpu}") if device.startswith("cuda") else torch.device("cpu")
    steps_of = _PlanSteps(spec, plan, dev, _WaitTimer(), numerics)
    phases = Phases(1 + steps + 1, "verify")  # the warm-up, the timed steps, the memory step
    steps_of.warm_up(warmup, min_warmup_s)
    reference = steps_of.reference or SpeedReference(dev)
    reference.warm_up()
    phases.end(left=steps + 1)

    def timed_step() -> None:
        steps_of.timed_step()
        # Before the references, which rank 0 times first while the others wait without a core: the launching
        # process wakes to draw the report on a core no timed work is using.
        phases.end(left=max(steps - len(steps_of.iteration), 0) + 1)
        # After the step's closing barrier (outside every timed interval), each rank alone: the machine's
        # speed now; then every rank at once: the ranks' contention now, against the co-location factor's.
        each_rank_in_turn(rank, world_size, f"verify-reference-{len(steps_of.iteration)}", reference.time_once)
        if isinstance(reference, UnitReference):
            time_units_together(rank, world_size, f"verify-{len(steps_of.iteration)}", [reference])

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    _repeat(timed_step, steps, min_time_s, max(steps, MAX_TIMED_STEPS), dev)
    allocated = reserved = None
    if dev.type == "cuda":
        allocated, reserved = int(torch.cuda.max_memory_allocated(dev)), int(torch.cuda.max_memory_reserved(dev))
    result = steps_of.result(reference)
    phases.end(left=0)
    return replace(result, device_allocated_bytes=allocated, device_reserved_bytes=reserved)


def rank_main_interleaved(
    rank: int,
    world_size: int,
    spec: str,
    plans: list[Plan],
    rounds: int,
    warmup: int,
    min_warmup_s: float,
    min_block_s: float,
    device: str,
    unit_references: Sequence[bool] | None = None,
    track_memory: bool = True,
) -> list[RankResult]:
    """One rank of several plans run in one launch (:func:`planner.runtime.interleave.verify_plans`): every
    plan warmed up (the first also for ``min_warmup_s``), then ``rounds`` rounds in which each plan runs a block of
    steps (at least one, and on until ``min_block_s``), the plans' order rotating from round to round. Plans timed
    seconds apart see the same machine: their ratio holds while its speed moves. After each round each rank in turn
    times each plan's share of its units (plans with the same micro-batch size and stages on this rank share one).
    One result per plan, each step marked with its round. ``unit_references`` says which plans time their units
    (None: every plan); the others take the machine's speed reference (profiles/reference.py). With
    ``track_memory`` each plan's memory is tracked over one more step at the end."""
    dev = torch.device(f"cuda:{rank}") if device.startswith("cuda") else torch.device("cpu")
    waits = _WaitTimer()  # one per process: it wraps a module-level function of torch
    captured: dict[int, tuple[tuple[Piece, ...], torch.Tensor]] = {}
    loaded: dict[str, Workload] = {}
    wanted = [True] * len(plans) if unit_references is None else list(unit_references)
    runs = [
        _PlanSteps(spec, plan, dev, waits, numerics=False, captured=captured, loaded=loaded, unit_reference=w)
        for plan, w in zip(plans, wanted, strict=True)
    ]
    # Each plan's warm-up, each round, and each plan's memory step where tracked.
    phases = Phases(len(runs) * (1 + int(track_memory)) + rounds, f"{len(runs)} plans in {rounds} rounds")
    # The process warms up once, for ``min_warmup_s`` (gloo's pairs, the heap's growth), on the first plan; each
    # other plan its ``warmup`` steps: its ratios are medians over rounds, which a slow first block moves little.
    for k, r in enumerate(runs):
        r.warm_up(warmup, min_warmup_s if k == 0 else 0.0)
        phases.end()
    shared: dict[tuple[int, tuple[str, ...]], SpeedReference | UnitReference] = {}
    references = []
    for r in runs:
        unit = r.reference
        key = (0, ()) if unit is None else (r.run.plan.micro_batch_size, tuple(p.name for p in unit.pieces))
        if key not in shared:
            shared[key] = unit or SpeedReference(dev)
        references.append(shared[key])
    for reference in shared.values():
        reference.warm_up()

    def time_all() -> None:
        # One wake-up (UnitReference.time_once) after the wait, before the first: the others follow it at once.
        woke = False
        for reference in shared.values():
            if isinstance(reference, UnitReference):
                reference.time_once(wake=not woke)
                woke = True
            else:
                reference.time_once()

    for index in range(rounds):
        for k in range(len(runs)):
            r = runs[(index + k) % len(runs)]
            _repeat(lambda r=r, i=index: r.timed_step(i), 1, min_block_s, MAX_TIMED_STEPS, dev)
        # Reported between the round's blocks and its references, where every other rank waits for rank 0 to time
        # alone: the launching process wakes to draw it on a core no timed work is using.
        phases.end()
        each_rank_in_turn(rank, world_size, f"interleaved-reference-{index}", time_all)
        units = [r for r in shared.values() if isinstance(r, UnitReference)]
        if units:
            time_units_together(rank, world_size, f"interleaved-{index}", units)
    results = []
    for r, reference in zip(runs, references, strict=True):
        results.append(r.result(reference, track_memory))
        if track_memory:
            phases.end()
    return results
