"""Cluster plans: how many pipeline ranks (pp), tensor-parallel devices (tp) and data-parallel replicas (dp) on
N devices, and where.

PipeDream's planner replicates stages over a bandwidth hierarchy (Narayanan et al., SOSP 2019, Sec. 3.1);
Alpa's inter-operator pass pairs layer slices with submeshes (Zheng et al., OSDI 2022, Sec. 5); Galvatron
and Metis choose the degrees from profiled costs. pipeplan keeps the layout torchtitan and Megatron run
(every stage replicated ``dp`` times, a ``pp x dp`` mesh) and searches it exhaustively: every pipeline
degree ``p``, every replica count ``d`` that splits the global batch into whole micro-batches with
``p * d <= N``, and both placements of the mesh on the nodes. For each it runs the full single-pipeline
search (boundaries, micro-batch size and count, schedule, recomputation) on one replica's batch, with
each rank's gradient synchronisation over its ``d`` replicas in the simulated step (planner/cost.py,
``DataParallel``). The fastest simulated step wins; ties go to fewer devices, then less memory.

With tensor parallelism (``tensor_parallel``), each (replica, pipeline rank) is a group of ``tp`` consecutive
devices in one node, and each degree's layouts are searched on the profile as one device of the group computes
it (planner/tensor_parallel.py), all degrees in one branch and bound. With several shardings of the replicas
searched (``MeshSearch.shards``, ``--shard auto``), each is another layout of the same branch and bound.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from planner.cost import CostSettings, DataParallel, bytes_per_param, state_bytes_per_param, unit_costs
from planner.errors import (
    PipeplanError,
    PipeplanWarning,
    PlanInfeasibleError,
    SearchPrunedError,
    UnexplainedInfeasibleError,
    UsageError,
)
from planner.limits import check_plan_work
from planner.mesh_layouts import DEFAULT_CLUSTER_LINKS, Cluster, Layout, default_cluster, layouts, nearest_divisors
from planner.plan import Mesh, Plan
from planner.request import PlanRequest
from planner.search import baselines_for, estimate_step_s, explain_infeasible, make_plan
from planner.tensor_parallel import TensorParallel, check_degree, shardable_degrees, sharded_profile
from planner.tensor_parallel import attention_heads as tensor_attention_heads
from profiles.format import Profile

__all__ = [
    "Cluster",
    "Layout",
    "ClusterResult",
    "MeshSearch",
    "layouts",
    "plan_cluster",
    "tensor_parallel_degrees",
    "best_step_per",
    "default_cluster",
    "DEFAULT_CLUSTER_LINKS",
    "layout_settings",
    "replica_request",
    "sharded_for",
    "on_mesh",
    "cluster_plan",
]


@dataclass(frozen=True)
class ClusterResult:
    plan: Plan
    """The fastest plan, with its :class:`~planner.plan.Mesh`."""
    tried: tuple[tuple[Layout, float | None, str], ...]
    """Every layout: (layout, simulated step in seconds or None, why not when None)."""


def layout_settings(
    request: PlanRequest, cluster: Cluster, layout: Layout, mesh: MeshSearch | None = None
) -> CostSettings:
    """One replica's cost settings on ``layout``: its slowest pipeline hop, and its replicas' gradient ring, run as
    ``mesh`` says (pipeplan's runtime, or a trainer's collectives)."""
    hop = layout.hop_bytes_per_s(cluster)
    ring = layout.ring_bytes_per_s(cluster)
    settings = request.settings
    if math.isfinite(hop):
        settings = replace(settings, link_bytes_per_s=hop, link_latency_s=cluster.latency_s)
    if layout.dp == 1:
        return settings
    overlap = mesh is not None and mesh.overlap_grad_reduce
    dp = DataParallel(layout.dp, ring, cluster.latency_s, layout.shard, overlaps_backward=overlap)
    if mesh is not None and mesh.trainer_collectives:
        # Replicas of one position sit next to each other (replicas-in-node) or a pipeline apart.
        apart = layout.tp * (1 if layout.placement == "replicas-in-node" else layout.pp)
        per_node = max(1, min(layout.dp, cluster.devices_per_node // apart))
        dp = replace(
            dp,
            bytes_per_s=min(cluster.intra_node_bytes_per_s, ring * per_node),
            per_unit=layout.pp == 1,
            gathered_all_step=layout.pp > 1,
        )
    return replace(settings, data_parallel=dp)


def replica_request(request: PlanRequest, cluster: Cluster, layout: Layout, settings: CostSettings) -> PlanRequest:
    """One replica's pipeline of ``layout``: its ranks, its share of the batch, ``settings``, and the processes that
    share a machine's cores with each of its ranks (a node's devices of the layout, every group's member)."""
    return replace(
        request,
        num_ranks=layout.pp,
        global_batch_size=request.global_batch_size // layout.dp,
        settings=settings,
        ranks_per_machine=min(cluster.devices_per_node, layout.used_devices),
    )


def _mesh(cluster: Cluster, layout: Layout, request: PlanRequest, settings: CostSettings) -> Mesh:
    ring = layout.ring_bytes_per_s(cluster)
    return Mesh(
        pp=layout.pp,
        dp=layout.dp,
        placement=layout.placement,
        shard=layout.shard,
        num_devices=cluster.num_devices,
        devices_per_node=cluster.devices_per_node,
        global_batch_size=request.global_batch_size,
        devices=layout.devices(),
        hop_bytes_per_s=settings.link_bytes_per_s,
        hop_latency_s=settings.link_latency_s,
        ring_bytes_per_s=ring if math.isfinite(ring) else cluster.intra_node_bytes_per_s,
        ring_latency_s=cluster.latency_s,
        tp=layout.tp,
    )


def sharded_for(profile: Profile, cluster: Cluster, tp: int, sequence_parallel: bool, vocab_parallel: bool) -> Profile:
    """The profile as one device of a tensor-parallel group of ``tp`` in a node of ``cluster`` computes it; a group
    wider than a node (a trainer's layout) rings across nodes on every NIC of a node (NCCL: a NIC a channel)."""
    bytes_per_s = cluster.group_bytes_per_s(tp)
    if tp > cluster.devices_per_node:
        bytes_per_s = min(bytes_per_s, cluster.inter_node_bytes_per_s * cluster.devices_per_node)
    group = TensorParallel(tp, bytes_per_s, cluster.latency_s, sequence_parallel, vocab_parallel)
    return sharded_profile(profile, group)


def on_mesh(plan: Plan, cluster: Cluster, layout: Layout, request: PlanRequest, replica: PlanRequest) -> Plan:
    """One replica's ``plan`` as the cluster plan of ``layout``: its mesh, and the throughput of every replica."""
    predicted = replace(plan.predicted, samples_per_s=request.global_batch_size / plan.predicted.iteration_s)
    return replace(plan, predicted=predicted, mesh=_mesh(cluster, layout, request, replica.settings))


def cluster_plan(
    plan: Plan, cluster: Cluster, layout: Layout, request: PlanRequest, replica: PlanRequest, mesh: MeshSearch
) -> Plan:
    """A replica's plan of a layout chosen outside the search (``mesh`` says which degrees and tensor-parallel
    layout) as that cluster plan, with the constraints a search of that one layout records."""
    placed = on_mesh(plan, cluster, layout, request, replica)
    tried = [(layout, placed.predicted.iteration_s, "")]
    return replace(placed, constraints=_cluster_constraints(placed, cluster, request, mesh, tried))


def _lower_bound_s(profile: Profile, request: PlanRequest, settings: CostSettings, layout: Layout) -> float:
    """No step of the layout is shorter (inf: no plan of it fits in memory).

    Every rank's step ends after its own compute and its gradient sync, so the step is at least their
    average over the ``pp`` ranks: one replica's compute (and FSDP's gathers, or the longer of the two where
    they are prefetched behind it) spread evenly at the fastest device speed, no bubble, no recomputation, no
    latency, plus the bandwidth part of the replicas' synchronisation of all parameters that no backward hides,
    spread likewise; and at least the longest unit times the micro-batches. Memory: the ranks together hold
    every parameter's state at least once.
    """
    dp = settings.data_parallel
    held = sum(unit_costs(profile, profile.micro_batch_sizes[0]).param_count)
    usable = settings.capacity(profile, 0, layout.pp)
    if held * state_bytes_per_param(profile, settings) > usable * layout.pp:
        return math.inf
    batch = request.global_batch_size // layout.dp
    weights, grads, _ = bytes_per_param(profile.device.dtype, settings.optimizer)
    gathers = sync = 0.0
    if dp is not None and dp.replicas > 1:
        per_byte = (dp.replicas - 1) / dp.replicas / dp.bytes_per_s
        if dp.shard == "full" and not dp.gathered_all_step:
            gathers = held * (2 * weights + grads) * per_byte  # per micro-batch
        else:
            # Once a step (planner/step_tails.py): the gradients' reduction, which may run behind the backward,
            # and under ZeRO-1 or FSDP gathered all step the updated weights' all-gather, which follows it.
            reduced = 0.0 if dp.overlaps_backward else (2 if dp.shard == "none" else 1) * held * grads
            sync = (reduced + (0 if dp.shard == "none" else held * weights)) * per_byte
    speed = max(settings.device_speeds, default=1.0)
    cal = settings.calibration
    # The simulator scales a pipeline's compute by the co-location factor at its micro-batch size.
    scale = cal.lowest_colocation_factor if cal is not None and layout.pp > 1 else 1.0
    bounds = []
    for b in profile.micro_batch_sizes:
        if batch % b:
            continue
        work = unit_costs(profile, b).work
        # FSDP resharding unit by unit prefetches each unit's gathers behind its neighbour's compute (cost.py
        # _with_gathers): a micro-batch takes at least the longer of the two, else both.
        per_micro_batch = (
            max(work.total_s, gathers) if dp is not None and dp.reshards_per_unit else work.total_s + gathers
        )
        spread = (batch / b * per_micro_batch * scale / speed + sync) / layout.pp
        # Whichever rank holds the longest unit runs it for every micro-batch.
        longest = batch / b * work.longest_s * scale / speed
        bounds.append(max(spread, longest))
    return min(bounds, default=0.0)


def _guess_s(profile: Profile, replica: PlanRequest) -> float:
    try:
        return estimate_step_s(profile, replica)
    except PipeplanError:  # the layout's own search says why
        return math.inf


def _search_layout(profile: Profile, replica: PlanRequest, sha256: str, record_timing: bool, beat_s: float) -> Plan:
    """One layout's single-pipeline search (run inline, or in a worker process)."""
    # As `plan` refuses for one pipeline: a replica's search too large to simulate is no candidate.
    sizes = [replica.micro_batch_size] if replica.micro_batch_size else profile.micro_batch_sizes
    check_plan_work(replica.num_ranks, replica.global_batch_size, sizes)
    # Each candidate of the layout is held against the best step so far (planner/bounds.py); the baselines are
    # scored for the winning layout alone (plan_cluster).
    # A layout with no plan that fits is not explained here: the search reports one such layout at most.
    return make_plan(
        profile, replica, sha256=sha256, record_timing=record_timing, beat_s=beat_s, with_baselines=False, explain=False
    )


class _Inline(Executor):
    """An executor that runs each task when it is submitted: ``jobs=1`` takes the same path as workers."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        future: Future[Plan] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future, as a pool does
            future.set_exception(exc)
        return future


def _first(item: tuple[int, object]) -> int:
    return item[0]


_WORKER_PROFILES: dict[int, Profile] = {}
"""In a worker process: the profile one device of each tensor-parallel degree computes, given once when the worker
starts. A profile sent with each layout would arrive as a new object every time, and the caches kept per profile
(planner/cost.py ``unit_costs``: 0.13 s a micro-batch size on 2,000 units) would miss in every layout."""


def _executor(jobs: int, profiles: dict[int, Profile]) -> Executor:
    if jobs <= 1:
        return _Inline()
    # fork: workers start in milliseconds with the profile already in memory (spawn re-imports numpy and
    # networkx in every worker); spawn where fork does not exist.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start_worker, initargs=(profiles,))


def _start_worker(profiles: dict[int, Profile]) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the search with its one-line message and
    # the workers finish the layout at hand, rather than each printing a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_PROFILES.update(profiles)


def _search_worker_layout(tp: int, replica: PlanRequest, sha256: str, record_timing: bool, beat_s: float) -> Plan:
    """:func:`_search_layout` in a worker, of its profile for degree ``tp``."""
    return _search_layout(_WORKER_PROFILES[tp], replica, sha256, record_timing, beat_s)


def tensor_parallel_degrees(
    profile: Profile,
    cluster: Cluster,
    tensor_parallel: int | None,
    heads: tuple[int, int] | None,
) -> tuple[int, ...]:
    """The tensor-parallel degrees to search: ``tensor_parallel`` checked (:func:`check_degree`), or with None
    (``auto``) every degree that divides the node and the heads (planner/tensor_parallel.py).

    Raises:
        UsageError: a fixed degree over the devices, or one the nodes or the model cannot take.
    """
    if tensor_parallel is None:
        if heads is None and cluster.devices_per_node > 1:
            warnings.warn(
                "--tensor-parallel auto: the profile records no attention heads, so only tp 1 is searched; give "
                "--attention-heads H[,KV]",
                PipeplanWarning,
                stacklevel=2,
            )
        return tuple(t for t in shardable_degrees(profile, cluster.devices_per_node, heads) if t <= cluster.num_devices)
    if tensor_parallel > cluster.num_devices:
        raise UsageError(
            f"--tensor-parallel {tensor_parallel} needs {tensor_parallel} devices, and the plan has --devices "
            f"{cluster.num_devices}"
        )
    check_degree(profile, tensor_parallel, cluster.devices_per_node, heads)
    return (tensor_parallel,)


@dataclass(frozen=True)
class MeshSearch:
    """Which ``pp x tp x dp`` layouts a cluster search tries, beyond what the cluster's devices allow."""

    pipeline_degree: int | None = None
    """``pp`` fixed (``--ranks`` with ``--devices``), which must then divide the devices; None: every degree."""
    tensor_parallel: int | None = 1
    """``tp`` fixed (1: none), or None: every degree that divides a node and the attention heads."""
    attention_heads: tuple[int, int] | None = None
    """(heads, key-value heads) the tensor-parallel degrees must divide; None: the profile's."""
    sequence_parallel: bool = False
    """Model Megatron's sequence parallelism (planner/tensor_parallel.py); off is pipeplan's runtime."""
    vocab_parallel: bool = False
    """Model a vocabulary-parallel embedding and head (:func:`~planner.tensor_parallel.layout_switches`)."""
    shards: tuple[str, ...] = ()
    """What the replicas may split, each searched (``--shard auto``); none given: the cluster's ``shard``."""
    trainer_collectives: bool = False
    """The replicas' collectives as the trainers run them rather than as pipeplan's runtime does: full sharding
    without a pipeline (pp = 1) resharded and prefetched unit by unit (:attr:`~planner.cost.DataParallel.per_unit`),
    under one gathered once a step (:attr:`~planner.cost.DataParallel.gathered_all_step`), and a ring that leaves a
    node crossing it on every NIC the ring's devices there have (NCCL runs a ring a channel, each channel on its
    own NIC), not on one."""
    overlap_grad_reduce: bool = False
    """The replicas' gradient reduction runs behind the last backward
    (:attr:`~planner.cost.DataParallel.overlaps_backward`)."""
    collectives: str = "pipeplan"
    """Whose collectives the two switches above are (``plan --collectives``), recorded in the plan."""


class _Candidate(NamedTuple):
    """A layout to search, in the order the search takes them: likeliest winner first."""

    guess_s: float
    bound_s: float
    order: int
    """The layout's place in the exhaustive order (ties go to the earlier)."""
    layout: Layout
    replica: PlanRequest
    """One replica's request: ``pp`` ranks, its share of the global batch, the layout's links."""


def plan_cluster(
    profile: Profile,
    request: PlanRequest,
    cluster: Cluster,
    mesh: MeshSearch = MeshSearch(),  # noqa: B008 - frozen, so one shared default is safe
    *,
    sha256: str,
    record_timing: bool = False,
    jobs: int = 1,
) -> ClusterResult:
    """The fastest simulated ``pp x tp x dp`` plan of ``request.global_batch_size`` samples on ``cluster``.

    ``request.num_ranks`` is ignored (the search sets it per layout); ``mesh`` says which degrees are searched
    and the tensor-parallel layout modelled: both switches off, the default, is what pipeplan's runtime runs, both
    on is Megatron's. ``jobs`` > 1 searches that many layouts at once in worker processes; the plan is the same
    (only which layouts were pruned, rather than simulated, may differ).

    Raises:
        UsageError: the pipeline degree does not divide the devices, or exceeds the units; a tensor-parallel
            degree the nodes or the model cannot take.
        PlanInfeasibleError: no layout gives a plan; the message says why for the closest one.
    """
    heads = mesh.attention_heads if mesh.attention_heads is not None else tensor_attention_heads(profile)
    degrees = tensor_parallel_degrees(profile, cluster, mesh.tensor_parallel, heads)
    if mesh.pipeline_degree is not None:
        degrees = _degrees_with_pipeline(profile, cluster, mesh.pipeline_degree, degrees)
    if jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {jobs}")
    candidates, profiles = _candidates(profile, request, cluster, mesh, degrees)
    standings = _Standings(cluster, request)
    with _executor(jobs, profiles) as pool:

        def submit(candidate: _Candidate, beat_s: float) -> Future[Plan]:
            layout, replica = candidate.layout, candidate.replica
            if jobs <= 1:
                return pool.submit(_search_layout, profiles[layout.tp], replica, sha256, record_timing, beat_s)
            return pool.submit(_search_worker_layout, layout.tp, replica, sha256, record_timing, beat_s)

        _branch_and_bound(submit, jobs, candidates, standings)
    if standings.best is None:
        standings.explain(profiles)
        mesh_kind = "pp x dp" if degrees == (1,) else "pp x tp x dp"
        raise PlanInfeasibleError(
            f"no {mesh_kind} layout of {cluster.num_devices} devices gives a plan ({standings.last_error})"
        )
    _, plan, layout, replica = standings.best
    sharded = profiles[layout.tp].for_ranks(replica.threads_ranks)
    plan = replace(plan, baselines=tuple(baselines_for(sharded, plan, replica)))
    constraints = _cluster_constraints(plan, cluster, request, mesh, [t for _, t in standings.tried])
    tried = tuple(t for _, t in sorted(standings.tried, key=_first))
    return ClusterResult(replace(plan, constraints=constraints), tried)


def _degrees_with_pipeline(
    profile: Profile, cluster: Cluster, pipeline_degree: int, degrees: tuple[int, ...]
) -> tuple[int, ...]:
    """The tensor-parallel ``degrees`` that a fixed pipeline degree leaves a whole mesh of the devices; raises
    where the pipeline degree itself cannot be (it must divide the devices and cut the units)."""
    if cluster.num_devices % pipeline_degree:
        raise UsageError(
            f"--ranks {pipeline_degree} does not divide --devices {cluster.num_devices}: a pp x dp mesh "
            f"needs pp to divide the devices (e.g. --ranks "
            f"{nearest_divisors(pipeline_degree, cluster.num_devices)})"
        )
    if pipeline_degree > profile.num_units:
        raise UsageError(f"cannot cut {profile.num_units} units into {pipeline_degree} stages")
    fitting = tuple(t for t in degrees if cluster.num_devices % (pipeline_degree * t) == 0)
    if not fitting:
        raise UsageError(
            f"--ranks {pipeline_degree} x --tensor-parallel {degrees[0]} does not divide --devices "
            f"{cluster.num_devices}: a pp x tp x dp mesh uses them all"
        )
    return fitting


def _candidates(
    profile: Profile, request: PlanRequest, cluster: Cluster, mesh: MeshSearch, degrees: tuple[int, ...]
) -> tuple[list[_Candidate], dict[int, Profile]]:
    """Every layout of every degree with its lower bound and guessed step, sorted likeliest winner first, and the
    profile as one device of each degree's group computes it."""
    candidates = []
    profiles: dict[int, Profile] = {}
    order = 0
    for tp in degrees:
        profiles[tp] = sharded = sharded_for(profile, cluster, tp, mesh.sequence_parallel, mesh.vocab_parallel)
        # A CPU profile as each rank computes beside the others on its machine: the bound is of those times.
        at_threads: dict[int, Profile] = {}
        batch = request.global_batch_size
        for layout in layouts(cluster, profile.num_units, batch, mesh.pipeline_degree, tp, mesh.shards):
            if mesh.pipeline_degree is None or layout.used_devices == cluster.num_devices:
                settings = layout_settings(request, cluster, layout, mesh)
                replica = replica_request(request, cluster, layout, settings)
                ranks = replica.threads_ranks
                if ranks not in at_threads:
                    at_threads[ranks] = sharded.for_ranks(ranks)
                bound = _lower_bound_s(at_threads[ranks], request, settings, layout)
                # The likeliest winners first, so that the rest meet a good step to beat: the bound alone puts
                # the deepest pipelines first (least work per rank), whose bubble then loses; the guess alone
                # (one replica's pipeline) leaves out the replicas' gradient sync, which the bound counts.
                guess = max(_guess_s(sharded, replica), bound) if bound < math.inf else math.inf
                candidates.append(_Candidate(guess, bound, order, layout, replica))
            order += 1
    return sorted(candidates, key=lambda c: (c.guess_s, c.bound_s, c.order)), profiles


class _Standings:
    """What the layouts searched so far gave: each one's outcome, in search order, and the best plan."""

    def __init__(self, cluster: Cluster, request: PlanRequest) -> None:
        self.cluster, self.request = cluster, request
        self.tried: list[tuple[int, tuple[Layout, float | None, str]]] = []
        # The best so far: its ranking key, its plan on the mesh, its layout and its replica's request.
        self.best: tuple[tuple[float, int, int, int], Plan, Layout, PlanRequest] | None = None
        self.last_error = "no layout"
        # The layout and request of the last error, where it is a search with no plan that fits, left unexplained.
        self.unexplained: tuple[Layout, PlanRequest] | None = None

    @property
    def best_s(self) -> float:
        """The best step so far (inf: none yet)."""
        return self.best[0][0] if self.best is not None else math.inf

    def refuse(
        self, order: int, layout: Layout, reason: str, error: str | None = None, unexplained: PlanRequest | None = None
    ) -> None:
        """The layout gave no plan, for ``reason``; ``error`` is what the final refusal cites, if it is the last;
        ``unexplained``: its request, where the search found no plan that fits and did not say why."""
        self.tried.append((order, (layout, None, reason)))
        if error is not None:
            self.last_error = f"{_named(layout)}: {error}"
            self.unexplained = None if unexplained is None else (layout, unexplained)

    def explain(self, profiles: dict[int, Profile]) -> None:
        """The last error said in full, where it was left unexplained (``profiles``: the sharded one per degree)."""
        if self.unexplained is not None:
            layout, replica = self.unexplained
            why = explain_infeasible(profiles[layout.tp].for_ranks(replica.threads_ranks), replica)
            self.last_error = f"{_named(layout)}: {why}"

    def take(self, order: int, layout: Layout, replica: PlanRequest, plan: Plan) -> None:
        """The layout's plan, kept if it is the best yet (ties: fewer devices, less memory, earlier layout)."""
        step_s = plan.predicted.iteration_s
        self.tried.append((order, (layout, step_s, "")))
        peak = max(s.memory_bytes.peak for s in plan.stages)
        key = (round(step_s, 12), layout.used_devices, peak, order)
        if self.best is None or key < self.best[0]:
            self.best = (key, on_mesh(plan, self.cluster, layout, self.request, replica), layout, replica)


def _branch_and_bound(
    submit: Callable[[_Candidate, float], Future[Plan]], jobs: int, candidates: list[_Candidate], standings: _Standings
) -> None:
    """Search the candidates ``jobs`` at a time (``submit`` starts one's search, to beat a step), each held
    against the best step so far.

    A layout whose bound exceeds the best step found cannot win, or tie, so the answer is the exhaustive
    search's (tests/planner/test_cluster.py holds them equal), whatever the order."""
    queue = iter(candidates)
    running: dict[Future[Plan], tuple[int, Layout, PlanRequest, float]] = {}
    while True:
        for candidate in queue:
            _guess, bound, order, layout, replica = candidate
            if bound == math.inf:
                reason = "does not fit: the parameters' state alone exceeds the devices' memory"
                standings.refuse(order, layout, reason, "the parameters' state alone exceeds the memory")
                continue
            if standings.best is not None and bound > standings.best_s:
                standings.refuse(order, layout, f"pruned: at least {bound:.4g} s")
                continue
            beat_s = standings.best_s
            future = submit(candidate, beat_s)
            running[future] = (order, layout, replica, beat_s)
            if len(running) >= jobs:
                break
        if not running:
            return
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=lambda f: running[f][0]):
            order, layout, replica, beat_s = running.pop(future)
            try:
                plan = future.result()
            except SearchPrunedError:
                standings.refuse(order, layout, f"pruned: no candidate can beat {beat_s:.4g} s")
                continue
            except UnexplainedInfeasibleError as exc:
                standings.refuse(order, layout, str(exc), str(exc), unexplained=replica)
                continue
            except PipeplanError as exc:
                standings.refuse(order, layout, str(exc), str(exc))
                continue
            standings.take(order, layout, replica, plan)


def _cluster_constraints(
    plan: Plan,
    cluster: Cluster,
    request: PlanRequest,
    mesh: MeshSearch,
    tried: list[tuple[Layout, float | None, str]],
) -> dict[str, object]:
    """The plan's constraints with the cluster's and, with tensor parallelism searched, why its degree won."""
    constraints = {
        **plan.constraints,
        "num_devices": cluster.num_devices,
        "devices_per_node": cluster.devices_per_node,
        "intra_node_bytes_per_s": cluster.intra_node_bytes_per_s,
        "inter_node_bytes_per_s": cluster.inter_node_bytes_per_s,
        # Absent for a switched node, so its plans stay as they were written.
        **({"group_link_shares": [list(p) for p in cluster.group_link_shares]} if cluster.group_link_shares else {}),
        "shard": "auto" if mesh.shards else cluster.shard,
        "global_batch_size": request.global_batch_size,
        "layouts_tried": len(tried),
    }
    if mesh.tensor_parallel != 1:  # absent for plans without it, which stay as they were written
        constraints["tensor_parallel"] = "auto" if mesh.tensor_parallel is None else mesh.tensor_parallel
        # The layout modelled: what the runtime refuses unless it runs it, and what the exports carry.
        constraints["sequence_parallel"] = mesh.sequence_parallel
        constraints["vocab_parallel"] = mesh.vocab_parallel
        # Why this degree: the report (and `show`, from the plan file alone) prints each degree's best step.
        outcomes = best_step_per(tried, lambda layout: layout.tp)
        constraints["tensor_parallel_best_s"] = {str(tp): outcome for tp, outcome in outcomes.items()}
    if mesh.collectives != "pipeplan":  # absent for pipeplan's own, so its plans stay as they were written
        constraints["collectives"] = mesh.collectives
    if mesh.shards:
        # Why this sharding, as for the degree: each mode's best step (layouts of one replica count as none).
        constraints["shard_best_s"] = best_step_per(tried, lambda layout: layout.shard)
    return constraints


def best_step_per(
    tried: Iterable[tuple[Layout, float | None, str]], key: Callable[[Layout], Any]
) -> dict[Any, float | str]:
    """Per value of ``key`` (a layout's tensor-parallel degree, its sharding) among the layouts tried, its best
    simulated step, or why it has none: every layout of it was kept out by a lower bound above the best step, or
    none fits (memory or batch)."""
    steps: dict[Any, float | None] = {}
    pruned: set[Any] = set()
    for layout, step, why in tried:
        known = steps.setdefault(key(layout), step)
        if step is not None and (known is None or step < known):
            steps[key(layout)] = step
        if why.startswith("pruned"):
            pruned.add(key(layout))
    return {
        value: step
        if step is not None
        else "pruned: a lower bound above the best step"
        if value in pruned
        else "no plan fits (memory or batch)"
        for value, step in sorted(steps.items())
    }


def _named(layout: Layout) -> str:
    return (
        f"pp={layout.pp} dp={layout.dp}"
        + (f" tp={layout.tp}" if layout.tp > 1 else "")
        + (f" shard {layout.shard}" if layout.shard != "none" else "")
    )
