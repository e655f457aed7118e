"""This process's place in a cluster plan's mesh, its process groups, and its stages' data-parallel wrapping.

A cluster plan (``plan.mesh``) runs ``dp`` replicas of a ``pp``-rank pipeline, each pipeline rank held by
``tp`` consecutive global ranks (planner/plan.py, :class:`~planner.plan.Mesh`). Every process builds one 3-D
``DeviceMesh`` with dimensions ``("dp", "pp", "tp")`` from the plan's ``devices``, in the same order, as torch
requires of new groups: its ``pp`` slices are the pipelines torch's schedules send along, its ``dp`` slices
the replicas that reduce gradients (DDP or FSDP2), its ``tp`` slices the groups that shard a stage's linears
(planner/runtime/tensor_parallel.py). FSDP2 over DTensor-sharded parameters needs the ``dp`` and ``tp``
meshes cut from one root mesh, hence one mesh for all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import ScheduleError
from planner.plan import Plan

__all__ = ["MeshPlace", "mesh_place", "pipelines", "replicated", "has_unused_parameters"]


@dataclass(frozen=True)
class MeshPlace:
    """Where this process sits in the plan's mesh, and the groups it takes part in."""

    replica: int
    pp_rank: int
    tp_rank: int
    pp_group: Any
    """Process group of this pipeline (one global rank per pipeline rank, all at this ``tp_rank``)."""
    replicas: Any
    """1-D ``DeviceMesh`` of this position's replicas: where gradients are reduced."""
    tp_mesh: Any
    """1-D ``DeviceMesh`` of the ``tp`` ranks holding this pipeline rank together."""

    def pipeline_row(self, tp: int) -> int:
        """This process's pipeline among :func:`pipelines`' rows."""
        return self.replica * tp + self.tp_rank


def mesh_place(plan: Plan, device: torch.device) -> MeshPlace:
    """This process's :class:`MeshPlace` in ``plan.mesh``; every process of the world must call it."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh = plan.mesh
    assert mesh is not None
    world = dist.get_world_size()
    if world != mesh.used_devices:
        raise ScheduleError(
            f"the plan's mesh is pp {mesh.pp} x dp {mesh.dp} x tp {mesh.tp} = {mesh.used_devices} processes, "
            f"but the process group has {world}"
        )
    ranks = torch.tensor([[[first + t for t in range(mesh.tp)] for first in row] for row in mesh.devices])
    whole = DeviceMesh(device.type, ranks, mesh_dim_names=("dp", "pp", "tp"))
    me = dist.get_rank()
    replica, pp_rank = mesh.coordinates(me)
    return MeshPlace(replica, pp_rank, mesh.tp_rank(me), whole.get_group("pp"), whole["dp"], whole["tp"])


def pipelines(plan: Plan, group: Any) -> list[list[int]]:
    """Global ranks of every pipeline in the world, by replica then tensor-parallel rank: the plan's mesh, or
    the one ``group``."""
    if plan.mesh is not None:
        return [[first + t for first in row] for row in plan.mesh.devices for t in range(plan.mesh.tp)]
    return [[dist.get_global_rank(group, r) if group is not None else r for r in range(plan.num_ranks)]]


def has_unused_parameters(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bool:
    """Whether a forward on ``inputs`` leaves some parameter of ``module`` out of the autograd graph."""
    params = [p for p in module.parameters() if p.requires_grad]
    with torch.enable_grad():
        out = module(*(t.detach().requires_grad_(t.requires_grad) for t in inputs))
    outs = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not params:
        return bool(params)
    grads = torch.autograd.grad([t.sum() for t in outs], params, allow_unused=True)
    return any(g is None for g in grads)


def replicated(module: nn.Module, plan: Plan, replicas: Any, inputs: tuple[torch.Tensor, ...]) -> nn.Module:
    """The stage as its replicas run it: DDP (``shard`` none or optimizer) or FSDP2 (``full``).

    torch's ``PipelineStage`` knows both: it reduces gradients only on a step's last backward
    (``no_sync`` / ``set_requires_gradient_sync``), as the cost model's step tail assumes.
    """
    assert plan.mesh is not None
    if plan.mesh.shard == "full":
        from torch.distributed.fsdp import fully_shard

        return fully_shard(module, mesh=replicas)
    from torch.nn.parallel import DistributedDataParallel

    if plan.mesh.tp > 1:
        # DDP reduces plain tensors: each sharded linear holds its local shard and rebuilds its DTensors per call.
        from torch.distributed.tensor import DTensor

        from planner.runtime.tensor_parallel import local_parameters

        for name, sub in list(module.named_modules()):
            if any(isinstance(p, DTensor) for p in sub._parameters.values()):
                local_parameters(module, (name,))
    # Same seed on every replica: the weights agree, so DDP need not broadcast buffers every forward.
    # A parameter the stage's forward leaves unused on this input (split_stages drops those its code never
    # reads) gets no gradient: DDP must not wait for one.
    return DistributedDataParallel(
        module,
        process_group=replicas.get_group(),
        broadcast_buffers=False,
        find_unused_parameters=has_unused_parameters(module, inputs),
    )
