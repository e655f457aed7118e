"""The planner's outer search: every micro-batch size, schedule and recomputation choice.

For each candidate (micro-batch size b with M = B / b, schedule, virtual stages) the cost model builds
a partition problem, an exact solver (solvers.dp or solvers.ilp) returns its best partitions for the
declared objective, and the schedule simulator scores each of them; the plan with the shortest
simulated iteration wins; among the plans within ``NEAR_BEST`` of it, the one whose ranks are most evenly
used, then the one with the least peak memory (then the order candidates are listed in).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.bounds import candidate_floor_s, partition_floor_s
from planner.cost import (
    CostSettings,
    UnitCosts,
    build_problem,
    split_backward_times,
    stage_memory,
    step_tails,
    tail_groups,
    unit_costs,
)
from planner.errors import PlanInfeasibleError, ScheduleError, SearchPrunedError, UsageError
from planner.limits import MAX_GLOBAL_BATCH, MAX_RANKS, check_at_most
from planner.plan import BaselinePlan, Plan, Prediction, SolverInfo, StagePlan
from planner.schedule.orders import Schedule, check_microbatches, stage_to_rank
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, SimulationResult, in_flight_per_stage
from profiles.format import Profile
from solvers.baselines import balanced_by_params, balanced_by_time, uniform_by_count
from solvers.dp import solve_dp
from solvers.even import balance_ranks, solve_even
from solvers.ilp import solve_ilp
from solvers.problem import PartitionProblem, PartitionSolution, evaluate, stage_cost

__all__ = [
    "PlanRequest",
    "Candidate",
    "make_plan",
    "make_plans",
    "estimate_step_s",
    "plan_key",
    "predict_plan",
    "repredicted_plan",
    "profile_sha256",
    "OBJECTIVE",
    "NEAR_BEST",
]

OBJECTIVE = "sum_s (c_s + k_s) + (M - 1) * max_s c_s"
_AUTO_SCHEDULES = tuple(s for s in Schedule if s is not Schedule.NAIVE)
NEAR_BEST = 0.01
"""Plans simulated within this fraction of the fastest count as equally fast: among them the planner takes
the one with the most evenly used ranks, then the least peak memory (a plan 0.1 % faster that leaves a
rank nearly idle, or holds more activations, is not worth it: the simulator is not that exact)."""


@dataclass(frozen=True)
class PlanRequest:
    num_ranks: int
    """Pipeline ranks (devices): ``--stages``."""
    global_batch_size: int
    schedule: Schedule | None = None
    """None: search every schedule (``auto``). A name is parsed once, here."""
    micro_batch_size: int | None = None
    """None: search every profiled size that divides the global batch."""
    recompute: str = "auto"
    """auto (chosen per stage), on, off."""
    solver: str = "auto"
    """auto (dp, or ilp when devices differ, units are pinned or stages capped), dp, ilp."""
    settings: CostSettings = field(default_factory=CostSettings)
    pinned: tuple[tuple[str, int], ...] = ()
    """(unit FQN, stage) pairs; ILP only."""
    max_units_per_stage: int | None = None
    top_k: int = 4
    """Partitions per candidate handed from the solver to the simulator."""
    ilp_time_limit_s: float = 60.0

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise UsageError(f"--stages must be >= 1, got {self.num_ranks}")
        if self.global_batch_size < 1:
            raise UsageError(f"--global-batch must be >= 1, got {self.global_batch_size}")
        # The bounds of planner.limits, checked where a request enters (README, "Limits").
        check_at_most("--stages", self.num_ranks, MAX_RANKS)
        check_at_most("--global-batch", self.global_batch_size, MAX_GLOBAL_BATCH)
        check_at_most("--micro-batch-size", self.micro_batch_size or 1, MAX_GLOBAL_BATCH)
        if self.recompute not in ("auto", "on", "off"):
            raise UsageError(f"--recompute must be auto, on or off, got {self.recompute!r}")
        if self.solver not in ("auto", "dp", "ilp"):
            raise UsageError(f"--solver must be auto, dp or ilp, got {self.solver!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise UsageError(f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.max_units_per_stage is not None and self.max_units_per_stage < 1:
            raise UsageError(f"--max-units-per-stage must be >= 1, got {self.max_units_per_stage}")
        if isinstance(self.schedule, str) and not isinstance(self.schedule, Schedule):
            # The Python API's edge: a name becomes the enum once and travels as the enum.
            object.__setattr__(self, "schedule", None if self.schedule == "auto" else Schedule.parse(self.schedule))


@dataclass(frozen=True)
class Candidate:
    micro_batch_size: int
    num_microbatches: int
    schedule: Schedule
    virtual_stages: int
    problem: PartitionProblem
    solution: PartitionSolution
    simulation: SimulationResult
    peak_memory_bytes: float


def profile_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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
    wanted = _AUTO_SCHEDULES if request.schedule is None else (request.schedule,)
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


def _recompute_choices(request: PlanRequest) -> tuple[bool, ...]:
    return {"auto": (False, True), "on": (True,), "off": (False,)}[request.recompute]


def _use_ilp(request: PlanRequest) -> bool:
    if request.solver != "auto":
        return request.solver == "ilp"
    return bool(request.settings.device_speeds or request.pinned or request.max_units_per_stage)


def _split_times(
    costs: UnitCosts, problem: PartitionProblem, solution: PartitionSolution, schedule: Schedule
) -> tuple[list[float], list[float]]:
    """Per stage ``(I, W)`` for a split-backward schedule with a measured split, else ``([], [])``."""
    if not schedule.splits_backward:
        return [], []
    forward, backward = _stage_times(problem, solution)
    return split_backward_times(
        costs,
        solution.stage_units(problem.num_units),
        forward,
        backward,
        solution.recompute,
        problem.speed,
    )


def _stage_times(problem: PartitionProblem, solution: PartitionSolution) -> tuple[list[float], list[float]]:
    forward, backward = [], []
    for s, units in enumerate(solution.stage_units(problem.num_units)):
        speed = problem.speed[s] if problem.speed else 1.0
        f = sum(problem.forward_s[u] for u in units)
        b = sum(problem.backward_s[u] for u in units) + (f if solution.recompute[s] else 0.0)
        forward.append(f / speed)
        backward.append(b / speed)
    return forward, backward


def _comm_times(problem: PartitionProblem, solution: PartitionSolution) -> tuple[list[float], list[float]]:
    cuts = [b - 1 for b in solution.boundaries[1:]]
    forward = [problem.cut_forward_s[c] if problem.cut_forward_s else 0.0 for c in cuts]
    backward = [problem.cut_backward_s[c] if problem.cut_backward_s else 0.0 for c in cuts]
    return forward, backward


def _runtime_terms(
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
    terms = settings.calibration.runtime_terms(schedule, tails, groups)
    if profile.resume is None:
        return terms
    return replace(terms, resume=profile.resume.curve(profile.size_index(micro_batch_size)))


def _pipeline(
    costs: UnitCosts,
    problem: PartitionProblem,
    solution: PartitionSolution,
    schedule: Schedule,
    num_ranks: int,
    runtime: RuntimeTerms | None = None,
) -> Pipeline:
    forward, backward = _stage_times(problem, solution)
    comm_forward, comm_backward = _comm_times(problem, solution)
    inputs, weights = _split_times(costs, problem, solution, schedule)
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
    )


def _peak_memory(problem: PartitionProblem, solution: PartitionSolution) -> float:
    units = solution.stage_units(problem.num_units)
    return max(stage_cost(problem, s, r[0], r[-1], solution.recompute[s]).memory_bytes for s, r in enumerate(units))


def _solve(problem: PartitionProblem, request: PlanRequest) -> list[PartitionSolution]:
    if _use_ilp(request):
        return [solve_ilp(problem, time_limit_s=request.ilp_time_limit_s)]
    solutions = solve_dp(problem, top_k=request.top_k)
    # The most even partition under the best one's bottleneck (solvers/even.py): same objective bound,
    # ranks more evenly used; the simulator judges it with the others.
    even = solve_even(problem, solutions[0].bottleneck_s)
    if even is not None and all(even.boundaries != s.boundaries for s in solutions):
        solutions.append(even)
    return solutions


def _pins(profile: Profile, request: PlanRequest, virtual_stages: int) -> tuple[tuple[int, int], ...]:
    names = [u.name for u in profile.units]
    pins = []
    for name, stage in request.pinned:
        if name not in names:
            raise UsageError(f"cannot pin unknown unit {name!r}")
        if not 0 <= stage < request.num_ranks * virtual_stages:
            raise UsageError(
                f"cannot pin {name} to stage {stage}: stages are 0..{request.num_ranks * virtual_stages - 1}"
            )
        pins.append((names.index(name), stage))
    return tuple(pins)


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


def _options(profile: Profile, request: PlanRequest, refusals: list[str]) -> list[_Option]:
    found: list[_Option] = []
    settings = request.settings
    # Floors at full speed on the fastest device, with the co-location slowdown where it is one.
    cal = settings.calibration
    factor = min(1.0, cal.colocation_factor if cal is not None else 1.0) / max(settings.device_speeds, default=1.0)
    for b in _micro_batch_sizes(profile, request):
        m = request.global_batch_size // b
        costs = unit_costs(profile, b)
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


def _partition_floor_s(
    costs: UnitCosts,
    problem: PartitionProblem,
    solution: PartitionSolution,
    option: _Option,
    stage_rank: tuple[int, ...],
    runtime: RuntimeTerms | None,
) -> float:
    forward, backward = _stage_times(problem, solution)
    inputs, weights = _split_times(costs, problem, solution, option.schedule)
    if inputs:
        work = [f + min(b, i + w) for f, b, i, w in zip(forward, backward, inputs, weights, strict=True)]
        chain = forward
    else:
        work = chain = [f + b for f, b in zip(forward, backward, strict=True)]
    terms = runtime or RuntimeTerms()
    return partition_floor_s(
        work,
        chain,
        stage_rank,
        option.num_microbatches,
        stage_forward_s=forward,
        compute_scale=terms.compute_scale,
        action_overhead_s=terms.action_overhead_s,
        step_tail_s=terms.step_tail_s,
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


def _in_flight(problem: PartitionProblem) -> tuple[int, ...]:
    return problem.in_flight or (problem.num_microbatches,) * problem.num_stages


def _reused(
    solved: list[tuple[tuple[int, ...], list[PartitionSolution]]], problem: PartitionProblem
) -> list[PartitionSolution] | None:
    """Partitions found for the same problem holding no more micro-batches on any stage, when every one of
    them also fits ``problem``'s memory (None: solve it). Its feasible set is a subset of theirs, so their
    optimum, lying in it, is its optimum; and where theirs had none, it has none."""
    held = _in_flight(problem)
    for in_flight, solutions in solved:
        if any(a > b for a, b in zip(in_flight, held, strict=True)):
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
    solved: dict[PartitionProblem, list[tuple[tuple[int, ...], list[PartitionSolution]]]] = {}
    placed: list[tuple[tuple[int, int], Candidate]] = []

    def cannot_win(floor_s: float) -> bool:
        if prune_above_s is None or floor_s <= fastest * (1 + NEAR_BEST):
            return False
        found.pruned += 1
        return True

    for option in sorted(_options(profile, request, found.refusals), key=lambda o: (o.floor_s, o.order)):
        if cannot_win(option.floor_s):
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
            recompute_choices=_recompute_choices(request),
            pinned=_pins(profile, request, v) if request.pinned else (),
            max_units_per_stage=request.max_units_per_stage,
            split_backward=schedule.splits_backward,
        )
        shape = replace(problem, in_flight=())
        solutions = _reused(solved.get(shape, []), problem)
        if solutions is None:
            solutions = _partitions(problem, request, stage_rank, v)
            solved.setdefault(shape, []).append((_in_flight(problem), solutions))
        if not solutions:
            found.infeasible.append(f"b={b} {schedule.value} v={v}")
            continue
        for k, solution in enumerate(solutions):
            runtime = _runtime_terms(
                profile, costs, request.settings, problem, solution, schedule, request.num_ranks, b
            )
            if prune_above_s is not None and cannot_win(
                _partition_floor_s(costs, problem, solution, option, stage_rank, runtime)
            ):
                continue
            simulation = _pipeline(costs, problem, solution, schedule, request.num_ranks, runtime).simulate()
            fastest = min(fastest, simulation.iteration_s)
            candidate = Candidate(b, m, schedule, v, problem, solution, simulation, _peak_memory(problem, solution))
            placed.append(((option.order, k), candidate))
    found.candidates = [c for _, c in sorted(placed, key=lambda p: p[0])]
    return found


def _explain_infeasible(profile: Profile, request: PlanRequest) -> str:
    """Say which unit is the hardest to place, by how much it misses, and what would help."""
    b = min(_micro_batch_sizes(profile, request))
    costs = unit_costs(profile, b)
    m = request.global_batch_size // b
    problem = build_problem(
        profile,
        costs,
        request.settings,
        num_stages=request.num_ranks,
        num_microbatches=m,
        in_flight=in_flight_per_stage(Schedule.ONE_F_ONE_B, request.num_ranks, m, request.num_ranks),
        stage_rank=tuple(range(request.num_ranks)),
        recompute_choices=(True,),
    )
    # The last stage holds the fewest micro-batches under 1F1B: the most lenient place for any unit.
    last = request.num_ranks - 1
    needs = [stage_cost(problem, last, u, u, True).memory_bytes for u in range(profile.num_units)]
    worst = max(range(profile.num_units), key=needs.__getitem__)
    capacity = problem.capacity_bytes[last]
    gib = 1024**3
    unit = profile.units[worst].name
    if needs[worst] > capacity:
        return (
            f"no plan fits: unit {unit} alone needs {needs[worst] / gib:.2f} GiB even with recomputation at "
            f"micro-batch {b}, over the {capacity / gib:.2f} GiB usable per device by "
            f"{(needs[worst] - capacity) / gib:.2f} GiB; use a device with more memory, --optimizer sgd, "
            "or split that unit (--units)"
        )
    total = sum(needs) / gib
    return (
        f"no plan fits {profile.num_units} units on {request.num_ranks} devices of {capacity / gib:.2f} GiB usable "
        f"(the largest unit, {unit}, needs {needs[worst] / gib:.2f} GiB; all units together "
        f"{total:.2f} GiB with recomputation at micro-batch {b}): use more stages (--stages), "
        "--recompute on, a smaller --micro-batch-size, or --optimizer sgd"
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


def _baseline_schedule(best: Candidate, num_ranks: int) -> Schedule:
    """The plan's schedule when it is GPipe or 1F1B, else torch's 1F1B (GPipe when M < P): the peers
    keep the schedule they ship with."""
    if best.schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.NAIVE):
        return best.schedule
    return Schedule.ONE_F_ONE_B if best.num_microbatches >= num_ranks else Schedule.GPIPE


def _baselines(profile: Profile, costs: UnitCosts, best: Candidate, request: PlanRequest) -> list[BaselinePlan]:
    """The partitioners people use today, one stage per rank, at the plan's micro-batching.

    Each chooses only the boundaries; the same cost model and simulator judge them. They do not
    recompute (unless ``--recompute on``) and do not look at memory, so a baseline may not fit.
    """
    p = request.num_ranks
    schedule = _baseline_schedule(best, p)
    problem = build_problem(
        profile,
        costs,
        request.settings,
        num_stages=p,
        num_microbatches=best.num_microbatches,
        in_flight=in_flight_per_stage(schedule, p, best.num_microbatches, p),
        stage_rank=tuple(range(p)),
        recompute_choices=(request.recompute == "on",),
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
        peak = int(_peak_memory(problem, solution))
        if objective == float("inf"):
            baselines.append(BaselinePlan(name, split_points, None, fits=False, peak_memory_bytes=peak))
            continue
        b = best.micro_batch_size
        runtime = _runtime_terms(profile, costs, request.settings, problem, solution, schedule, p, b)
        simulation = _pipeline(costs, problem, solution, schedule, p, runtime).simulate()
        baselines.append(BaselinePlan(name, split_points, simulation.iteration_s, True, peak))
    return baselines


def _constraints(profile: Profile, request: PlanRequest) -> dict[str, object]:
    s = request.settings
    return {
        "num_ranks": request.num_ranks,
        "global_batch_size": request.global_batch_size,
        "schedule": "auto" if request.schedule is None else request.schedule.value,
        "micro_batch_size": request.micro_batch_size if request.micro_batch_size is not None else "auto",
        "recompute": request.recompute,
        "solver": request.solver,
        "optimizer": s.optimizer,
        "link_bytes_per_s": s.link_bytes_per_s,
        "link_latency_s": s.link_latency_s,
        "device_memory_bytes": list(s.device_memory_bytes) or [profile.device.memory_bytes],
        "headroom_fraction": s.headroom_fraction,
        "capacity_bytes": [int(s.capacity(profile, r, request.num_ranks)) for r in range(request.num_ranks)],
        "device_speeds": list(s.device_speeds) or [1.0] * request.num_ranks,
        "pinned": [list(p) for p in request.pinned],
        "max_units_per_stage": request.max_units_per_stage,
        "top_k": request.top_k,
        "calibration": s.calibration_label,
    }


def make_plan(
    profile: Profile,
    request: PlanRequest,
    *,
    sha256: str,
    record_timing: bool = False,
    beat_s: float = math.inf,
) -> Plan:
    """Search every candidate and return the best simulated plan (raises PlanInfeasibleError).

    Candidates that cannot come within ``NEAR_BEST`` of the fastest (or of ``beat_s``, a step found
    elsewhere, e.g. by another cluster layout) are not simulated (planner/bounds.py); when that leaves
    none, :class:`~planner.errors.SearchPrunedError`.
    """
    return make_plans(profile, request, sha256=sha256, record_timing=record_timing, count=1, beat_s=beat_s)[0]


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
) -> list[Plan]:
    """The ``count`` best *distinct* plans (see :func:`plan_key`), fastest simulated first; with ``count`` 1,
    candidates that cannot come within ``NEAR_BEST`` of the fastest or of ``beat_s`` are skipped
    (:func:`make_plan`).

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
    # Only the best plan survives pruning unchanged: the runners-up of `tune` need every candidate.
    found = _search(profile, request, beat_s if count == 1 else None)
    candidates = found.candidates
    if not candidates and found.pruned:
        raise SearchPrunedError(f"no candidate can come within {NEAR_BEST:.0%} of {beat_s:.6g} s")
    if not candidates and not found.infeasible and found.refusals:
        raise ScheduleError(found.refusals[0])
    if not candidates:
        raise PlanInfeasibleError(_explain_infeasible(profile, request))
    ranked = _ranked(candidates)
    solve_s = time.perf_counter() - started
    plans: list[Plan] = []
    seen: set[tuple[object, ...]] = set()
    for best in ranked:
        plan = _plan_of(profile, request, best, candidates, sha256, solve_s if record_timing else None)
        if plan_key(plan) not in seen:
            seen.add(plan_key(plan))
            plans.append(plan)
        if len(plans) == count:
            break
    return plans


def _plan_of(
    profile: Profile,
    request: PlanRequest,
    best: Candidate,
    candidates: list[Candidate],
    sha256: str,
    solve_s: float | None,
) -> Plan:
    costs = unit_costs(profile, best.micro_batch_size)
    problem, solution, simulation = best.problem, best.solution, best.simulation
    stage_rank = stage_to_rank(best.schedule, problem.num_stages, request.num_ranks)
    forward, backward = _stage_times(problem, solution)
    inputs, weights = _split_times(costs, problem, solution, best.schedule)
    comm_forward, comm_backward = _comm_times(problem, solution)
    stages = []
    for s, units in enumerate(solution.stage_units(problem.num_units)):
        first, last = units[0], units[-1]
        stages.append(
            StagePlan(
                index=s,
                rank=stage_rank[s],
                units=tuple(profile.units[u].name for u in units),
                recompute=solution.recompute[s],
                forward_s=forward[s],
                backward_s=backward[s],
                send_bytes=costs.cut_bytes[last] if last < problem.num_units - 1 else 0,
                in_flight=problem.in_flight[s],
                memory_bytes=stage_memory(
                    profile,
                    costs,
                    request.settings,
                    first,
                    last,
                    in_flight=problem.in_flight[s],
                    recompute=solution.recompute[s],
                    split_backward=best.schedule.splits_backward,
                ),
                input_s=inputs[s] if inputs else None,
                weight_s=weights[s] if weights else None,
            )
        )
    split_points = tuple(profile.units[i].name for i in solution.boundaries[1:])
    used_ilp = _use_ilp(request)
    return Plan(
        model_name=profile.model.name,
        model_fingerprint=profile.model.fingerprint,
        profile_sha256=sha256,
        num_stages=problem.num_stages,
        num_ranks=request.num_ranks,
        schedule=best.schedule,
        virtual_stages=best.virtual_stages,
        micro_batch_size=best.micro_batch_size,
        num_microbatches=best.num_microbatches,
        global_batch_size=request.global_batch_size,
        stages=tuple(stages),
        split_points=split_points,
        predicted=_prediction(
            simulation,
            request.settings,
            formula_s=solution.objective_s,
            global_batch_size=request.global_batch_size,
            comm=(tuple(comm_forward), tuple(comm_backward)),
        ),
        solver=SolverInfo(
            name="ilp" if used_ilp else "dp",
            objective=OBJECTIVE,
            optimal=all(c.solution.optimal for c in candidates),
            solve_s=round(solve_s, 4) if solve_s is not None else None,
            gap=max((c.solution.gap or 0.0) for c in candidates) if used_ilp else 0.0,
            candidates=len(candidates),
        ),
        constraints=_constraints(profile, request),
        baselines=tuple(_baselines(profile, costs, best, request)),
        device=_device_block(profile),
    )


def _device_block(profile: Profile) -> dict[str, Any]:
    """The plan's ``device``: what was profiled, and on a CPU the intra-op threads the times were measured
    with, so that a replay measures the stages as the profile did; and the speed reference's time while the
    profile was made, so that ``verify`` can tell how fast the machine runs now against then."""
    block: dict[str, Any] = {"kind": profile.device.kind, "name": profile.device.name, "dtype": profile.device.dtype}
    threads = profile.settings.get("threads")
    if profile.device.kind == "cpu" and isinstance(threads, int) and threads > 0:
        block["threads"] = threads
    reference = profile.settings.get("reference_s")
    if isinstance(reference, (int, float)) and not isinstance(reference, bool) and reference > 0:
        block["reference_s"] = float(reference)
    return block


def _prediction(
    simulation: SimulationResult,
    settings: CostSettings,
    *,
    formula_s: float,
    global_batch_size: int,
    comm: tuple[tuple[float, ...], tuple[float, ...]],
) -> Prediction:
    return Prediction(
        iteration_s=simulation.iteration_s,
        formula_iteration_s=formula_s,
        bubble_fraction=simulation.bubble_fraction,
        samples_per_s=global_batch_size / simulation.iteration_s,
        bottleneck_stage=simulation.bottleneck_stage,
        busy_s=tuple(simulation.busy_s),
        comm_forward_s=comm[0],
        comm_backward_s=comm[1],
        **_runtime_fields(settings, simulation),
    )


def _runtime_fields(settings: CostSettings, simulation: SimulationResult) -> dict[str, object]:
    """The prediction's runtime terms, so that ``simulate PLAN`` and ``verify`` reproduce it."""
    if settings.calibration is None and settings.data_parallel is None:
        return {}
    overheads = [a.overhead_s for a in simulation.actions if a.kind != "S"]
    return {
        "calibration": settings.calibration_label,
        "action_overhead_s": overheads[0] if overheads else 0.0,
        "compute_scale": settings.calibration.colocation_factor if settings.calibration else 1.0,
        "step_tail_s": tuple(simulation.step_tail_s),
        "overhead_s": tuple(simulation.overhead_s),
        "comm_wait_s": tuple(simulation.comm_wait_s),
        "tail_groups": tuple(simulation.tail_groups),
        "resume": tuple(simulation.resume),
    }


def predict_plan(profile: Profile, plan: Plan, settings: CostSettings) -> SimulationResult:
    """Simulate an existing plan's partition under other settings (e.g. another calibration).

    The plan's schedule, micro-batching, boundaries and recomputation are kept; the cost model and the
    runtime terms come from ``settings``. ``tune`` and the fidelity benchmark use it to hold several
    models of cost against the same measured run.
    """
    names = [u.name for u in profile.units]
    try:
        boundaries = tuple(names.index(s.units[0]) for s in plan.stages)
    except ValueError:
        raise UsageError(
            f"the plan's units are not the profile's (plan for {plan.model_name}, profile of {profile.model.name})"
        ) from None
    costs = unit_costs(profile, plan.micro_batch_size)
    stage_rank = stage_to_rank(plan.schedule, plan.num_stages, plan.num_ranks)
    problem = build_problem(
        profile,
        costs,
        settings,
        num_stages=plan.num_stages,
        num_microbatches=plan.num_microbatches,
        in_flight=in_flight_per_stage(plan.schedule, plan.num_stages, plan.num_microbatches, plan.num_ranks),
        stage_rank=stage_rank,
        recompute_choices=(False, True),
        split_backward=plan.schedule.splits_backward,
    )
    recompute = tuple(s.recompute for s in plan.stages)
    objective, bottleneck = evaluate(problem, boundaries, recompute)
    solution = PartitionSolution(boundaries, recompute, objective, bottleneck, solver="given")
    runtime = _runtime_terms(
        profile, costs, settings, problem, solution, plan.schedule, plan.num_ranks, plan.micro_batch_size
    )
    return _pipeline(costs, problem, solution, plan.schedule, plan.num_ranks, runtime).simulate()


def repredicted_plan(profile: Profile, plan: Plan, settings: CostSettings) -> Plan:
    """``plan`` with its prediction (and the calibration it records) recomputed under ``settings``."""
    simulation = predict_plan(profile, plan, settings)
    old = plan.predicted
    prediction = _prediction(
        simulation,
        settings,
        formula_s=old.formula_iteration_s,
        global_batch_size=plan.global_batch_size,
        comm=(old.comm_forward_s, old.comm_backward_s),
    )
    constraints = {**plan.constraints, "calibration": settings.calibration_label}
    return replace(plan, predicted=prediction, constraints=constraints)
