"""What both runtimes set up from a plan the same way: the optimizer the plan was made for
(:func:`make_optimizer`) and the model's units captured as its profile captured them (:func:`captured_units`),
the speed reference of a replay (:mod:`planner.runtime.replay`) and of each rank (:mod:`planner.runtime.rank_timing`).

Below both runtimes, so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

import torch

from planner.plan import Plan
from profiles.dataflow import Piece
from profiles.model_reference import unit_pieces
from profiles.workload import Workload, as_tuple

__all__ = ["make_optimizer", "captured_units"]


def make_optimizer(name: str, params: list[torch.nn.Parameter], replicas: Any = None) -> torch.optim.Optimizer:
    """The optimizer a plan was made for: ``adam`` (Adam, lr 1e-4) or ``sgd`` (SGD with momentum 0.9);
    with ``replicas`` (a cluster plan sharding the optimizer, ZeRO-1) torch's ZeroRedundancyOptimizer."""
    cls, options = (
        (torch.optim.SGD, {"lr": 1e-4, "momentum": 0.9}) if name == "sgd" else (torch.optim.Adam, {"lr": 1e-4})
    )
    if replicas is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=replicas, **options)
    return cls(params, **options)


def captured_units(plan: Plan, workload: Workload, dev: torch.device) -> tuple[tuple[Piece, ...], torch.Tensor] | None:
    """Every unit of the model at the plan's micro-batch size, captured as its profile captured them, and the
    micro-batch's target; None where the plan does not record the profile's unit sum (a meta profile, or a plan
    without ``device.unit_sum_s``). Before the model is split into stages."""
    if plan.profile_unit_sum_s is None:
        return None
    inputs, target = workload.make_batch(plan.micro_batch_size)
    inputs = tuple(t.to(dev) for t in as_tuple(inputs))
    units = [u for stage in plan.stages for u in stage.units]
    pieces = unit_pieces(workload.model.to(dev), inputs, str(plan.device["capture"]), units)
    return pieces, target.to(dev)
