"""Units timed in context: inside whole-model forward and backward passes, back to back, with a marker at every
unit boundary, so that the unit times add up to the whole model.

Timed one at a time between two synchronisations, a unit on a GPU pays its kernel launches and the
synchronisation, which a model running end to end hides behind the GPU's work: small units (embeddings, norms,
the loss) pay proportionally most, and on an H200 gpt2-small's units summed 29-64 % over the whole model
(docs/BENCHMARKS.md, "CUDA"). Here the model runs its own forward and backward; a forward pre-hook marks where
each unit's forward begins and a full backward pre-hook where its backward begins (when the gradients of its
outputs are ready), CUDA events on a GPU (recorded on the stream, read after one synchronisation a step) and
the clock on a CPU. A unit's forward runs from its mark to the next unit's (the first from the step's start,
the last to the loss's end); its backward from its mark to the mark of the unit before it (the last unit's
from the backward's start, the first to the backward's end). Whatever runs between units is thus its
neighbour's, as it is in a pipeline stage, and the units sum to the step.

The markers cost something: the step is also timed without them, interleaved with the marked steps, and the
units are scaled by the unmarked step over the marked one, forward and backward apart, so that they sum to
the unmarked model; the markers' cost per step is reported beside them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import ProfilingError

__all__ = ["InContextTimes", "time_in_context"]


@dataclass(frozen=True)
class InContextTimes:
    """Per unit, its forward and backward as it ran inside the whole model (medians over the steps)."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    whole_forward_s: float
    """The whole model's forward and loss, unmarked (the units' forwards sum to it)."""
    whole_backward_s: float
    markers_s: float
    """What the markers added to a step (marked less unmarked, medians), which the units are scaled out of."""
    method: str
    """``cuda-events`` or ``clock``."""


class _Clock:
    """Marks in time: CUDA events on the current stream, or the host clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0 if self.cuda else end - start

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _modules(model: nn.Module, units: Sequence[str]) -> list[nn.Module]:
    try:
        return [model.get_submodule(name) for name in units]
    except AttributeError as exc:
        raise ProfilingError(f"a unit is not a module of the model, so it cannot be marked in context: {exc}") from None


def time_in_context(
    model: nn.Module,
    inputs: tuple[Any, ...],
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    units: Sequence[str],
    device: torch.device,
    *,
    steps: int = 5,
    warmup: int = 2,
) -> InContextTimes:
    """Time each of ``units`` (module names, in execution order) inside ``steps`` whole forward and backward
    passes of ``model`` on ``inputs``, after ``warmup`` untimed ones.

    Raises:
        ProfilingError: a unit is not a module, is not run, runs out of order, or has no backward (its marks
            cannot bracket it): time the units one at a time instead.
    """
    clock = _Clock(device)
    modules = _modules(model, units)
    n = len(modules)
    marks: dict[tuple[str, int], Any] = {}
    marking = [False]

    def forward_mark(k: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any) -> None:
            if marking[0] and ("f", k) not in marks:
                marks["f", k] = clock.mark()

        return hook

    def backward_mark(k: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _grads: Any) -> None:
            if marking[0] and ("b", k) not in marks:
                marks["b", k] = clock.mark()

        return hook

    handles = []
    try:
        for k, module in enumerate(modules):
            handles.append(module.register_forward_pre_hook(forward_mark(k)))
            if k < n - 1:  # the last unit's backward starts with the backward itself
                handles.append(module.register_full_backward_pre_hook(backward_mark(k)))
        for _ in range(warmup):
            _step(model, inputs, target, loss_fn, clock, marks, marking, n)
        plain: list[tuple[float, float, list[float], list[float]]] = []
        marked: list[tuple[float, float, list[float], list[float]]] = []
        for _ in range(steps):  # interleaved: a machine whose speed moves moves both alike
            plain.append(_step(model, inputs, target, loss_fn, clock, marks, marking, 0))
            marked.append(_step(model, inputs, target, loss_fn, clock, marks, marking, n))
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    forward = [statistics.median(m[2][k] for m in marked) for k in range(n)]
    backward = [statistics.median(m[3][k] for m in marked) for k in range(n)]
    plain_forward = statistics.median(p[0] for p in plain)
    plain_backward = statistics.median(p[1] for p in plain)
    marked_forward, marked_backward = sum(forward), sum(backward)
    # Scaled to the unmarked step: the markers' cost spread over the units in proportion to their time.
    scale_forward = plain_forward / marked_forward if marked_forward > 0 else 1.0
    scale_backward = plain_backward / marked_backward if marked_backward > 0 else 1.0
    return InContextTimes(
        forward_s=tuple(f * scale_forward for f in forward),
        backward_s=tuple(b * scale_backward for b in backward),
        whole_forward_s=plain_forward,
        whole_backward_s=plain_backward,
        markers_s=(marked_forward + marked_backward) - (plain_forward + plain_backward),
        method="cuda-events" if clock.cuda else "clock",
    )


def _step(
    model: nn.Module,
    inputs: tuple[Any, ...],
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    clock: _Clock,
    marks: dict[tuple[str, int], Any],
    marking: list[bool],
    n: int,
) -> tuple[float, float, list[float], list[float]]:
    """One forward and backward: its forward and backward time, and with ``n`` units marked (0: unmarked) each
    unit's."""
    marks.clear()
    marking[0] = n > 0
    model.zero_grad(set_to_none=True)
    clock.sync()
    start = clock.mark()
    loss = loss_fn(model(*inputs), target)
    forward_end = clock.mark()
    loss.backward()
    end = clock.mark()
    clock.sync()
    marking[0] = False
    forward_s, backward_s = clock.seconds(start, forward_end), clock.seconds(forward_end, end)
    if n == 0:
        return forward_s, backward_s, [], []
    missing = [k for k in range(n) if ("f", k) not in marks] + [k for k in range(n - 1) if ("b", k) not in marks]
    if missing:
        raise ProfilingError(
            f"unit {missing[0]} was not marked in the whole model's step (not run, or no gradient reaches it): its "
            "time cannot be bracketed in context"
        )
    fwd = [marks["f", k] for k in range(n)] + [forward_end]
    # Backward in execution order: the last unit from the backward's start, then each unit from its own mark.
    bwd_start = [marks["b", k] for k in range(n - 1)] + [forward_end]
    bwd_end = [end] + bwd_start[:-1]
    forwards = [clock.seconds(fwd[k], fwd[k + 1]) for k in range(n)]
    forwards[0] += clock.seconds(start, fwd[0])  # input preparation before the first unit
    backwards = [clock.seconds(bwd_start[k], bwd_end[k]) for k in range(n)]
    if min(forwards) < 0 or min(backwards) < 0:
        raise ProfilingError("the units ran out of order in the whole model's step: they cannot be timed in context")
    return forward_s, backward_s, forwards, backwards
