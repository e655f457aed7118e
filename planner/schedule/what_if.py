"""What-if pipelines: per-stage times given by hand (``pipeplan simulate --ranks P --micro-batches M``), and
the same pipeline under other schedules (``--compare``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.errors import UsageError
from planner.limits import check_simulation
from planner.schedule.orders import Schedule
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import SimulationResult, simulate

__all__ = ["stages_per_rank", "what_if_pipeline", "compare_schedules"]


def stages_per_rank(schedule: Schedule, given: int | None) -> int:
    """Stages per rank of a what-if: exactly 2 for the V schedules, ``given`` (default
    ``schedule.default_virtual_stages``) for the other multi-stage ones, 1 for the rest."""
    if schedule.v_shape:
        if given not in (None, 2):
            raise UsageError(f"--virtual-stages {given}: schedule {schedule.value} runs exactly 2 stages per rank")
        return 2
    if not schedule.multi_stage:
        if given not in (None, 1):
            raise UsageError(f"--virtual-stages {given}: schedule {schedule.value} runs one stage per rank")
        return 1
    return schedule.default_virtual_stages if given is None else given


def _per_stage(option: str, values: Sequence[float] | None, n_stages: int) -> list[float]:
    """One value per stage; a single value is every stage's."""
    if not values:
        return []
    if len(values) == 1:
        return list(values) * n_stages
    if len(values) != n_stages:
        raise UsageError(f"{option} has {len(values)} values for {n_stages} stages (or give one for all)")
    return list(values)


def what_if_pipeline(
    num_ranks: int,
    num_microbatches: int,
    schedule: Schedule,
    *,
    virtual_stages: int | None = None,
    stage_times: Sequence[float] | None = None,
    backward_times: Sequence[float] | None = None,
    weight_times: Sequence[float] | None = None,
    backward_ratio: float = 2.0,
) -> Pipeline:
    """A pipeline of ``num_ranks`` ranks from per-stage times (one value: every stage's; default 1 s forward,
    ``backward_ratio`` x forward backward). With ``weight_times`` given, ``backward_times`` is the
    input-gradient part I: the full backward is I + W."""
    n_stages = num_ranks * stages_per_rank(schedule, virtual_stages)
    forward = _per_stage("--stage-times", stage_times, n_stages) or [1.0] * n_stages
    backward = _per_stage("--backward-times", backward_times, n_stages) or [backward_ratio * f for f in forward]
    weight = _per_stage("--weight-times", weight_times, n_stages)
    inputs: list[float] = []
    if weight:
        inputs = backward
        backward = [b + w for b, w in zip(backward, weight, strict=True)]
    check_simulation(n_stages, num_microbatches)
    return Pipeline(
        schedule=schedule,
        num_ranks=num_ranks,
        num_microbatches=num_microbatches,
        forward_s=forward,
        backward_s=backward,
        input_s=inputs,
        weight_s=weight,
    )


def compare_schedules(
    pipeline: Pipeline,
    schedules: Sequence[Schedule],
    virtual_stages: int | None = None,
    overhead_of: Callable[[Schedule, int], float | None] | None = None,
) -> list[SimulationResult]:
    """``pipeline``'s per-rank work simulated under each of ``schedules`` (``Pipeline.as_schedule``), with its
    runtime terms and, where ``overhead_of(schedule, stages_per_rank)`` knows it, each schedule's own overhead per
    action; the pipeline's own schedule is simulated as it is."""
    check_simulation(max(pipeline.num_stages, pipeline.num_ranks * (virtual_stages or 2)), pipeline.num_microbatches)
    results = []
    for schedule in schedules:
        if schedule is pipeline.schedule and virtual_stages is None:
            results.append(simulate(pipeline))
            continue
        v = stages_per_rank(schedule, virtual_stages) if schedule.multi_stage else 1
        overhead = overhead_of(schedule, v) if overhead_of is not None else None
        results.append(simulate(pipeline.as_schedule(schedule, v, action_overhead_s=overhead)))
    return results
