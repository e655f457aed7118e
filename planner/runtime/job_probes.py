"""The links and collectives of a plan's mesh, timed on the job's processes after verify's timed steps.

A pipeline step mixes link time into the waits (bubble and transfer alike), and DDP's gradient all-reduce into
the last backward; timed on their own, each pipeline hop and each mesh dimension's all-reduce says what the links
between these nodes cost, beside what the plan assumed (its hop and ring links, planner/plan.py ``Mesh``).

Every rank calls :func:`probe_links` and :func:`probe_allreduce` in the same order (they create groups and
exchange messages); each returns this rank's own timings, which rank 0 gathers.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from planner.plan import Plan

__all__ = ["PROBE_MAX_BYTES", "PROBE_REPEATS", "pipeline_hops", "mesh_groups", "probe_links", "probe_allreduce"]

PROBE_MAX_BYTES = 64 * 2**20
"""The largest tensor a probe sends: enough to read a link's bandwidth, small beside a model's own memory."""
PROBE_REPEATS = 5
"""Timed repeats of each probe after one untimed (the median is kept)."""


def pipeline_hops(plan: Plan) -> list[tuple[int, int, int]]:
    """Every hop a stage's output takes to the next stage's rank, as global ``(src, dst, bytes)``: per replica
    and tensor-parallel rank, in that order; a hop that several stage pairs share is listed once."""
    rows = (
        [[first + t for first in row] for row in plan.mesh.devices for t in range(plan.mesh.tp)]
        if plan.mesh is not None
        else [list(range(plan.num_ranks))]
    )
    hops: dict[tuple[int, int], int] = {}
    for row in rows:
        for stage, following in zip(plan.stages, plan.stages[1:], strict=False):
            if stage.rank != following.rank:
                hops.setdefault((row[stage.rank], row[following.rank]), int(stage.send_bytes))
    return [(src, dst, size) for (src, dst), size in hops.items()]


def mesh_groups(plan: Plan) -> list[tuple[str, tuple[int, ...]]]:
    """The groups of each mesh dimension that has more than one member: ``dp`` (a position's replicas) and ``tp``
    (a pipeline rank's tensor-parallel group), as ``(dimension, global ranks)``."""
    mesh = plan.mesh
    if mesh is None:
        return []
    groups: list[tuple[str, tuple[int, ...]]] = []
    if mesh.dp > 1:
        for p in range(mesh.pp):
            for t in range(mesh.tp):
                groups.append(("dp", tuple(mesh.devices[r][p] + t for r in range(mesh.dp))))
    if mesh.tp > 1:
        groups.extend(("tp", mesh.tp_group(r, p)) for r in range(mesh.dp) for p in range(mesh.pp))
    return groups


def _buffer(num_bytes: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(max(1, min(num_bytes, PROBE_MAX_BYTES) // 4), dtype=torch.float32, device=device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_links(plan: Plan, rank: int, device: torch.device) -> list[tuple[int, int, int, float]]:
    """The hops this rank sends on (:func:`pipeline_hops`), each timed as the tensor sent and a one-element reply
    received (median of :data:`PROBE_REPEATS`): ``(src, dst, bytes, seconds)``. The hops run one after another,
    every rank walking the same list, so no two share the links at once."""
    mine = []
    reply = torch.zeros(1, device=device)
    for src, dst, size in pipeline_hops(plan):
        if rank not in (src, dst):
            continue
        data = _buffer(size, device)
        times = []
        for _ in range(PROBE_REPEATS + 1):
            if rank == src:
                t0 = time.perf_counter()
                dist.send(data, dst)
                dist.recv(reply, dst)
                _sync(device)
                times.append(time.perf_counter() - t0)
            else:
                dist.recv(data, src)
                dist.send(reply, src)
        if rank == src:
            mine.append((src, dst, data.numel() * 4, statistics.median(times[1:])))
    dist.barrier()
    return mine


def probe_allreduce(
    plan: Plan, rank: int, grad_bytes: int, device: torch.device
) -> list[tuple[str, tuple[int, ...], int, float]]:
    """An all-reduce of this rank's gradient bytes over its group of each mesh dimension (:func:`mesh_groups`),
    every group of a dimension at once, as training reduces them: ``(dimension, ranks, bytes, seconds)``, the
    median of :data:`PROBE_REPEATS`. A group's members all-reduce the largest of their sizes."""
    mine = []
    for dimension in ("dp", "tp"):
        groups = [ranks for dim, ranks in mesh_groups(plan) if dim == dimension]
        # Every rank creates every group, in the same order, as torch requires.
        handles = [(ranks, dist.new_group(list(ranks))) for ranks in groups]
        for ranks, group in handles:
            if rank not in ranks:
                continue
            size = torch.tensor([min(grad_bytes, PROBE_MAX_BYTES)], device=device)
            dist.all_reduce(size, op=dist.ReduceOp.MAX, group=group)
            data = _buffer(int(size.item()), device)
            times = []
            for _ in range(PROBE_REPEATS + 1):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                dist.all_reduce(data, group=group)
                _sync(device)
                times.append(time.perf_counter() - t0)
            mine.append((dimension, ranks, data.numel() * 4, statistics.median(times[1:])))
        dist.barrier()
    return mine
