"""The :class:`Workload` type: a model with the means to feed it, what every MODEL spec resolves to.

Below the spec resolver (:mod:`profiles.workload`, which re-exports the type): the built-in models
(:mod:`profiles.models`) return a Workload and the resolver looks them up, so the type cannot live with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a model is built, so that the planner's CLI starts fast
    import torch
    from torch import nn

__all__ = ["Workload"]


@dataclass(frozen=True)
class Workload:
    """A model with the means to feed it.

    ``make_batch(batch_size)`` returns ``(inputs, target)``: ``inputs`` a tensor, a tuple of tensors
    passed positionally to ``model``, or a dict of tensors passed by keyword (``input_ids=``,
    ``attention_mask=``); ``target`` is what ``loss_fn(output, target)`` takes. The model may return a
    tensor, a ModelOutput, a dict or a tuple: ``output`` picks the tensor the loss takes, by default
    ``logits`` or else the first tensor (:func:`~profiles.workload.pick_output`).
    :func:`~profiles.workload.adapt_workload` turns such a workload into one whose ``model(*inputs)`` returns a
    tensor, which is what the pipeline splits.
    """

    model: nn.Module
    make_batch: Callable[[int], tuple[Any, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    name: str = ""
    units: tuple[str, ...] | None = None
    """Optional default unit FQNs, in execution order; the profiler finds them when None."""
    output: Callable[[Any], torch.Tensor] | None = None
    """Optional: the model's output -> the tensor ``loss_fn`` takes (default
    :func:`~profiles.workload.pick_output`)."""
    notes: tuple[str, ...] = ()
    """What :func:`~profiles.workload.adapt_workload` (and ``hf:`` configs) did to the model, for the profile
    to say."""
    meta_buffers: Mapping[str, torch.Tensor] | None = None
    """Set by ``load_workload(spec, meta=True)``: the model is on the meta device (no weights held) and
    these are its buffers' real values by FQN, restored when a unit is materialised (profiles/meta.py)."""
    tp_plan: Callable[[nn.Module], Mapping[str, Any]] | None = None
    """Optional, for tensor-parallel plans of a model without a built-in layout: the model ->
    ``{linear FQN: ColwiseParallel() | RowwiseParallel()}`` (torch.distributed.tensor.parallel). The model's
    attention must read its head count from tensor shapes (``view(..., -1, head_dim)``): each rank traces it
    with its share of the heads (planner/runtime/tensor_parallel.py; docs/guide.md)."""
