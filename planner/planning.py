"""Plan a profile: the one call ``pipeplan plan`` makes, for the command line and the Python API alike.

:func:`plan_profile` takes the options as the command declares them (:class:`~planner.request.PlanOptions`,
and :class:`~planner.request.ClusterOptions` for a ``pp x tp x dp`` mesh), builds the checked request (narrowed
to a trainer's rules with ``trainer``), searches, and returns the plan with what the search learned beside it.
It sits above the search, the cluster search and the trainers' rules, and nothing below imports it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.cluster import Cluster, ClusterResult, MeshSearch, default_cluster, plan_cluster
from planner.cost import SHARDING
from planner.errors import PipeplanWarning
from planner.plan import Plan
from planner.request import ClusterOptions, PlanOptions, PlanRequest, plan_request, profile_sha256
from planner.search import fewer_ranks_faster, make_plan
from profiles.device_model import recorded_device_model
from profiles.format import Profile, load_profile

__all__ = ["Planned", "plan_profile", "request_for", "cluster_devices"]


@dataclass(frozen=True)
class Planned:
    """A plan and what its search found beside it."""

    plan: Plan
    cluster: ClusterResult | None = None
    """A cluster plan's search: every layout tried (None for one pipeline)."""
    fewer_ranks: tuple[int, float] | None = None
    """``(ranks, iteration_s)`` of half as many ranks where that predicts faster (one pipeline only)."""


def request_for(profile: Profile, search: PlanOptions, *, cluster: bool = False) -> PlanRequest:
    """The search request of ``plan`` and ``tune``: the options' (:func:`~planner.request.plan_request`),
    narrowed to what ``search.trainer`` runs (``--for``)."""
    request = plan_request(profile, search, cluster=cluster)
    if not search.trainer:
        return request
    from planner.trainer_rules import for_trainer  # here: the trainers' exporters load only for `--for`

    return for_trainer(profile, request, search.trainer)


def plan_profile(
    profile: Profile | str | Path,
    search: PlanOptions,
    cluster: ClusterOptions | None = None,
    *,
    sha256: str | None = None,
    record_timing: bool = False,
    renames: Sequence[tuple[str, str]] = (),
) -> Planned:
    """The best plan for ``profile`` (a :class:`Profile`, or the path of its JSON) under ``search``, over the
    devices of ``cluster`` when it names them (``cluster.devices``), else one pipeline of ``search.ranks``.

    ``sha256`` is the profile file's digest the plan records (default: the file's, when given a path);
    ``renames`` map the module names onto ``search.trainer``'s where its exporter checks them (``check``).
    Raises what the request's checks and the search raise (``UsageError``, ``PlanInfeasibleError``, ...).
    """
    if not isinstance(profile, Profile):
        path = profile
        profile = load_profile(path)  # first: the reader refuses what is not a regular file (a FIFO would block)
        sha256 = sha256 or profile_sha256(path)
    if cluster is None or cluster.devices is None:
        request = request_for(profile, search)
        if not profile.timed_for_ranks(request.num_ranks):
            warnings.warn(
                f"this CPU profile timed the threads each rank of a pipeline gets on its machine; {request.num_ranks} "
                f"rank(s) get {profile.rank_threads(request.num_ranks)}, which it did not time, so their times are "
                f"taken as profiled (pipeplan profile --ranks {request.num_ranks} times them)",
                PipeplanWarning,
                stacklevel=2,
            )
        plan = make_plan(profile, request, sha256=sha256, record_timing=record_timing)
        if search.trainer:
            _check_trainer(plan, search.trainer, renames)
        return Planned(plan, fewer_ranks=fewer_ranks_faster(profile, request, plan))
    result = _plan_mesh(profile, search, cluster, sha256=sha256, record_timing=record_timing)
    if search.trainer:
        _check_trainer(result.plan, search.trainer, renames)
    return Planned(result.plan, cluster=result)


def _check_trainer(plan: Plan, trainer: str, renames: Sequence[tuple[str, str]]) -> None:
    from planner.trainer_rules import check_trainer

    check_trainer(plan, trainer, renames)


def cluster_devices(profile: Profile, cluster: ClusterOptions, latency_s: float | None) -> Cluster:
    """``cluster``'s devices, with the links of the profile's device kind where none is given (a modelled
    profile's: its device model's node and links)."""
    assert cluster.devices is not None
    device = recorded_device_model(profile.settings)
    # The device model's node layout goes with its own bandwidth, not with one given on the command line; its
    # NVLink is taken at NCCL's rate, a bandwidth given as what the collectives get (nccl-tests' bus bandwidth).
    shares = () if cluster.intra_node_bytes_per_s or device is None else device.group_link_shares
    return default_cluster(
        profile.device.kind,
        cluster.devices,
        devices_per_node=cluster.devices_per_node or (device.devices_per_node if device else None),
        intra_node_bytes_per_s=cluster.intra_node_bytes_per_s
        or (device.intra_node_ring_bytes_per_s if device else None),
        inter_node_bytes_per_s=cluster.inter_node_bytes_per_s or (device.inter_node_bytes_per_s if device else None),
        latency_s=latency_s,
        shard="none" if cluster.shard == "auto" else cluster.shard,
        group_link_shares=shares,
    )


def trainer_collectives(trainer: str | None) -> dict[str, Any]:
    """:class:`MeshSearch`'s collectives for the runtime that runs the plan: pipeplan's (none given, or
    ``pipeplan``: the defaults), or the trainer's, named."""
    if not trainer or trainer == "pipeplan":
        return {}
    from planner.trainer_rules import TRAINER_COLLECTIVES, Trainer

    switches = TRAINER_COLLECTIVES[Trainer.parse(trainer)]
    return {"collectives": trainer, **switches} if switches["trainer_collectives"] else {}


def _shards_searched(trainer: str | None) -> tuple[str, ...]:
    """``--shard auto``: every mode pipeplan's runtime runs, or those of the trainer the plan is made for or
    costed as (``--collectives``)."""
    if not trainer or trainer == "pipeplan":
        return SHARDING
    from planner.trainer_rules import TRAINER_SHARDING, Trainer

    return TRAINER_SHARDING[Trainer.parse(trainer)]


def _plan_mesh(
    profile: Profile, search: PlanOptions, cluster: ClusterOptions, *, sha256: str | None, record_timing: bool
) -> ClusterResult:
    """The cluster search over ``cluster``'s devices, with the links of its device kind where none is given."""
    assert cluster.devices is not None
    request = request_for(profile, search, cluster=True)  # its checks before the cluster's, as the CLI reads them
    devices = cluster_devices(profile, cluster, search.link_latency_s)
    mesh = MeshSearch(
        pipeline_degree=search.ranks,
        tensor_parallel=None if cluster.tensor_parallel == "auto" else cluster.tensor_parallel or 1,
        attention_heads=cluster.attention_heads,
        # The modes of whoever runs the plan: the --for trainer, else the one it is costed as.
        shards=_shards_searched(search.trainer or cluster.collectives_of(None)) if cluster.shard == "auto" else (),
        **cluster.tp_switches(search.trainer),
        **trainer_collectives(cluster.collectives_of(search.trainer)),
    )
    return plan_cluster(
        profile,
        request,
        devices,
        mesh,
        sha256=sha256,
        record_timing=record_timing,
        jobs=cluster.jobs or os.cpu_count() or 1,
    )
