"""What a plan is predicted to do: the times of a partition, the runtime terms it runs with, and the
simulated iteration a plan records (:func:`prediction_of`, the plan format's :class:`~planner.plan.Prediction`);
and the same for an existing plan under other settings (another calibration: ``tune`` and the fidelity
benchmark hold several models against one run).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.cost import (
    CostSettings,
    MemoryBreakdown,
    UnitCosts,
    build_problem,
    split_backward_times,
    stage_memory,
    unit_costs,
)
from planner.errors import UsageError
from planner.plan import Plan, Prediction
from planner.schedule.orders import Schedule, stage_to_rank
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, SimulationResult, in_flight_per_stage, simulate
from planner.step_tails import step_tails, tail_groups
from profiles.format import Profile
from solvers.problem import PartitionProblem, PartitionSolution, evaluate, stage_cost

__all__ = [
    "prediction_of",
    "predict_plan",
    "plan_pipeline",
    "plan_memory",
    "repredicted_plan",
    "partition_pipeline",
    "partition_runtime_terms",
    "partition_stage_times",
    "partition_split_times",
    "partition_comm_times",
    "partition_peak_memory",
]


def partition_split_times(
    costs: UnitCosts, problem: PartitionProblem, solution: PartitionSolution, schedule: Schedule | None
) -> tuple[list[float], list[float]]:
    """Per stage ``(I, W)`` for a split-backward schedule (None: whatever the schedule) with a measured split,
    else ``([], [])``."""
    if schedule is not None and not schedule.splits_backward:
        return [], []
    forward, backward = partition_stage_times(problem, solution)
    return split_backward_times(
        costs,
        solution.stage_units(problem.num_units),
        forward,
        backward,
        solution.recompute,
        problem.speed,
    )


def partition_stage_times(problem: PartitionProblem, solution: PartitionSolution) -> tuple[list[float], list[float]]:
    forward, backward = [], []
    for s, units in enumerate(solution.stage_units(problem.num_units)):
        speed = problem.speed[s] if problem.speed else 1.0
        f = sum(problem.forward_s[u] for u in units)
        b = sum(problem.backward_s[u] for u in units) + (f if solution.recompute[s] else 0.0)
        forward.append(f / speed)
        backward.append(b / speed)
    return forward, backward


def _cuts(solution: PartitionSolution) -> list[int]:
    """The unit after which each stage but the last ends: the cuts the partition's links cross."""
    return [b - 1 for b in solution.boundaries[1:]]


def partition_comm_times(problem: PartitionProblem, solution: PartitionSolution) -> tuple[list[float], list[float]]:
    cuts = _cuts(solution)
    forward = [problem.cut_forward_s[c] if problem.cut_forward_s else 0.0 for c in cuts]
    backward = [problem.cut_backward_s[c] if problem.cut_backward_s else 0.0 for c in cuts]
    return forward, backward


def partition_runtime_terms(
    profile: Profile,
    costs: UnitCosts,
    settings: CostSettings,
    problem: PartitionProblem,
    solution: PartitionSolution,
    schedule: Schedule,
    num_ranks: int,
    micro_batch_size: int,
) -> RuntimeTerms | None:
    """The calibration's terms, the profile's cost of resuming after a wait, and the replicas' gradient
    synchronisation for this partition (None with neither: the textbook model of one pipeline)."""
    if settings.calibration is None and settings.data_parallel is None:
        return None
    stage_rank = stage_to_rank(schedule, problem.num_stages, num_ranks)
    tails = step_tails(profile, costs, settings, solution.stage_units(problem.num_units), stage_rank)
    if settings.calibration is None:
        return RuntimeTerms(step_tail_s=tails)
    groups = tail_groups(profile, solution.stage_units(problem.num_units), stage_rank)
    terms = settings.calibration.runtime_terms(
        schedule, tails, groups, problem.num_stages // num_ranks, problem.num_microbatches, micro_batch_size
    )
    if profile.resume is None:
        return terms
    return replace(terms, resume=profile.resume.curve(profile.size_index(micro_batch_size)))


def partition_pipeline(
    costs: UnitCosts,
    problem: PartitionProblem,
    solution: PartitionSolution,
    schedule: Schedule,
    num_ranks: int,
    runtime: RuntimeTerms | None = None,
) -> Pipeline:
    forward, backward = partition_stage_times(problem, solution)
    comm_forward, comm_backward = partition_comm_times(problem, solution)
    inputs, weights = partition_split_times(costs, problem, solution, schedule)
    cuts = _cuts(solution)
    return Pipeline(
        schedule=schedule,
        num_ranks=num_ranks,
        num_microbatches=problem.num_microbatches,
        forward_s=forward,
        backward_s=backward,
        input_s=inputs,
        weight_s=weights,
        comm_forward_s=comm_forward,
        comm_backward_s=comm_backward,
        runtime=runtime,
        cut_forward_bytes=tuple(costs.cut_bytes[c] for c in cuts),
        cut_backward_bytes=tuple(costs.cut_grad_bytes[c] for c in cuts),
    )


def partition_peak_memory(problem: PartitionProblem, solution: PartitionSolution) -> float:
    units = solution.stage_units(problem.num_units)
    return max(stage_cost(problem, s, r[0], r[-1], solution.recompute[s]).memory_bytes for s, r in enumerate(units))


def prediction_of(
    simulation: SimulationResult,
    settings: CostSettings,
    runtime: RuntimeTerms | None,
    *,
    formula_s: float,
    global_batch_size: int,
    num_microbatches: int,
    comm: tuple[tuple[float, ...], tuple[float, ...]],
) -> Prediction:
    """The prediction a plan records: the simulated iteration and the runtime terms it was simulated with,
    so that ``simulate PLAN`` and ``verify`` reproduce it, and every schedule's overhead at its micro-batch count
    under the same calibration, so that ``simulate PLAN --compare`` ranks the others as ``plan`` did."""
    runtime_fields: dict[str, Any] = {}
    if runtime is not None:
        cal = settings.calibration
        runtime_fields = {
            "calibration": settings.calibration_label,
            "schedule_overhead_s": {
                s.value: (cal.overhead_for(s, 1, num_microbatches), cal.overhead_for(s, 2, num_microbatches))
                for s in Schedule
            }
            if cal is not None
            else {},
            # The simulator ends every rank with its tail, zero where none was given.
            "runtime": replace(runtime, step_tail_s=tuple(simulation.step_tail_s)),
            "overhead_s": tuple(simulation.overhead_s),
            "comm_wait_s": tuple(simulation.comm_wait_s),
        }
    return Prediction(
        iteration_s=simulation.iteration_s,
        formula_iteration_s=formula_s,
        bubble_fraction=simulation.bubble_fraction,
        samples_per_s=global_batch_size / simulation.iteration_s,
        bottleneck_stage=simulation.bottleneck_stage,
        busy_s=tuple(simulation.busy_s),
        comm_forward_s=comm[0],
        comm_backward_s=comm[1],
        **runtime_fields,
    )


def predict_plan(profile: Profile, plan: Plan, settings: CostSettings) -> SimulationResult:
    """Simulate an existing plan's partition under other settings (:func:`plan_pipeline`)."""
    return simulate(plan_pipeline(profile, plan, settings))


def _plan_problem(
    profile: Profile, plan: Plan, settings: CostSettings
) -> tuple[UnitCosts, PartitionProblem, tuple[int, ...]]:
    """An existing plan's partition problem under ``settings``, and its boundaries (a CPU profile at the
    threads each of the plan's ranks has)."""
    profile = profile.for_ranks(plan.threads_ranks)
    names = [u.name for u in profile.units]
    try:
        boundaries = tuple(names.index(s.units[0]) for s in plan.stages)
    except ValueError:
        raise UsageError(
            f"the plan's units are not the profile's (plan for {plan.model_name}, profile of {profile.model.name})"
        ) from None
    costs = unit_costs(profile, plan.micro_batch_size)
    problem = build_problem(
        profile,
        costs,
        settings,
        num_stages=plan.num_stages,
        num_microbatches=plan.num_microbatches,
        in_flight=in_flight_per_stage(plan.schedule, plan.num_stages, plan.num_microbatches, plan.num_ranks),
        stage_rank=stage_to_rank(plan.schedule, plan.num_stages, plan.num_ranks),
        recompute_choices=(False, True),
        schedule=plan.schedule,
    )
    return costs, problem, boundaries


def plan_memory(profile: Profile, plan: Plan, settings: CostSettings) -> tuple[MemoryBreakdown, ...]:
    """Each stage's memory at its peak for an existing plan's partition under ``settings`` (the cost model as it
    stands, e.g. for a plan written by hand or costed under other settings)."""
    costs, problem, boundaries = _plan_problem(profile, plan, settings)
    ends = (*boundaries[1:], problem.num_units)
    return tuple(
        stage_memory(profile, settings, problem, costs, s, first, end - 1, plan.stages[s].recompute)
        for s, (first, end) in enumerate(zip(boundaries, ends, strict=True))
    )


def plan_pipeline(profile: Profile, plan: Plan, settings: CostSettings) -> Pipeline:
    """An existing plan's partition as a pipeline under other settings (e.g. another calibration).

    The plan's schedule, micro-batching, boundaries and recomputation are kept; the cost model and the
    runtime terms come from ``settings``. ``tune`` and the fidelity benchmark use it to hold several
    models of cost against the same measured run.
    """
    costs, problem, boundaries = _plan_problem(profile, plan, settings)
    recompute = tuple(s.recompute for s in plan.stages)
    objective, bottleneck = evaluate(problem, boundaries, recompute)
    solution = PartitionSolution(boundaries, recompute, objective, bottleneck, solver="given")
    runtime = partition_runtime_terms(
        profile, costs, settings, problem, solution, plan.schedule, plan.num_ranks, plan.micro_batch_size
    )
    return partition_pipeline(costs, problem, solution, plan.schedule, plan.num_ranks, runtime)


def repredicted_plan(profile: Profile, plan: Plan, settings: CostSettings) -> Plan:
    """``plan`` with its prediction (and the calibration it records) recomputed under ``settings``."""
    pipeline = plan_pipeline(profile, plan, settings)
    old = plan.predicted
    prediction = prediction_of(
        simulate(pipeline),
        settings,
        pipeline.runtime,
        formula_s=old.formula_iteration_s,
        global_batch_size=plan.global_batch_size,
        num_microbatches=plan.num_microbatches,
        comm=(old.comm_forward_s, old.comm_backward_s),
    )
    constraints = {**plan.constraints, "calibration": settings.calibration_label}
    return replace(plan, predicted=prediction, constraints=constraints)
