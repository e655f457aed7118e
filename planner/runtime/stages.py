"""Cutting a model into pipeline stages that torch's schedules can run.

The split is torch's tracer (``torch.distributed.pipelining.pipeline``) at the plan's split points.
The tracer lets a stage read a value made by any earlier stage (GPT-2's causal mask, a UNet's skip
connections), but torch's schedules only pass tensors between neighbouring stages, so every stage is
wrapped in a :class:`StageModule` that relays such values through the stages in between.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.utils.checkpoint import checkpoint

from planner.errors import ModelMismatchError, PlanFormatError
from profiles.dataflow import run_as_generated_code, used_parameters

__all__ = ["StageModule", "split_stages"]


def _needs_grad(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous and its own: it is sent back to the previous
    stage, and gloo refuses non-contiguous tensors (``torch.cat``'s backward hands out strided slices). A slice
    that is contiguous already (a channel slice at micro-batch size 1) would keep the whole of ``cat``'s
    gradient alive for as long as the send holds it (to the end of the step): unet-small's stages at b = 1 held
    10-14 % more than the gradients they send."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        plain = type(grad) is torch.Tensor  # a DTensor's storage is its shard's
        if plain and grad.is_contiguous() and grad.untyped_storage().nbytes() > grad.numel() * grad.element_size():
            return grad.clone()
        return grad.contiguous()


def _not_a_view(value: Any) -> Any:
    return value.clone() if _needs_grad(value) and value._is_view() else value


class StageModule(nn.Module):
    """One pipeline stage: the traced piece ``inner`` plus the relaying of values later stages read.

    ``forward(*carried)`` takes the values the previous stage hands on (the model's inputs for stage 0)
    and returns the values the next stage needs: the piece's own outputs and relayed inputs. The last
    stage returns the piece's output unchanged (what ``loss_fn`` takes). With ``recompute`` the piece
    runs under ``torch.utils.checkpoint`` (non-reentrant): only its inputs are saved for backward.
    """

    def __init__(
        self,
        inner: nn.Module,
        arg_sources: Sequence[int],
        out_sources: Sequence[tuple[str, int]],
        *,
        tuple_output: bool,
        final: bool,
        recompute: bool = False,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.arg_sources = tuple(arg_sources)
        self.out_sources = tuple(out_sources)
        self.tuple_output = tuple_output
        self.final = final
        self.recompute = recompute

    def forward(self, *carried: Any) -> Any:
        carried = tuple(_ContiguousGrad.apply(t) if _needs_grad(t) else t for t in carried)
        args = [carried[i] for i in self.arg_sources]
        if self.recompute and torch.is_grad_enabled():
            out = checkpoint(self.inner, *args, use_reentrant=False)
        else:
            out = self.inner(*args)
        if self.final:
            return out
        outs = out if self.tuple_output else (out,)
        # gloo sends only contiguous tensors (a getitem or slice may not be). The split-backward schedules'
        # stage_backward_input detaches every stage output in place, which torch refuses for a view (a
        # relayed value needing a gradient is one, through _ContiguousGrad): such an output is a copy.
        result = tuple(
            _not_a_view((carried[i] if kind == "in" else outs[i]).contiguous()) for kind, i in self.out_sources
        )
        return result[0] if len(result) == 1 else result

    def original_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Parameters under the original model's FQNs (the tracer keeps them), duplicates removed."""
        yield from self.inner.named_parameters()


def _stage_value_nodes(gm: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node], dict[fx.Node, int]]:
    """The split graph's placeholders, stage calls, and which stage makes each value (-1: an input)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    producer: dict[fx.Node, int] = {p: -1 for p in placeholders}
    for k, call in enumerate(calls):
        producer[call] = k
        for user in call.users:
            if user.op == "call_function" and user.target is operator.getitem:
                producer[user] = k
    return placeholders, calls, producer


def _relay_stages(gm: fx.GraphModule, recompute: Sequence[bool]) -> list[StageModule]:
    placeholders, calls, producer = _stage_value_nodes(gm)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for call in calls:
        for a in list(call.args) + list(call.kwargs.values()):
            if not isinstance(a, fx.Node) or a not in producer or call.kwargs:
                raise PlanFormatError(
                    f"cannot pipeline this model: stage {call.target} takes an unsupported argument {a!r}"
                )
    # carried[k]: values stage k receives = values made before stage k that stage k or a later one reads.
    carried: list[list[fx.Node]] = [placeholders]
    for k in range(1, len(calls)):
        needed = {a for call in calls[k:] for a in call.args}
        carried.append(sorted((v for v in needed if producer[v] < k), key=order.__getitem__))
    stages = []
    for k, call in enumerate(calls):
        tuple_output = any(u.target is operator.getitem for u in call.users)
        final = k == len(calls) - 1
        out_sources: list[tuple[str, int]] = []
        if not final:
            for v in carried[k + 1]:
                if producer[v] == k:
                    out_sources.append(("out", v.args[1] if v is not call else 0))
                else:
                    out_sources.append(("in", carried[k].index(v)))
        stages.append(
            StageModule(
                gm.get_submodule(call.target),
                [carried[k].index(a) for a in call.args],
                out_sources,
                tuple_output=tuple_output,
                final=final,
                recompute=recompute[k],
            )
        )
    return stages


def split_stages(
    model: nn.Module, mb_inputs: tuple[torch.Tensor, ...], split_points: Sequence[str], recompute: Sequence[bool]
) -> list[StageModule]:
    """Trace ``model`` on one micro-batch and cut it before each of ``split_points``; every stage."""
    from profiles.export_split import split_model

    modules = dict(model.named_modules())
    missing = [p for p in split_points if p not in modules]
    if missing:
        raise ModelMismatchError(f"split points {missing} are not modules of this model: is it the plan's model?")
    # Traced where the weights are: capturing the units for the speed reference moves the model to its device.
    weights = next(model.parameters(), None)
    if weights is not None:
        mb_inputs = tuple(t.to(weights.device) for t in mb_inputs)
    # The trace of the units' capture for the speed reference, where the rank took one on these shapes.
    pipe = split_model(model, mb_inputs, split_points)
    if pipe.num_stages != len(split_points) + 1:
        raise PlanFormatError(
            f"splitting at {list(split_points)} gave {pipe.num_stages} stages, expected {len(split_points) + 1}: "
            "every split point must be a module the forward calls once, in order"
        )
    run_as_generated_code(pipe.split_gm)  # the code path the profiler measured (profiles/dataflow.py)
    stages = _relay_stages(pipe.split_gm, recompute)
    for stage in stages:
        _drop_unread_parameters(stage.inner)
    return stages


def _drop_unread_parameters(piece: nn.Module) -> None:
    """Remove the parameters the piece's code never reads.

    torch's ``pipeline()`` leaves a tied weight's other name in the first piece (GPT-2's ``lm_head.weight``
    beside ``transformer.wte.weight``): a third 150 MB copy that the optimizer stepped and the tied sum
    filled on every step, which the profile, and so the plan, never counted.
    """
    used = used_parameters(piece)
    for name, _ in list(piece.named_parameters(remove_duplicate=False)):
        if name not in used:
            owner, _, leaf = name.rpartition(".")
            del piece.get_submodule(owner)._parameters[leaf]
