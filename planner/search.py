"""The planner's outer search: every micro-batch size, schedule and recomputation choice.

For each candidate (micro-batch size b with M = B / b, schedule, virtual stages) the cost model builds
a partition problem, an exact solver (solvers.dp or solvers.ilp) returns its best partitions for the
declared objective, and the schedule simulator scores each of them; the plan with the shortest
simulated iteration wins; among the plans within ``NEAR_BEST`` of it, the one whose ranks are most evenly
used, then the one with the least peak memory (then the order candidates are listed in).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from planner.assemble import Candidate, build_plan
from planner.bounds import (
    candidate_floor_s,
    order_ceiling_s,
    order_floor_s,
    partition_floor_s,
    partition_order_floor_s,
)
from planner.cost import (
    UnitCosts,
    build_problem,
    unit_costs,
)
from planner.errors import (
    PlanInfeasibleError,
    ScheduleError,
    SearchPrunedError,
    UnexplainedInfeasibleError,
    UsageError,
)
from planner.formatting import human_bytes
from planner.plan import BaselinePlan, Plan, SolverInfo
from planner.prediction import (
    partition_peak_memory,
    partition_pipeline,
    partition_runtime_terms,
    partition_split_times,
    partition_stage_times,
)
from planner.request import PlanRequest, pinned_units
from planner.schedule.orders import Schedule, check_microbatches, stage_to_rank
from planner.schedule.simulate import RuntimeTerms, SimulationResult, in_flight_per_stage, simulate
from profiles.format import Profile
from solvers.baselines import balanced_by_params, balanced_by_time, uniform_by_count
from solvers.dp import smallest_plan_bytes, solve_dp
from solvers.even import balance_ranks, solve_even
from solvers.problem import Moment, PartitionProblem, PartitionSolution, evaluate, stage_cost, stage_moments

__all__ = [
    "PlanRequest",
    "Candidate",
    "make_plan",
    "make_plans",
    "explain_infeasible",
    "estimate_step_s",
    "plan_key",
    "OBJECTIVE",
    "NEAR_BEST",
    "recompute_choices",
    "baselines_for",
]

OBJECTIVE = "sum_s (c_s + k_s) + (M - 1) * max_s c_s"
_AUTO_SCHEDULES = tuple(s for s in Schedule if s is not Schedule.NAIVE)
NEAR_BEST = 0.01
"""Plans simulated within this fraction of the fastest count as equally fast: among them the planner takes
the one with the most evenly used ranks, then the least peak memory (a plan 0.1 % faster that leaves a
rank nearly idle, or holds more activations, is not worth it: the simulator is not that exact)."""


def _micro_batch_sizes(profile: Profile, request: PlanRequest) -> list[int]:
    if request.micro_batch_size is not None:
        profile.size_index(request.micro_batch_size)
        if request.global_batch_size % request.micro_batch_size:
            raise UsageError(
                f"global batch {request.global_batch_size} is not divisible by micro-batch size "
                f"{request.micro_batch_size}"
            )
        return [request.micro_batch_size]
    sizes = [b for b in profile.micro_batch_sizes if request.global_batch_size % b == 0]
    if not sizes:
        raise UsageError(
            f"global batch {request.global_batch_size} is not divisible by any profiled micro-batch size "
            f"({', '.join(map(str, profile.micro_batch_sizes))}): choose a multiple of one of them"
        )
    return sorted(sizes)


def _schedules(
    profile: Profile, request: PlanRequest, num_microbatches: int, refusals: list[str]
) -> list[tuple[Schedule, int]]:
    """(schedule, virtual stages) options that torch accepts for this micro-batch count.

    ``auto`` leaves out the split-backward schedules when the profile did not measure the split: their
    advantage is the split, and guessing it would decide the plan on a guess.
    """
    measured = all(u.has_split for u in profile.units)
    auto = request.auto_schedules or _AUTO_SCHEDULES
    wanted = auto if request.schedule is None else (request.schedule,)
    options: list[tuple[Schedule, int]] = []
    for schedule in wanted:
        if request.schedule is None and schedule.splits_backward and not measured:
            continue
        counts = schedule.virtual_stage_choices if schedule.v_shape or request.num_ranks > 1 else (1,)
        for v in counts:
            if request.num_ranks * v > profile.num_units:
                continue
            try:
                check_microbatches(schedule, request.num_ranks, v, num_microbatches)
            except ScheduleError as exc:
                refusals.append(f"{exc}; global batch {request.global_batch_size}")
                continue
            options.append((schedule, v))
    return options


def recompute_choices(request: PlanRequest) -> tuple[bool, ...]:
    return {"auto": (False, True), "on": (True,), "off": (False,)}[request.recompute]


def _use_ilp(request: PlanRequest) -> bool:
    if request.solver != "auto":
        return request.solver == "ilp"
    return bool(request.settings.device_speeds or request.max_units_per_stage)


def _solve(problem: PartitionProblem, request: PlanRequest) -> list[PartitionSolution]:
    if _use_ilp(request):
        from solvers.ilp import solve_ilp  # here, not at the top: pulp is imported only by a plan that asks for the ILP

        return [solve_ilp(problem, time_limit_s=request.ilp_time_limit_s)]
    solutions = solve_dp(problem, top_k=request.top_k)
    # The most even partition under the best one's bottleneck (solvers/even.py): same objective bound,
    # ranks more evenly used; the simulator judges it with the others.
    even = solve_even(problem, solutions[0].bottleneck_s)
    if even is not None and all(even.boundaries != s.boundaries for s in solutions):
        solutions.append(even)
    return solutions


@dataclass(frozen=True)
class _Option:
    """One (micro-batch size, schedule, stages per rank) to solve, with the floor no partition beats."""

    order: int
    micro_batch_size: int
    num_microbatches: int
    schedule: Schedule
    virtual_stages: int
    costs: UnitCosts
    floor_s: float


def _floor_factor(request: PlanRequest, micro_batch_size: int) -> float:
    """Floors are at full speed on the fastest device, each action's compute scaled as the simulator scales it:
    by the co-location factor at this micro-batch size in a pipeline of two or more ranks."""
    cal = request.settings.calibration
    scale = cal.colocation_for(micro_batch_size) if cal is not None and request.num_ranks > 1 else 1.0
    return scale / max(request.settings.device_speeds, default=1.0)


def _options(profile: Profile, request: PlanRequest, refusals: list[str]) -> list[_Option]:
    found: list[_Option] = []
    for b in _micro_batch_sizes(profile, request):
        m = request.global_batch_size // b
        costs = unit_costs(profile, b)
        factor = _floor_factor(request, b)
        for schedule, v in _schedules(profile, request, m, refusals):
            work = costs.split_work if schedule.splits_backward else costs.work
            floor = candidate_floor_s(work, m, request.num_ranks, request.num_ranks * v) * factor
            found.append(_Option(len(found), b, m, schedule, v, costs, floor))
    return found


def estimate_step_s(profile: Profile, request: PlanRequest) -> float:
    """A guess at the best step, for ordering searches (never for pruning): each option's floor times the
    textbook bubble ``1 + (P - 1) / (v M)`` (Narayanan et al., SC 2021, Sec. 2.2), the least over options;
    inf when no schedule accepts the micro-batch counts."""
    refusals: list[str] = []
    p = request.num_ranks
    options = _options(profile, request, refusals)
    return min((o.floor_s * (1 + (p - 1) / (o.virtual_stages * o.num_microbatches)) for o in options), default=math.inf)


def _order_floor_s(option: _Option, request: PlanRequest, beat_s: float) -> float:
    """The option's floor under its schedule's rank orders (planner/bounds.py, fact 4): a linear programme,
    so asked only of an option the cheap floors left to solve; 0 (no floor) on one rank, where fact 1 is it, and
    where the programme's value at equal stages (its ceiling) is no higher than ``beat_s``, so that its optimum
    could not prune."""
    p = request.num_ranks
    if p == 1:
        return 0.0
    costs = option.costs
    factor = _floor_factor(request, option.micro_batch_size)
    programme = (
        option.schedule,
        p,
        p * option.virtual_stages,
        option.num_microbatches,
        costs.forward_s,
        costs.backward_s,
    )
    if order_ceiling_s(*programme) * factor <= beat_s:
        return 0.0
    return order_floor_s(*programme) * factor


def _partition_floor_s(
    costs: UnitCosts,
    problem: PartitionProblem,
    solution: PartitionSolution,
    option: _Option,
    stage_rank: tuple[int, ...],
    runtime: RuntimeTerms | None,
) -> float:
    forward, backward = partition_stage_times(problem, solution)
    inputs, weights = partition_split_times(costs, problem, solution, option.schedule)
    if inputs:
        work = [f + min(b, i + w) for f, b, i, w in zip(forward, backward, inputs, weights, strict=True)]
        chain = forward
    else:
        work = chain = [f + b for f, b in zip(forward, backward, strict=True)]
    terms = runtime or RuntimeTerms()
    facts = {
        "compute_scale": terms.compute_scale,
        "action_overhead_s": terms.action_overhead_s,
        "step_tail_s": terms.step_tail_s,
    }
    ranks = max(stage_rank) + 1
    m = option.num_microbatches
    # Fact 4 at the partition is the tighter (within 2 % of the simulation on the 2,000-unit benchmark, where
    # facts 1-3 leave 8-15 %), and a few milliseconds against a simulation's tens.
    return max(
        partition_floor_s(work, chain, stage_rank, m, stage_forward_s=forward, **facts),
        partition_order_floor_s(option.schedule, ranks, m, forward, backward, **facts),
    )


def _partitions(
    problem: PartitionProblem, request: PlanRequest, stage_rank: tuple[int, ...], v: int
) -> list[PartitionSolution]:
    """The partitions the simulator judges for one option ([] when none fits)."""
    try:
        solutions = _solve(problem, request)
    except PlanInfeasibleError:
        return []
    if v > 1 and not _use_ilp(request):
        # Several stages per rank: balance what a rank holds, not each stage (solvers/even.py).
        rebalanced = [balance_ranks(problem, s, stage_rank) for s in solutions]
        known = {s.boundaries for s in solutions}
        solutions += [r for r in rebalanced if r is not None and r.boundaries not in known]
    return solutions


_Held = tuple[tuple[Moment, ...], ...]


def _held(problem: PartitionProblem) -> _Held:
    return tuple(stage_moments(problem, s) for s in range(problem.num_stages))


def _holds_no_more(theirs: _Held, mine: _Held) -> bool:
    """Whether every stage's every moment of ``theirs`` is covered by one of ``mine`` (:meth:`Moment.covers`)."""
    return all(all(any(a.covers(b) for a in ours) for b in them) for them, ours in zip(theirs, mine, strict=True))


def _reused(
    solved: list[tuple[_Held, list[PartitionSolution]]], problem: PartitionProblem
) -> list[PartitionSolution] | None:
    """Partitions found for the same problem holding no more on any stage at any moment, when every one of
    them also fits ``problem``'s memory (None: solve it). Its feasible set is a subset of theirs, so their
    optimum, lying in it, is its optimum; and where theirs had none, it has none."""
    held = _held(problem)
    for theirs, solutions in solved:
        if not _holds_no_more(theirs, held):
            continue
        if all(evaluate(problem, s.boundaries, s.recompute)[0] < math.inf for s in solutions):
            return list(solutions)
    return None


@dataclass
class _Found:
    candidates: list[Candidate] = field(default_factory=list)
    infeasible: list[str] = field(default_factory=list)
    """The (b, schedule, v) that no partition fits."""
    refusals: list[str] = field(default_factory=list)
    """The schedules torch refuses."""
    pruned: int = 0
    """Options and partitions skipped: their floor (planner/bounds.py) is above what was to beat."""


def _search(profile: Profile, request: PlanRequest, prune_above_s: float | None) -> _Found:
    """Solve and simulate every option; with ``prune_above_s`` (None: keep all) skip the options and
    partitions that cannot come within ``NEAR_BEST`` of it or of the fastest found so far, which leaves
    the plan chosen unchanged (cheapest floors first, then back in the order listed)."""
    found = _Found()
    fastest = math.inf if prune_above_s is None else prune_above_s
    # Problems that differ only in the micro-batches held (interleaved 1F1B and looped BFS at the same v
    # place stages alike): their partitions, by in-flight counts held, each solved once where it can be.
    solved: dict[PartitionProblem, list[tuple[_Held, list[PartitionSolution]]]] = {}
    placed: list[tuple[tuple[int, int], Candidate]] = []

    def cannot_win(floor_s: float) -> bool:
        if prune_above_s is None or floor_s <= fastest * (1 + NEAR_BEST):
            return False
        found.pruned += 1
        return True

    for option in sorted(_options(profile, request, found.refusals), key=lambda o: (o.floor_s, o.order)):
        if cannot_win(option.floor_s):
            continue
        # Before the partition problem and its solve: the orders' floor holds for every partition of the option
        # (a linear programme, so only once there is a step to beat).
        if math.isfinite(fastest) and cannot_win(_order_floor_s(option, request, fastest * (1 + NEAR_BEST))):
            continue
        b, m, schedule, v, costs = (
            option.micro_batch_size,
            option.num_microbatches,
            option.schedule,
            option.virtual_stages,
            option.costs,
        )
        num_stages = request.num_ranks * v
        stage_rank = stage_to_rank(schedule, num_stages, request.num_ranks)
        problem = build_problem(
            profile,
            costs,
            request.settings,
            num_stages=num_stages,
            num_microbatches=m,
            in_flight=in_flight_per_stage(schedule, num_stages, m, request.num_ranks),
            stage_rank=stage_rank,
            recompute_choices=recompute_choices(request),
            pinned=pinned_units(profile, request, v) if request.pinned else (),
            max_units_per_stage=request.max_units_per_stage,
            schedule=schedule,
        )
        shape = replace(problem, in_flight=(), moments=())
        solutions = _reused(solved.get(shape, []), problem)
        if solutions is None:
            solutions = _partitions(problem, request, stage_rank, v)
            solved.setdefault(shape, []).append((_held(problem), solutions))
        if not solutions:
            found.infeasible.append(f"b={b} {schedule.value} v={v}")
            continue
        for k, solution in enumerate(solutions):
            runtime = partition_runtime_terms(
                profile, costs, request.settings, problem, solution, schedule, request.num_ranks, b
            )
            if prune_above_s is not None and cannot_win(
                _partition_floor_s(costs, problem, solution, option, stage_rank, runtime)
            ):
                continue
            pipeline = partition_pipeline(costs, problem, solution, schedule, request.num_ranks, runtime)
            simulation = simulate(pipeline, keep_actions=False)
            fastest = min(fastest, simulation.iteration_s)
            peak = partition_peak_memory(problem, solution)
            candidate = Candidate(b, m, schedule, v, problem, solution, simulation, peak, runtime)
            placed.append(((option.order, k), candidate))
    found.candidates = [c for _, c in sorted(placed, key=lambda p: p[0])]
    return found


def _least_memory_problem(profile: Profile, request: PlanRequest) -> tuple[PartitionProblem, int, Schedule, int]:
    """The search's most lenient problem for memory: the smallest micro-batch size, recomputation on every stage,
    under the requested schedule at its fewest stages per rank (1F1B, the fewest micro-batches held of every
    schedule on one stage per rank, when none is asked or the micro-batches do not suit it). Also its micro-batch
    size, schedule and stages per rank."""
    b = min(_micro_batch_sizes(profile, request))
    m = request.global_batch_size // b
    p = request.num_ranks
    schedule, v = Schedule.ONE_F_ONE_B, 1
    if request.schedule is not None and p > 1:
        asked = request.schedule
        fewest = min(asked.virtual_stage_choices) if asked.multi_stage else 1
        try:
            check_microbatches(asked, p, fewest, m)
            schedule, v = asked, fewest
        except ScheduleError:
            pass
    problem = build_problem(
        profile,
        unit_costs(profile, b),
        request.settings,
        num_stages=p * v,
        num_microbatches=m,
        in_flight=in_flight_per_stage(schedule, p * v, m, p),
        stage_rank=stage_to_rank(schedule, p * v, p),
        recompute_choices=(True,),
        schedule=schedule,
    )
    return problem, b, schedule, v


def explain_infeasible(profile: Profile, request: PlanRequest) -> str:
    """One line: what the smallest plan needs per device against what is usable, and what would help (``profile``
    as :func:`make_plans` searched it, for ``request.num_ranks``)."""
    problem, b, schedule, v = _least_memory_problem(profile, request)
    p = request.num_ranks
    capacity = min(problem.capacity_bytes) * v  # a device's: its stages share it
    last = problem.num_stages - 1
    needs = [stage_cost(problem, last, u, u, True).memory_bytes * v for u in range(profile.num_units)]
    worst = max(range(profile.num_units), key=needs.__getitem__)
    unit = profile.units[worst].name
    if needs[worst] > capacity:
        return (
            f"no plan fits: unit {unit} alone needs {human_bytes(needs[worst])} even with recomputation at "
            f"micro-batch {b}, over the {human_bytes(capacity)} usable per device by "
            f"{human_bytes(needs[worst] - capacity)}; use a device with more memory, --optimizer sgd, "
            "or split that unit (--units)"
        )
    least = smallest_plan_bytes(problem) * v
    layout = f"{schedule.value}" + (f", {v} stages a device" if v > 1 else "")
    return (
        f"no plan fits {profile.num_units} units on {p} devices of {human_bytes(capacity)} usable: the smallest "
        f"plan ({layout}, micro-batch {b}, recomputation on every stage) needs {human_bytes(least)} on its fullest "
        f"device (the largest unit, {unit}, {human_bytes(needs[worst])}); use more ranks (--ranks), "
        "a device with more memory, or --optimizer sgd"
    )


def _rank_spread(simulation: SimulationResult) -> float:
    """How unevenly the ranks compute: 1 - least busy / most busy (0: all equal; 1: a rank idle)."""
    most = max(simulation.busy_s)
    return 1.0 - min(simulation.busy_s) / most if most > 0 else 0.0


def _ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Fastest simulated first, except that the plans within ``NEAR_BEST`` of the fastest come first
    ordered by rank spread (rounded to 1 %), then peak memory, then time; then the order found in."""
    fastest = min(c.simulation.iteration_s for c in candidates)

    def key(i: int) -> tuple[object, ...]:
        c = candidates[i]
        time_key = round(c.simulation.iteration_s, 12)
        if c.simulation.iteration_s <= fastest * (1 + NEAR_BEST):
            return (0, round(_rank_spread(c.simulation), 2), c.peak_memory_bytes, time_key, i)
        return (1, 0.0, 0.0, time_key, c.peak_memory_bytes, i)

    return [candidates[i] for i in sorted(range(len(candidates)), key=key)]


def _baseline_schedule(best: Candidate | Plan, num_ranks: int) -> Schedule:
    """The plan's schedule when it is GPipe or 1F1B, else torch's 1F1B (GPipe when M < P): the peers
    keep the schedule they ship with."""
    if best.schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.NAIVE):
        return best.schedule
    return Schedule.ONE_F_ONE_B if best.num_microbatches >= num_ranks else Schedule.GPIPE


def baselines_for(profile: Profile, best: Candidate | Plan, request: PlanRequest) -> list[BaselinePlan]:
    """The partitioners people use today, one stage per rank, at the plan's micro-batching (``best``'s schedule,
    micro-batch size and count: a search's candidate or the plan made of it).

    Each chooses only the boundaries; the same cost model and simulator judge them. They do not
    recompute (unless ``--recompute on``) and do not look at memory, so a baseline may not fit.
    """
    p = request.num_ranks
    schedule = _baseline_schedule(best, p)
    costs = unit_costs(profile, best.micro_batch_size)
    problem = build_problem(
        profile,
        costs,
        request.settings,
        num_stages=p,
        num_microbatches=best.num_microbatches,
        in_flight=in_flight_per_stage(schedule, p, best.num_microbatches, p),
        stage_rank=tuple(range(p)),
        recompute_choices=(request.recompute == "on",),
        schedule=schedule,
    )
    recompute = problem.recompute_choices * p
    times = [f + b for f, b in zip(costs.forward_s, costs.backward_s, strict=True)]
    named = {
        f"uniform-by-count (Megatron/torchtitan), {schedule.value}": uniform_by_count(problem.num_units, p),
        f"balanced-by-params (DeepSpeed 'parameters'), {schedule.value}": balanced_by_params(
            list(costs.param_count), p
        ),
        f"balanced-by-time (torchgpipe balance_by_time), {schedule.value}": balanced_by_time(times, p),
    }
    baselines = []
    for name, boundaries in named.items():
        split_points = tuple(profile.units[i].name for i in boundaries[1:])
        objective, bottleneck = evaluate(problem, tuple(boundaries), recompute)
        solution = PartitionSolution(tuple(boundaries), recompute, objective, bottleneck, solver=name)
        peak = int(partition_peak_memory(problem, solution))
        if objective == float("inf"):
            baselines.append(BaselinePlan(name, split_points, None, fits=False, peak_memory_bytes=peak))
            continue
        b = best.micro_batch_size
        runtime = partition_runtime_terms(profile, costs, request.settings, problem, solution, schedule, p, b)
        simulation = simulate(partition_pipeline(costs, problem, solution, schedule, p, runtime), keep_actions=False)
        baselines.append(BaselinePlan(name, split_points, simulation.iteration_s, True, peak))
    return baselines


def make_plan(
    profile: Profile,
    request: PlanRequest,
    *,
    sha256: str,
    record_timing: bool = False,
    beat_s: float = math.inf,
    with_baselines: bool = True,
    explain: bool = True,
) -> Plan:
    """Search every candidate and return the best simulated plan (raises PlanInfeasibleError).

    Candidates that cannot come within ``NEAR_BEST`` of the fastest (or of ``beat_s``, a step found
    elsewhere, e.g. by another cluster layout) are not simulated (planner/bounds.py); when that leaves
    none, :class:`~planner.errors.SearchPrunedError`. Without ``with_baselines`` the plan's ``baselines`` are
    empty (a cluster search scores them for the winning layout alone: :func:`baselines_for`). Without
    ``explain``, no plan that fits raises :class:`~planner.errors.UnexplainedInfeasibleError` at once, without
    :func:`explain_infeasible`'s search for the smallest plan.
    """
    return make_plans(
        profile,
        request,
        sha256=sha256,
        record_timing=record_timing,
        count=1,
        beat_s=beat_s,
        with_baselines=with_baselines,
        explain=explain,
    )[0]


def plan_key(plan: Plan) -> tuple[object, ...]:
    """What makes two plans different runs: schedule, virtual stages, micro-batching, boundaries, recompute."""
    return (
        plan.schedule,
        plan.virtual_stages,
        plan.micro_batch_size,
        plan.split_points,
        tuple(s.recompute for s in plan.stages),
    )


def make_plans(
    profile: Profile,
    request: PlanRequest,
    *,
    sha256: str,
    count: int,
    record_timing: bool = False,
    beat_s: float = math.inf,
    with_baselines: bool = True,
    explain: bool = True,
) -> list[Plan]:
    """The ``count`` best *distinct* plans (see :func:`plan_key`), fastest simulated first; with ``count`` 1,
    candidates that cannot come within ``NEAR_BEST`` of the fastest or of ``beat_s`` are skipped
    (:func:`make_plan`), and ``with_baselines`` and ``explain`` as there.

    Every plan carries the same search record (solver, candidates, constraints); baselines are scored
    against each plan's own micro-batching.
    """
    if count < 1:
        raise UsageError(f"count must be >= 1, got {count}")
    if request.num_ranks > profile.num_units:
        raise UsageError(
            f"cannot cut {profile.num_units} units into {request.num_ranks} stages: use at most "
            f"{profile.num_units} stages, or profile finer units (--units)"
        )
    started = time.perf_counter()
    profile = profile.for_ranks(request.threads_ranks)  # a CPU profile: the threads each rank will have
    # Only the best plan survives pruning unchanged: the runners-up of `tune` need every candidate.
    found = _search(profile, request, beat_s if count == 1 else None)
    candidates = found.candidates
    if not candidates and found.pruned:
        raise SearchPrunedError(f"no candidate can come within {NEAR_BEST:.0%} of {beat_s:.6g} s")
    if not candidates and not found.infeasible and found.refusals:
        raise ScheduleError(found.refusals[0])
    if not candidates:
        if not explain:
            raise UnexplainedInfeasibleError("no plan fits in memory")
        raise PlanInfeasibleError(explain_infeasible(profile, request))
    ranked = _ranked(candidates)
    solve_s = time.perf_counter() - started
    used_ilp = _use_ilp(request)
    solver = SolverInfo(
        name="ilp" if used_ilp else "dp",
        objective=OBJECTIVE,
        optimal=all(c.solution.optimal for c in candidates),
        solve_s=round(solve_s, 4) if record_timing else None,
        gap=max((c.solution.gap or 0.0) for c in candidates) if used_ilp else 0.0,
        candidates=len(candidates),
    )
    plans: list[Plan] = []
    seen: set[tuple[object, ...]] = set()
    for best in ranked:
        plan = build_plan(
            profile,
            request,
            best,
            solver=solver,
            baselines=tuple(baselines_for(profile, best, request)) if with_baselines else (),
            sha256=sha256,
        )
        if plan_key(plan) not in seen:
            seen.add(plan_key(plan))
            plans.append(plan)
        if len(plans) == count:
            break
    return plans


FEWER_RANKS_BUBBLE = 0.4
"""A plan idle this much of its step is checked against half as many ranks (:func:`fewer_ranks_faster`)."""


def fewer_ranks_faster(profile: Profile, request: PlanRequest, plan: Plan) -> tuple[int, float] | None:
    """``(ranks, iteration)`` of half as many ranks when that is faster than ``plan``, else None: more ranks
    than micro-batches or than the work splits into only add bubble. Checked only for a plan idle more than
    :data:`FEWER_RANKS_BUBBLE` of its step (one more search), without pins (they name stages), and only where the
    profile timed the threads those ranks get (a CPU profile times a single rank's only with ``--ranks 1``)."""
    fewer = request.num_ranks // 2
    if fewer < 1 or request.pinned or plan.predicted.bubble_fraction <= FEWER_RANKS_BUBBLE:
        return None
    if not profile.timed_for_ranks(fewer):
        return None
    try:
        other = make_plan(profile, replace(request, num_ranks=fewer), sha256=plan.profile_sha256)
    except (PlanInfeasibleError, ScheduleError, UsageError):
        return None
    return (fewer, other.predicted.iteration_s) if other.predicted.iteration_s < plan.predicted.iteration_s else None
