"""A plan of stages someone chose (a trainer's configuration, a hand layout): costed, simulated and assembled
exactly as the search assembles the partition it chose, so that it and a searched plan of the same stages
predict the same to the byte; for one pipeline or a ``pp x tp x dp`` mesh.

Memory does not refuse the layout here: the prediction is made whatever the devices hold, and each rank's
peak is held against its capacity apart (:class:`RankMemory`), so that a layout that does not fit is still
predicted, and said to be over by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.assemble import Candidate, build_plan
from planner.cluster import Cluster, Layout, MeshSearch, cluster_plan, layout_settings, replica_request, sharded_for
from planner.cost import build_problem, unit_costs
from planner.errors import UsageError, shorten
from planner.plan import Plan, SolverInfo
from planner.prediction import partition_peak_memory, partition_pipeline, partition_runtime_terms
from planner.request import PlanRequest
from planner.schedule.orders import Schedule, check_microbatches, rank_orders, stage_to_rank, virtual_stages
from planner.schedule.simulate import in_flight_per_stage, simulate
from planner.search import OBJECTIVE, baselines_for, recompute_choices
from profiles.format import Profile
from solvers.problem import Moment, PartitionProblem, PartitionSolution, StageMemory, evaluate, stage_memory_peak

__all__ = ["GivenLayout", "RankMemory", "given_plan", "given_mesh_plan"]


@dataclass(frozen=True)
class GivenLayout:
    """Stages chosen outside the search: each stage's units (the profile's names, in order), the schedule and
    micro-batching, and which stages recompute."""

    stages: tuple[tuple[str, ...], ...]
    schedule: Schedule
    micro_batch_size: int
    num_microbatches: int
    recompute: tuple[bool, ...]
    recompute_unit_wise: bool = False
    """A recomputing stage checkpoints each unit on its own (Megatron's and torchtitan's full recomputation, a
    layer at a time), not the stage as a whole as pipeplan's runtime does."""
    receive_buffers: bool = True
    """The runtime keeps a receive buffer a micro-batch for the stage's input and its output's gradient, as
    ``torch.distributed.pipelining`` does (pipeplan's runtime, torchtitan). False: Megatron's schedules, which
    receive into fresh tensors, the input held as the stage's first saved activation, the gradient freed by its
    backward."""


@dataclass(frozen=True)
class RankMemory:
    """A pipeline rank's predicted peak (its stages together) against its usable memory (less headroom)."""

    rank: int
    peak_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def over_bytes(self) -> float:
        return max(0.0, self.peak_bytes - self.capacity_bytes)


def _rank_memory(
    problem: PartitionProblem,
    boundaries: tuple[int, ...],
    recompute: tuple[bool, ...],
    schedule: Schedule,
    num_ranks: int,
    stage_rank: tuple[int, ...],
) -> tuple[RankMemory, ...]:
    """Each rank's peak, its stages together (the device is one pool).

    A rank of one stage peaks as that stage does (:func:`~solvers.problem.stage_memory_peak`). A rank of several
    (interleaved schedules) is walked through its actions: each stage's state and buffers are held all step, each
    micro-batch forwarded and not yet back holds its stage's activations, and the acting stage adds its working
    memory; the peak is the largest sum at the start of a backward. Summing each stage's own peak instead would
    count every stage at its fullest at once, which an interleaved rank never is. Under a split backward a
    micro-batch leaves the count at its input gradient (I): what it keeps for W is left out of the walk.
    """
    ends = (*boundaries[1:], problem.num_units)
    spans = list(zip(boundaries, ends, strict=True))
    capacity = [0.0] * num_ranks
    for s, r in enumerate(stage_rank):
        capacity[r] += problem.capacity_bytes[s] if problem.capacity_bytes else math.inf
    stages_of = [[s for s, r in enumerate(stage_rank) if r == rank] for rank in range(num_ranks)]
    if all(len(held) == 1 for held in stages_of):
        return tuple(
            RankMemory(r, stage_memory_peak(problem, s, first, end - 1, recompute[s]).total_bytes, capacity[r])
            for r, [s] in enumerate(stages_of)
            for first, end in [spans[s]]
        )

    def at(waiting: int, s: int) -> StageMemory:
        one = replace(problem, moments=tuple((Moment(waiting),) for _ in spans))
        return stage_memory_peak(one, s, spans[s][0], spans[s][1] - 1, recompute[s])

    held, static, acting = [], [], []
    for s in range(len(spans)):
        one, two = at(1, s), at(2, s)
        held.append(two.activations_bytes - one.activations_bytes)
        static.append(one.state_bytes + one.buffers_bytes)
        acting.append(one.activations_bytes - held[-1] + one.transient_bytes)
    orders = rank_orders(schedule, len(spans), problem.num_microbatches, num_ranks)
    ranks = []
    for r, order in enumerate(orders):
        waiting = dict.fromkeys(stages_of[r], 0)
        peak = 0.0
        for step in order:
            if step.kind == "F":
                waiting[step.stage] += 1
            elif step.kind in "BI":
                peak = max(peak, sum(n * held[s] for s, n in waiting.items()) + acting[step.stage])
                waiting[step.stage] -= 1
        ranks.append(RankMemory(r, sum(static[s] for s in stages_of[r]) + peak, capacity[r]))
    return tuple(ranks)


def _boundaries(profile: Profile, stages: Sequence[Sequence[str]]) -> tuple[int, ...]:
    names = [u.name for u in profile.units]
    if [u for s in stages for u in s] != names:
        raise UsageError(
            f"the layout's stages do not hold the profile's units in order, each once (units: "
            f"{shorten(', '.join(names), 80)})"
        )
    boundaries, start = [], 0
    for stage in stages:
        boundaries.append(start)
        start += len(stage)
    return tuple(boundaries)


def given_plan(
    profile: Profile, request: PlanRequest, layout: GivenLayout, *, sha256: str | None
) -> tuple[Plan, tuple[RankMemory, ...]]:
    """``layout`` as a plan of ``request.num_ranks`` ranks, and each rank's memory against its capacity.

    The steps are the search's for one partition (planner/search.py ``_search``): the partition problem of the
    schedule, the runtime terms, the simulation, then :func:`~planner.assemble.build_plan`.
    """
    p, num_stages, b, m = request.num_ranks, len(layout.stages), layout.micro_batch_size, layout.num_microbatches
    if num_stages % p:
        raise UsageError(f"{num_stages} stages do not divide among {p} ranks")
    virtual_stages(layout.schedule, num_stages, p)
    check_microbatches(layout.schedule, p, num_stages // p, m)
    profile = profile.for_ranks(request.threads_ranks)
    if b not in profile.micro_batch_sizes:
        raise UsageError(
            f"micro-batch size {b} was not profiled (sizes: {', '.join(map(str, profile.micro_batch_sizes))}): "
            f"profile it with --micro-batch-sizes {b}"
        )
    boundaries = _boundaries(profile, layout.stages)
    costs = unit_costs(profile, b)
    stage_rank = stage_to_rank(layout.schedule, num_stages, p)
    problem = build_problem(
        profile,
        costs,
        request.settings,
        num_stages=num_stages,
        num_microbatches=m,
        in_flight=in_flight_per_stage(layout.schedule, num_stages, m, p),
        stage_rank=stage_rank,
        recompute_choices=recompute_choices(request),
        schedule=layout.schedule,
    )
    problem = replace(problem, recompute_unit_wise=layout.recompute_unit_wise)
    held = problem if layout.receive_buffers else replace(problem, buffer_microbatches=0)
    memory = _rank_memory(held, boundaries, layout.recompute, layout.schedule, p, stage_rank)
    # Predicted whatever it holds: the capacities apart, the partition is the search's.
    unbounded = replace(problem, capacity_bytes=())
    objective, bottleneck = evaluate(unbounded, boundaries, layout.recompute)
    solution = PartitionSolution(boundaries, layout.recompute, objective, bottleneck, solver="given")
    runtime = partition_runtime_terms(profile, costs, request.settings, unbounded, solution, layout.schedule, p, b)
    simulation = simulate(partition_pipeline(costs, unbounded, solution, layout.schedule, p, runtime))
    peak = partition_peak_memory(unbounded, solution)
    candidate = Candidate(b, m, layout.schedule, num_stages // p, unbounded, solution, simulation, peak, runtime)
    solver = SolverInfo(name="given", objective=OBJECTIVE, optimal=False, candidates=1)
    plan = build_plan(
        profile,
        request,
        candidate,
        solver=solver,
        baselines=tuple(baselines_for(profile, candidate, request)),
        sha256=sha256,
    )
    return plan, memory


def given_mesh_plan(
    profile: Profile,
    request: PlanRequest,
    cluster: Cluster,
    layout: Layout,
    given: GivenLayout,
    mesh: MeshSearch,
    *,
    sha256: str | None,
) -> tuple[Plan, tuple[RankMemory, ...]]:
    """``given`` as each replica's pipeline of a ``pp x tp x dp`` ``layout`` on ``cluster`` (``request`` for the
    whole step), costed as the cluster search costs that layout with ``mesh``'s tensor-parallel layout and
    collectives (its degrees are the layout's)."""
    sharded = sharded_for(profile, cluster, layout.tp, mesh.sequence_parallel, mesh.vocab_parallel)
    settings = layout_settings(request, cluster, layout, mesh)
    replica = replica_request(request, cluster, layout, settings)
    plan, memory = given_plan(sharded, replica, given, sha256=sha256)
    mesh = replace(mesh, pipeline_degree=layout.pp, tensor_parallel=layout.tp)
    return cluster_plan(plan, cluster, layout, request, replica, mesh), memory
