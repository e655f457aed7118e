"""``pipeplan verify``: run a plan for real and compare the measured times with the plan's predictions.

Two modes, and a third under ``torchrun`` (planner/runtime/torchrun.py: each process of the job one rank).
``processes``: one process per rank (gloo on CPU, nccl on CUDA) runs the plan with
``torch.distributed.pipelining``; each stage's forward and backward of every micro-batch are timed
(``PipelineStage.forward_one_chunk`` / ``backward_one_chunk``), the waits on point-to-point transfers
(torch's ``_wait_batch_p2p``), the step tail (tied-gradient sum, ``optimizer.step()`` and
``zero_grad`` of the plan's optimizer, as in training), and the iteration between two barriers.
``replay``: one process runs every stage's actions in schedule order (:mod:`planner.runtime.replay`) and the
simulator turns the measured stage times into an iteration. ``auto`` picks processes when there are
as many CPU cores (or GPUs, on CUDA) as ranks, and always for a plan with tensor parallelism (``mesh.tp`` > 1),
whose ``pp x dp x tp`` processes run each stage on its tensor-parallel group (planner/runtime/tensor_parallel.py).

The numerics check compares the loss and every parameter gradient after one step with the same
model on one process (same seed, same batch, the loss averaged over micro-batches as torch's
schedules do) within ``atol=1e-5, rtol=1e-4`` (``|a - b| <= atol + rtol * |b|``); sharded gradients are
gathered whole (``full_tensor()``) and put back in the model's own layout first (``PipelineRun.full_gradients``).

This module runs: it picks the mode, starts the ranks or the replay, turns what they measured into a
:class:`~planner.runtime.verify_report.VerifyReport` and checks the numerics. What one rank runs and times is
:mod:`planner.runtime.rank_timing`; the report, its JSON and its table are :mod:`planner.runtime.verify_report`.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

import torch

from planner.cost import MemoryBreakdown
from planner.errors import ExecutionError, PipeplanWarning, TensorParallelError, UsageError
from planner.plan import Plan
from planner.runtime.apply import schedule_microbatches, tied_parameter_groups
from planner.runtime.job_report import JobReport
from planner.runtime.launch import run_ranks
from planner.runtime.rank_timing import RankResult, rank_main, step_batch
from planner.runtime.replay import replay_plan
from planner.runtime.run_options import VerifyOptions
from planner.runtime.tensor_parallel import check_runtime_layout, tp_layout
from planner.runtime.torchrun import RankRecord, TorchrunJob, check_job, job_sections, run_in_job, torchrun_job
from planner.runtime.verify_report import (
    NUMERICS_ATOL,
    NUMERICS_RTOL,
    NumericsReport,
    RankTime,
    StageReport,
    VerifyReport,
    contention_change,
    format_report,
)
from planner.schedule.simulate import simulate
from profiles.memory import MemorySample
from profiles.workload import Workload, as_tuple, load_workload

__all__ = [
    "verify_plan",
    "format_report",
    "compare_numerics",
    "reference_step",
    "rank_thread_count",
    "pick_mode",
    "build_report",
    "measured_from_ranks",
    "judge_ranks",
    "MeasuredRun",
]

_MODES = ("auto", "processes", "replay")


def reference_step(workload: Workload, plan: Plan) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, one step: the loss averaged over micro-batches and every gradient by FQN.

    A cluster plan's step is every replica's micro-batches: the replicas' average of their own averages.
    """
    m = schedule_microbatches(plan) * (plan.mesh.dp if plan.mesh is not None else 1)
    inputs, target = workload.make_batch(step_batch(plan))
    chunks = list(zip(*(t.chunk(m) for t in as_tuple(inputs)), strict=True))
    workload.model.zero_grad(set_to_none=True)
    losses = [workload.loss_fn(workload.model(*x), y) for x, y in zip(chunks, target.chunk(m), strict=True)]
    loss = torch.stack(losses).mean()
    loss.backward()
    grads = {
        n: p.grad.detach().clone()
        for n, p in workload.model.named_parameters(remove_duplicate=False)
        if p.grad is not None
    }
    return loss.item(), grads


def compare_numerics(
    ref_loss: float, ref_grads: dict[str, torch.Tensor], loss: float, grads: dict[str, torch.Tensor]
) -> NumericsReport:
    """Compare a pipelined step with the reference; a parameter missing from ``grads`` fails the check."""
    ok = math.isclose(loss, ref_loss, rel_tol=NUMERICS_RTOL, abs_tol=NUMERICS_ATOL)
    worst, worst_diff = "", 0.0
    for name, ref in ref_grads.items():
        got = grads.get(name)
        if got is None:
            ok, worst, worst_diff = False, f"{name} (no gradient)", math.inf
            continue
        diff = (got.float() - ref.float()).abs()
        ok = ok and bool(torch.all(diff <= NUMERICS_ATOL + NUMERICS_RTOL * ref.float().abs()))
        if diff.max().item() > worst_diff:
            worst, worst_diff = name, diff.max().item()
    return NumericsReport(ok, abs(loss - ref_loss), worst_diff, worst)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _stage_times(records: Iterable[tuple[str, float]]) -> tuple[float, float]:
    by_kind: dict[str, list[float]] = {"F": [], "B": [], "W": [], "L": [], "R": []}
    for kind, d in records:
        by_kind[kind].append(d)
    # Zero-bubble splits a backward into B (input grads) and W (weight grads): their sum is the backward.
    return _median(by_kind["F"]), _median(by_kind["B"]) + _median(by_kind["W"])


def _processes(plan: Plan) -> int:
    """Processes of a run: the pipeline's ranks, times the replicas of a cluster plan."""
    return plan.mesh.used_devices if plan.mesh is not None else plan.num_ranks


def pick_mode(mode: str, plan: Plan, device: str) -> str:
    """What ``mode`` (``auto``, ``processes``, ``replay``) runs ``plan`` as on ``device``: processes where there is
    a core or GPU for every process, the one-process replay otherwise."""
    if mode not in _MODES:
        raise UsageError(f"unknown verify mode {mode!r}: use one of {', '.join(_MODES)}")
    tp = plan.mesh.tp if plan.mesh is not None else 1
    if tp > 1:
        # A replay is one process: it cannot hold a tensor-parallel group, whatever the cores.
        if mode == "replay":
            raise TensorParallelError(
                f"the plan shards stages over tensor parallelism {tp}: replay runs one process; use --mode processes"
            )
        return "processes"
    if mode != "auto":
        return mode
    if device.startswith("cuda"):
        return "processes" if torch.cuda.device_count() >= _processes(plan) else "replay"
    return "processes" if (os.cpu_count() or 1) >= _processes(plan) else "replay"


def rank_thread_count(plan: Plan, mode: str, device: str) -> int | None:
    """The intra-op threads each rank of a CPU run on real processes gets: those the plan's stages were timed
    with (``plan.device["threads"]``), so that they compute as predicted, where the machine has the cores for
    them; None (the launcher's ``cores // ranks``) on GPUs, in replay (which takes them itself) or where the
    plan does not say.

    Raises:
        UsageError: the ranks with those threads need more cores than this machine has: the stages would
            not compute as profiled, and a run would only measure that. (Ranks timed on one thread each that
            outnumber the cores still run, with a warning: nothing can be corrected there.)
    """
    threads = plan.profile_threads
    if device != "cpu" or threads is None or pick_mode(mode, plan, device) != "processes":
        return None
    ranks, cores = _processes(plan), os.cpu_count() or 1
    if ranks * threads <= cores:
        return threads
    if threads == 1:  # more ranks than cores (a tensor-parallel plan runs as processes): they share the cores
        warnings.warn(
            f"{ranks} ranks share {cores} cores: their times will not be the plan's (its numerics still are)",
            PipeplanWarning,
            stacklevel=3,
        )
        return 1
    raise UsageError(
        f"the plan's stages were timed on {threads} threads per rank, but {ranks} ranks x {threads} threads need "
        f"{ranks * threads} cores and this machine has {cores}: profile the model here and plan again (the profile "
        "records each rank count's threads), or verify --mode replay"
    )


def verify_plan(plan: Plan, workload: str | Workload, options: VerifyOptions | None = None) -> VerifyReport:
    """Run ``plan`` and compare with its predictions.

    Started by ``torchrun`` (planner/runtime/torchrun.py), this process runs as its rank of the job, ``mode``
    ``torchrun``, and every rank returns the job's one report (rank 0 made it).

    Args:
        plan: the plan to check.
        workload: a MODEL spec (what ``load_workload`` takes; each rank builds the model from it, so
            every rank has the same seeded weights) or a :class:`Workload` (its ``name`` is used as
            the spec in processes mode; replay uses the object itself).
        options: how to run and judge it (default ``VerifyOptions()``, the ``verify`` command's defaults):
            ``steps`` and ``warmup``, timed and untimed iterations (in processes mode the warm-up also lasts at
            least ``min_warmup_s``, :data:`~planner.runtime.run_options.MIN_WARMUP_S`, and the timed steps
            ``min_time_s``, :data:`~planner.runtime.run_options.MIN_TIME_S`; the report says how many steps each
            took); ``mode``, ``auto``, ``processes`` or ``replay``; ``check_numerics``, also compare one step's
            loss and gradients with a single process; ``timeout_s``, every rank (processes) or the replay (one
            process) is stopped after it; ``device``, ``cpu`` or ``cuda``; ``tolerance``, the largest relative
            iteration error for ``report.ok``; ``memory_tolerance``, the largest relative error of any stage's
            measured memory peak for ``report.ok`` (10 %; a stage measured over the memory the plan gave it
            fails too).

    Raises:
        ExecutionError: a rank failed, hung or was killed. ModelMismatchError: not the plan's model.
        UsageError: ranks that cannot get the threads the plan was timed with (:func:`rank_thread_count`); a
            tensor-parallel layout the runtime does not run. (Bad steps or a bad mode are refused when the
            :class:`VerifyOptions` is made.)
    """
    options = options or VerifyOptions()
    job = torchrun_job()
    if job is not None:
        # Started by torchrun: this process is one rank of the job, which runs the plan on its own processes.
        return _verify_in_job(plan, workload if isinstance(workload, str) else workload.name, options, job)
    chosen = _check_run(plan, workload, options.mode, options.device)
    if chosen == "processes":
        spec = workload if isinstance(workload, str) else workload.name
        measured_run, numerics = _run_processes(plan, spec, options)
    else:
        measured_run, numerics = _run_replay(
            plan,
            workload,
            options.steps,
            options.warmup,
            check_numerics=options.check_numerics,
            device=options.device,
            timeout_s=options.timeout_s,
        )
    world_size = _processes(plan) if chosen == "processes" else 1
    return build_report(
        plan, chosen, measured_run, options.tolerance, options.memory_tolerance, numerics, world_size=world_size
    )


def _verify_in_job(plan: Plan, spec: str, options: VerifyOptions, job: TorchrunJob) -> VerifyReport:
    """This process as one rank of a torchrun job (planner/runtime/torchrun.py): refused before the process group
    opens where the job or the plan cannot run, the same way on every rank; the job's report on every rank."""
    check_job(plan, job, options)
    _check_run(plan, spec, "processes", options.device)

    def report(records: Sequence[RankRecord]) -> VerifyReport:
        measured_run, numerics = judge_ranks(plan, spec, [r.result for r in records], options.check_numerics)
        o = options
        sections = job_sections(plan, records)
        return build_report(
            plan,
            "torchrun",
            measured_run,
            o.tolerance,
            o.memory_tolerance,
            numerics,
            world_size=len(records),
            job=sections,
        )

    return run_in_job(plan, spec, options, job, report)


def _check_run(plan: Plan, workload: str | Workload, mode: str, device: str) -> str:
    """Refuse what cannot run before any process starts; the mode the plan runs in (:func:`pick_mode`)."""
    check_runtime_layout(plan)  # before any process starts
    chosen = pick_mode(mode, plan, device)
    if plan.mesh is not None and plan.mesh.tp > 1:
        # Refused here, in one line, rather than by every rank after the processes start.
        local = load_workload(workload) if isinstance(workload, str) else workload
        tp_layout(local.model, plan.mesh.tp, local.tp_plan)
    return chosen


def _run_processes(plan: Plan, spec: str, options: VerifyOptions) -> tuple[MeasuredRun, NumericsReport | None]:
    """Run the plan on one process per rank, each building the model from ``spec``; what they measured, and the
    numerics against one process when asked."""
    o = options
    backend = "nccl" if o.device.startswith("cuda") else "gloo"
    args = (spec, plan, o.steps, o.warmup, o.min_warmup_s, o.min_time_s, o.check_numerics, o.device)
    threads = rank_thread_count(plan, "processes", o.device)
    everyone = run_ranks(rank_main, args, _processes(plan), timeout_s=o.timeout_s, backend=backend, threads=threads)
    return judge_ranks(plan, spec, everyone, o.check_numerics)


def judge_ranks(
    plan: Plan, spec: str, everyone: Sequence[RankResult], check_numerics: bool
) -> tuple[MeasuredRun, NumericsReport | None]:
    """What every rank measured, in the plan's terms, and the numerics of their first step against one process
    building the model from ``spec`` when asked."""
    measured_run = measured_from_ranks(plan, everyone)
    if not check_numerics:
        return measured_run, None
    results = _first_replica(plan, everyone)
    loss = statistics.fmean(r.loss for r in everyone if r.loss is not None)
    fresh = load_workload(spec)
    grads = _merge_rank_grads([r.grads or {} for r in results], tied_parameter_groups(fresh.model))
    return measured_run, compare_numerics(*reference_step(fresh, plan), loss, grads)


def _run_replay(
    plan: Plan,
    workload: str | Workload,
    steps: int,
    warmup: int,
    *,
    check_numerics: bool,
    device: str,
    timeout_s: float,
) -> tuple[MeasuredRun, NumericsReport | None]:
    """Replay every stage in one process and simulate the iteration from the measured stage times; what it
    measured, and the numerics against one process when asked."""
    local = load_workload(workload) if isinstance(workload, str) else workload
    with _deadline(timeout_s):
        result = replay_plan(plan, local, steps=steps, warmup=warmup, device=device, keep_grads=check_numerics)
    fwd, bwd = list(result.forward_s), list(result.backward_s)
    # Replay measures compute alone; the runtime terms (overhead, step tail, co-location) stay the plan's,
    # and so do its links and, for a split backward, its proportions of I and W.
    terms = plan.predicted.runtime if plan.predicted.runtime.step_tail_s else None
    pipeline = replace(plan.pipeline().with_runtime(terms), forward_s=fwd, num_microbatches=schedule_microbatches(plan))
    if not plan.schedule.splits_backward:
        pipeline = replace(pipeline, input_s=(), weight_s=())
    sim = simulate(pipeline.with_backward(bwd))
    memory = [as_breakdown(m) for m in result.stage_memory] if result.stage_memory else [None] * plan.num_stages
    measured_run = MeasuredRun(
        fwd,
        bwd,
        memory,
        sim.iteration_s,
        tuple(sim.busy_s),
        (),
        result.warmup_steps,
        steps,
        result.reference_s,
        (),
        (),
        (),
        result.reference,
    )
    if not check_numerics:
        return measured_run, None
    # A spec builds a fresh model: the replay's steps have changed the weights of its own.
    fresh = load_workload(workload) if isinstance(workload, str) else workload
    assert result.loss is not None and result.grads is not None
    return measured_run, compare_numerics(*reference_step(fresh, plan), result.loss, result.grads)


class MeasuredRun(NamedTuple):
    """What a run measured, in the plan's terms, before it is held against the plan."""

    forward_s: list[float]
    backward_s: list[float]
    memory: list[MemoryBreakdown | None]
    iteration_s: float
    busy_s: tuple[float, ...]
    ranks: tuple[RankTime, ...]
    warmup_steps: int
    timed_steps: int
    reference_s: float | None
    rank_memory_bytes: tuple[int, ...]
    device_allocated_bytes: tuple[int, ...]
    device_reserved_bytes: tuple[int, ...]
    reference: str = "layer"
    """What ``reference_s`` timed: ``layer`` (profiles/reference.py) or ``units`` (profiles/model_reference.py)."""
    reference_together_s: float | None = None
    """Real processes, ``units``: the same units timed with every rank at once, added up over the ranks."""


def _first_replica(plan: Plan, everyone: Sequence[RankResult]) -> Sequence[RankResult]:
    """Replicas run the same stages: the first replica's ranks, in pipeline order, stand for them."""
    return [everyone[d] for d in plan.mesh.devices[0]] if plan.mesh is not None else everyone


def measured_from_ranks(plan: Plan, everyone: Sequence[RankResult]) -> MeasuredRun:
    """The plan's stages, ranks and iteration from every rank's raw samples (their medians)."""
    results = _first_replica(plan, everyone)
    fwd, bwd = [0.0] * plan.num_stages, [0.0] * plan.num_stages
    memory: list[MemoryBreakdown | None] = [None] * plan.num_stages
    for res in results:
        for k, s in enumerate(res.stage_indices):
            fwd[s], bwd[s] = _stage_times(res.stage_records[k])
            if res.stage_memory:
                memory[s] = as_breakdown(res.stage_memory[k])
    rank_memory = tuple(r.rank_memory.total_bytes for r in results if r.rank_memory is not None)
    allocated = tuple(r.device_allocated_bytes for r in results if r.device_allocated_bytes is not None)
    reserved = tuple(r.device_reserved_bytes for r in results if r.device_reserved_bytes is not None)
    measured = max(_median(r.iteration_s) for r in everyone)
    busy = tuple(_median(r.busy_s) for r in results)
    tails = predicted_tails(plan)
    rank_times = tuple(_rank_time(plan, r, res, tails) for r, res in enumerate(results))
    warmed, timed = everyone[0].warmup_steps, everyone[0].timed_steps
    reference, kind = _speed_reference(results, everyone)
    together = None
    if kind == "units" and all(r.reference_together_s for r in results):
        together = sum(r.reference_together_s or 0.0 for r in results)
    return MeasuredRun(
        fwd,
        bwd,
        memory,
        measured,
        busy,
        rank_times,
        warmed,
        timed,
        reference,
        rank_memory,
        allocated,
        reserved,
        kind,
        together,
    )


def _speed_reference(results: Sequence[RankResult], everyone: Sequence[RankResult]) -> tuple[float | None, str]:
    """The run's speed reference and what it timed: where every rank of the pipeline timed its own units, their
    sum (the same units as the profile's unit sum at this size, each timed alone as the profile timed it); else
    the median of the ranks' reference layers."""
    if results and all(r.reference == "units" and r.reference_s for r in results):
        return sum(r.reference_s or 0.0 for r in results), "units"
    references = [r.reference_s for r in everyone if r.reference_s and r.reference == "layer"]
    return (statistics.median(references) if references else None), "layer"


def build_report(
    plan: Plan,
    chosen: str,
    m: MeasuredRun,
    tolerance: float,
    memory_tolerance: float,
    numerics: NumericsReport | None = None,
    *,
    world_size: int | None = None,
    job: JobReport | None = None,
) -> VerifyReport:
    """``m`` held against ``plan``'s predictions, with the iteration at the machine's speed where the speed
    reference was timed. ``chosen``: the mode it ran in (the processes' times scale with the machine's speed in
    ``processes`` and ``torchrun``)."""
    stages = tuple(
        StageReport(
            s.index,
            s.rank,
            s.forward_s,
            s.backward_s,
            m.forward_s[s.index],
            m.backward_s[s.index],
            predicted_memory=s.memory_bytes,
            measured_memory=m.memory[s.index],
            capacity_bytes=stage_capacity_bytes(plan, s.index),
        )
        for s in plan.stages
    )
    profiled = plan.profile_unit_sum_s if m.reference == "units" else plan.profile_reference_s
    adjusted = None
    learned = plan.learned_together_ratio
    if m.reference_s and profiled:
        speed = m.reference_s / profiled
        if m.reference_together_s and learned:
            # The ranks' contention now against when the co-location factor was learned (docs/cost-model.md).
            speed *= contention_change(m.reference_together_s / m.reference_s, learned)
        # Replay measures the stages alone and keeps the plan's runtime terms: only the stages scale there.
        terms = plan.predicted.runtime
        scaled = terms.at_speed(speed) if chosen != "replay" else terms
        adjusted = plan.simulation(scaled, speed=speed).iteration_s
    return VerifyReport(
        mode=chosen,
        schedule=plan.schedule,
        num_ranks=plan.num_ranks,
        num_microbatches=schedule_microbatches(plan),
        steps=m.timed_steps,
        warmup=m.warmup_steps,
        tolerance=tolerance,
        predicted_iteration_s=plan.predicted.iteration_s,
        measured_iteration_s=m.iteration_s,
        busy_s=m.busy_s,
        stages=stages,
        memory_kind="live-tensors",
        memory_tolerance=memory_tolerance,
        rank_memory_bytes=m.rank_memory_bytes,
        device_allocated_bytes=m.device_allocated_bytes,
        device_reserved_bytes=m.device_reserved_bytes,
        numerics=numerics,
        optimizer=str(plan.constraints.get("optimizer", "adam")),
        ranks=m.ranks,
        reference_s=m.reference_s,
        profile_reference_s=profiled,
        reference=m.reference,
        speed_adjusted_iteration_s=adjusted,
        reference_together_s=m.reference_together_s,
        learned_together_ratio=learned,
        world_size=world_size,
        job=job,
    )


def as_breakdown(sample: MemorySample) -> MemoryBreakdown:
    """A measured sample in the plan's parts: weights are ``params``, the peak the sample's total."""
    return MemoryBreakdown(
        params=sample.weights_bytes,
        grads=sample.grads_bytes,
        optimizer=sample.optimizer_bytes,
        activations=sample.activations_bytes,
        transient=sample.transient_bytes,
        peak=sample.total_bytes,
        buffers=sample.buffers_bytes,
    )


def stage_capacity_bytes(plan: Plan, stage: int) -> float | None:
    """The memory the plan was made for, a stage's share: its rank's device memory (``constraints.
    device_memory_bytes``, ``--memory`` / ``--device-memory``) over the stages the rank holds; None if not
    recorded. The plan keeps its stages within the usable part (less the headroom) of it by the tensors it
    predicts; the run must stay within it by the tensors it holds."""
    memory = plan.constraints.get("device_memory_bytes")
    rank = plan.stages[stage].rank
    if not isinstance(memory, list) or not memory:
        return None
    total = memory[rank] if len(memory) > 1 and rank < len(memory) else memory[0]
    return float(total) / len(plan.stages_of_rank(rank))


def predicted_tails(plan: Plan) -> tuple[float, ...]:
    """Per rank, the predicted step tail as verify measures it: from the rank's last action to the end of
    its optimizer step, so that a rank of a tied pair that finishes first includes its wait in the
    all-reduce (the simulator starts the pair's tails together)."""
    pred = plan.predicted
    if not pred.runtime.tail_groups:
        return pred.runtime.step_tail_s
    tails = [0.0] * plan.num_ranks
    for action in plan.simulation().actions:
        if action.kind == "S":
            tails[action.rank] = action.end_s - action.start_s
    return tuple(tails)


def _rank_time(plan: Plan, rank: int, result: RankResult, tails: tuple[float, ...]) -> RankTime:
    pred = plan.predicted
    compute = pred.busy_s[rank] if rank < len(pred.busy_s) else 0.0
    overhead = pred.overhead_s[rank] if rank < len(pred.overhead_s) else 0.0
    tail = tails[rank] if rank < len(tails) else 0.0
    # Per step, the rest of this rank's own time (to the end of its optimizer step; the barrier after it
    # only waits for the slowest rank) once compute, waits and the step tail are taken out.
    rest = [
        mine - b - w - t
        for mine, b, w, t in zip(result.own_s, result.busy_s, result.wait_s, result.tail_s, strict=True)
    ]
    return RankTime(
        rank=rank,
        predicted_compute_s=compute,
        predicted_wait_s=max(0.0, pred.iteration_s - compute - overhead - tail),
        predicted_tail_s=tail,
        predicted_overhead_s=overhead,
        measured_compute_s=_median(result.busy_s),
        measured_wait_s=_median(result.wait_s),
        measured_tail_s=_median(result.tail_s),
        measured_overhead_s=max(0.0, _median(rest)),
    )


class _ReplayTimeout(Exception):
    """Raised in the main thread by the replay's timer."""


@contextmanager
def _deadline(timeout_s: float) -> Iterator[None]:
    """Stop a replay after ``timeout_s`` like the processes mode stops its ranks (main thread only: SIGALRM).

    A hung model in Python code is interrupted at once; one stuck inside a single native op, when it returns.
    """
    if threading.current_thread() is not threading.main_thread() or not timeout_s > 0:
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise _ReplayTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    except _ReplayTimeout:
        raise ExecutionError(f"the replay did not finish within {timeout_s:g} s (--timeout)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _merge_rank_grads(per_rank: list[dict[str, torch.Tensor]], tied: list[tuple[str, ...]]) -> dict[str, torch.Tensor]:
    # Tied copies were already summed by sync_tied_grads, so any copy holds the model's gradient,
    # and it stands for every name of the tied parameter.
    merged: dict[str, torch.Tensor] = {}
    for grads in per_rank:
        merged.update(grads)
    for names in tied:
        present = next((merged[n] for n in names if n in merged), None)
        if present is not None:
            merged.update({n: present for n in names if n not in merged})
    return merged
