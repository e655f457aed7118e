"""A plan of stages someone chose (a trainer's configuration, a hand layout): costed, simulated and assembled
exactly as the search assembles the partition it chose, so that it and a searched plan of the same stages
predict the same to the byte; for one pipeline or a ``pp x tp x dp`` mesh.

Memory does not refuse the layout here: the prediction is made whatever the devices hold, and each stage's
peak is held against its rank's capacity apart (:func:`stage_fits`), so that a layout that does not fit is
still predicted, and said to be over by how much.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.assemble import Candidate, build_plan
from planner.cluster import Cluster, Layout, MeshSearch, cluster_plan, layout_settings, sharded_for
from planner.cost import build_problem, unit_costs
from planner.errors import UsageError, shorten
from planner.plan import Plan, SolverInfo
from planner.prediction import partition_peak_memory, partition_pipeline, partition_runtime_terms
from planner.request import PlanRequest
from planner.schedule.orders import Schedule, check_microbatches, stage_to_rank, virtual_stages
from planner.schedule.simulate import in_flight_per_stage, simulate
from planner.search import OBJECTIVE, baselines_for, recompute_choices
from profiles.format import Profile
from solvers.problem import PartitionSolution, evaluate, stage_cost

__all__ = ["GivenLayout", "StageMemory", "given_plan", "given_mesh_plan"]


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


@dataclass(frozen=True)
class StageMemory:
    """A stage's predicted peak against what its rank has for it (the rank's usable memory over its stages)."""

    stage: int
    rank: int
    peak_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


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
) -> tuple[Plan, tuple[StageMemory, ...]]:
    """``layout`` as a plan of ``request.num_ranks`` ranks, and each stage's memory against its capacity.

    The steps are the search's for one partition (planner/search.py ``_search``): the partition problem of the
    schedule, the runtime terms, the simulation, then :func:`~planner.assemble.build_plan`.
    """
    p, num_stages, b, m = request.num_ranks, len(layout.stages), layout.micro_batch_size, layout.num_microbatches
    if num_stages % p:
        raise UsageError(f"{num_stages} stages do not divide among {p} ranks")
    virtual_stages(layout.schedule, num_stages, p)
    check_microbatches(layout.schedule, p, num_stages // p, m)
    profile = profile.for_ranks(p)
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
    memory = []
    ends = (*boundaries[1:], problem.num_units)
    for s, (first, end) in enumerate(zip(boundaries, ends, strict=True)):
        peak = stage_cost(problem, s, first, end - 1, layout.recompute[s]).memory_bytes
        capacity = problem.capacity_bytes[s] if problem.capacity_bytes else math.inf
        memory.append(StageMemory(s, stage_rank[s], peak, capacity))
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
    return plan, tuple(memory)


def given_mesh_plan(
    profile: Profile,
    request: PlanRequest,
    cluster: Cluster,
    layout: Layout,
    given: GivenLayout,
    *,
    sequence_parallel: bool,
    vocab_parallel: bool,
    sha256: str | None,
    trainer_collectives: bool = False,
) -> tuple[Plan, tuple[StageMemory, ...]]:
    """``given`` as each replica's pipeline of a ``pp x tp x dp`` ``layout`` on ``cluster`` (``request`` for the
    whole step), costed as the cluster search costs that layout.

    ``trainer_collectives``: the replicas' collectives as the trainers run them rather than as pipeplan's runtime
    does: full sharding without a pipeline (pp = 1) resharded and prefetched unit by unit
    (:attr:`~planner.cost.DataParallel.per_unit`), and a ring that leaves a node crossing it on every NIC the
    ring's devices there have (NCCL runs a ring a channel, each channel on its own NIC), not on one.
    """
    sharded = sharded_for(profile, cluster, layout.tp, sequence_parallel, vocab_parallel)
    settings = layout_settings(request, cluster, layout)
    dp = settings.data_parallel
    if trainer_collectives and dp is not None:
        # Replicas of one position sit next to each other (replicas-in-node) or a pipeline apart.
        apart = layout.tp * (1 if layout.placement == "replicas-in-node" else layout.pp)
        per_node = max(1, min(layout.dp, cluster.devices_per_node // apart))
        ring = min(cluster.intra_node_bytes_per_s, dp.bytes_per_s * per_node)
        settings = replace(settings, data_parallel=replace(dp, bytes_per_s=ring, per_unit=layout.pp == 1))
    replica = replace(
        request, num_ranks=layout.pp, global_batch_size=request.global_batch_size // layout.dp, settings=settings
    )
    plan, memory = given_plan(sharded, replica, given, sha256=sha256)
    mesh = MeshSearch(layout.pp, layout.tp, sequence_parallel=sequence_parallel, vocab_parallel=vocab_parallel)
    return cluster_plan(plan, cluster, layout, request, replica, mesh), memory
