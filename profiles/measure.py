"""Measuring one piece (a unit, or the whole model) at one micro-batch size.

Each piece runs in isolation on its real captured inputs: a probe iteration (saved-for-backward
bytes, output bytes, CUDA peak), warm-up iterations, then ``repeats`` timed iterations of which the
median is kept. Forward and backward are timed in the same iteration, separately; on CUDA the
device is synchronised around each timer.

Each timed iteration is followed by one with the backward split the way the zero-bubble schedules run
it: torch's own ``stage_backward_input`` (I: the input gradients; it keeps the autograd graph and the
gradients at the parameter groups' boundaries) then ``stage_backward_weight`` (W: the weight gradients
from those kept gradients). A piece whose inputs need no gradient has no I: torch's first stage runs its
whole backward as W, and so is it timed here.
"""

from __future__ import annotations

import logging
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from profiles.cores import untimed_on_every_core
from profiles.dataflow import Piece, needs_grad, tensor_bytes
from profiles.memory import tensor_storages
from profiles.weight_groups import split_input_backward

__all__ = [
    "WARM_BELOW_S",
    "backward_roots",
    "PieceMeasurement",
    "TrackedMemory",
    "measure_piece",
    "count_flops",
    "saved_tensor_bytes",
    "peak_rss_bytes",
]


@dataclass(frozen=True)
class TrackedMemory:
    """A piece's memory by live tensor bytes (:func:`tracked_memory`), in bytes."""

    held_bytes: int
    """What a forward leaves alive until the backward: saved tensors and outputs, each storage once, inputs
    and parameters excluded (the loss's too, for the last unit)."""
    transient_bytes: int
    """The backward's peak above what was live when it began."""
    input_transient_bytes: int
    """The same for I (``stage_backward_input``), above what was live when it began."""
    weight_transient_bytes: int
    """The same for W (``stage_backward_weight``), above what was live when it began (after I)."""


@dataclass(frozen=True)
class PieceMeasurement:
    forward_s: float
    backward_s: float
    output_bytes: int
    saved_bytes: int
    peak_bytes: int | None
    """CUDA only: allocator peak of one forward+backward above what was allocated before it."""
    backward_input_s: float = 0.0
    """I: ``stage_backward_input`` alone (0 when no input needs a gradient)."""
    backward_weight_s: float = 0.0
    """W: ``stage_backward_weight`` after it (the whole backward when no input needs a gradient)."""
    weight_grad_bytes: int = 0
    """Gradients ``stage_backward_input`` keeps for W (at the parameter groups' boundaries), W's own memory
    on top of the saved activations, which the kept graph also holds until W."""
    memory: TrackedMemory | None = None
    """Its memory in a pipeline stage's steady state (:func:`tracked_memory`); None when not measured."""


WARM_BELOW_S = 0.05
"""A piece whose forward+backward takes less than this is timed right after an untimed iteration of its own: the
first iteration after another piece pays a fixed cold cost (caches, the allocator), a tenth of a millisecond or more
on a CPU, which, paid by each of mlp's units, made their sum 1.68x the whole model. A longer piece does not notice it
(gpt2-small's units: under 0.2 % of their sum), and for it an untimed iteration would double the profile's rounds."""


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so a timer read after it counts the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def backward_roots(
    out: Any, loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None, target: torch.Tensor | None
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Where a piece's backward starts: from ``loss_fn(out, target)`` (the last stage computes the loss), else
    from ones on the outputs that need a gradient (``torch.autograd.backward``'s roots and their gradients)."""
    if loss_fn is not None:
        return [loss_fn(out, target)], [None]
    roots = [t for t in tree_leaves(out) if needs_grad(t)]
    return roots, [torch.ones_like(t) for t in roots]


def fresh_args(piece: Piece) -> tuple[Any, ...]:
    """The piece's captured inputs, the gradient-carrying ones as new leaves that require grad."""
    return tuple(
        a.detach().clone().requires_grad_(True) if grad else a
        for a, grad in zip(piece.args, piece.arg_needs_grad, strict=True)
    )


class _SavedBytes:
    """``saved_tensors_hooks`` that sum the storages autograd keeps, each once, parameters excluded."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.exclude and ptr != 0:
            self.storages.setdefault(ptr, storage.nbytes())
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def total_bytes(self) -> int:
        return sum(self.storages.values())


def _state_pointers(module: nn.Module) -> set[int]:
    tensors = list(module.parameters()) + list(module.buffers())
    return {t.untyped_storage().data_ptr() for t in tensors}


def saved_tensor_bytes(module: nn.Module, *args: Any, **kwargs: Any) -> int:
    """Bytes autograd saves for backward in one forward of ``module`` (parameters/buffers excluded)."""
    hooks = _SavedBytes(_state_pointers(module))
    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
        module(*args, **kwargs)
    return hooks.total_bytes


class _BoundKwargs(nn.Module):
    """Adapts ``module(*args, **kwargs)`` to the positional-only call fvcore's tracer makes."""

    def __init__(self, module: nn.Module, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self.kwargs = kwargs

    def forward(self, *args: Any) -> Any:
        return self.module(*args, **self.kwargs)


def _sdpa_flop_handle(inputs: list[Any], outputs: list[Any]) -> int:
    # Q K^T and (softmax) V: B*H*Lq*Lk*(E + Ev) multiply-adds.
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    *batch, lq, e = q
    lk, ev = k[-2], v[-1]
    n = 1
    for d in batch:
        n *= d
    return n * lq * lk * (e + ev)


def count_flops(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> int:
    """Forward multiply-adds counted by fvcore (one per MAC), its warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fvcore's import uses the deprecated torch.jit.script
        from fvcore.nn import FlopCountAnalysis

    target = _BoundKwargs(module, kwargs) if kwargs else module
    logging.getLogger("fvcore").setLevel(logging.ERROR)
    analysis = FlopCountAnalysis(target, args)
    analysis.set_op_handle(
        "aten::scaled_dot_product_attention",
        _sdpa_flop_handle,
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        _sdpa_flop_handle,
    )
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit tracer warnings: fvcore's business, not the user's
        return int(analysis.total())


class _PieceRun:
    """One piece's iterations on fresh copies of its captured inputs: the forward, the whole backward, and the
    backward split into I and W the way the zero-bubble schedules run it (module docstring)."""

    def __init__(
        self,
        piece: Piece,
        device: torch.device,
        loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None,
        target: torch.Tensor | None,
    ) -> None:
        self.args = fresh_args(piece)
        self.module, self.kwargs = piece.module, piece.kwargs
        self.device = device
        self.loss_fn, self.target = loss_fn, target
        self.grads: list[torch.Tensor] | None = None
        self.grad_inputs = [a for a in self.args if isinstance(a, torch.Tensor) and a.requires_grad]

    def forward(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None], Any]:
        """The backward's roots and their gradients (the loss, else fixed random gradients on the outputs that
        need one), and the output."""
        out = self.module(*self.args, **self.kwargs)
        if self.loss_fn is not None:
            return [self.loss_fn(out, self.target)], [None], out
        roots = [t for t in tree_leaves(out) if needs_grad(t)]
        if self.grads is None:
            g = torch.Generator(device="cpu").manual_seed(0)
            self.grads = [torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device) for t in roots]
        return roots, list(self.grads), out

    @staticmethod
    def backward(roots: list[torch.Tensor], root_grads: list[torch.Tensor | None]) -> None:
        """The whole backward; nothing when no output needs a gradient."""
        if roots:
            torch.autograd.backward(roots, root_grads)

    def input_backward(self, roots: list[torch.Tensor], root_grads: list[torch.Tensor | None]) -> Any:
        """I: torch's ``stage_backward_input``; its parameter groups for W (None: no input needs a gradient,
        and W runs the whole backward, as torch's first stage does)."""
        if not self.grad_inputs or not roots:
            return None
        # stage_backward_input detaches its outputs in place, which torch refuses for a view.
        roots = [r.clone() if r._is_view() else r for r in roots]
        return split_input_backward(roots, root_grads, self.grad_inputs, self.module.parameters())

    def weight_backward(self, roots: list[torch.Tensor], root_grads: list[torch.Tensor | None], groups: Any) -> None:
        """W: torch's ``stage_backward_weight`` from I's groups, or the whole backward without them."""
        from torch.distributed.pipelining._backward import stage_backward_weight

        if groups is None:
            self.backward(roots, root_grads)
        else:
            stage_backward_weight(self.module.parameters(), groups)

    def split_backward(
        self, roots: list[torch.Tensor], root_grads: list[torch.Tensor | None]
    ) -> tuple[float, float, int]:
        """Time I then W; and the bytes of the gradients I keeps for W."""
        if not roots:
            return 0.0, 0.0, 0
        sync_device(self.device)
        t0 = time.perf_counter()
        groups = self.input_backward(roots, root_grads)
        sync_device(self.device)
        t1 = time.perf_counter()
        kept_grads = [g for group in groups or () for grads in group.get("grads") or () for g in grads or ()]
        # By storage, each once: a kept gradient may be a slice of a larger one (the gradient of a cat's
        # output, split among its inputs) and holds all of it until W (unet-small's decoder: 4/3 of its bytes).
        storages = {s.data_ptr(): s.nbytes() for g in kept_grads if g is not None for s in tensor_storages(g)}
        kept = sum(storages.values())
        self.weight_backward(roots, root_grads, groups)
        sync_device(self.device)
        return t1 - t0, time.perf_counter() - t1, kept

    def probe(self) -> tuple[int, int, int | None]:
        """One untimed iteration for the memory figures: output bytes, saved-for-backward bytes, and the CUDA
        allocator's peak above what was allocated before it (None off CUDA)."""
        device = self.device
        if device.type == "cuda":
            sync_device(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        hooks = _SavedBytes(_state_pointers(self.module))
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            roots, root_grads, out = self.forward()
        output_bytes = sum(tensor_bytes(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        self.backward(roots, root_grads)
        del roots, root_grads, out
        peak: int | None = None
        if device.type == "cuda":
            sync_device(device)
            peak = torch.cuda.max_memory_allocated(device) - base
        return output_bytes, hooks.total_bytes, peak

    def warm_up(self, iterations: int) -> None:
        """Untimed forwards and backwards."""
        for _ in range(iterations):
            roots, root_grads, _out = self.forward()
            self.backward(roots, root_grads)

    def timed(
        self, repeats: int, split: bool = True
    ) -> tuple[list[float], list[float], list[float], list[float], int, bool]:
        """``repeats`` iterations, each a timed forward and whole backward, then (with ``split``) a forward and its
        backward split into I and W: the four lists of times (I and W: zeros without ``split``), the bytes I keeps
        for W, and whether there was a backward."""
        forward_times, backward_times, input_times, weight_times = [], [], [], []
        kept_bytes = 0
        roots: list[torch.Tensor] = []
        for _ in range(repeats):
            sync_device(self.device)
            t0 = time.perf_counter()
            roots, root_grads, _out = self.forward()
            sync_device(self.device)
            t1 = time.perf_counter()
            self.backward(roots, root_grads)
            sync_device(self.device)
            t2 = time.perf_counter()
            forward_times.append(t1 - t0)
            backward_times.append(t2 - t1)
            if not split:
                input_times.append(0.0)
                weight_times.append(0.0)
                continue
            roots, root_grads, _out = self.forward()
            i_s, w_s, kept_bytes = self.split_backward(roots, root_grads)
            input_times.append(i_s)
            weight_times.append(w_s)
        return forward_times, backward_times, input_times, weight_times, kept_bytes, bool(roots)

    def clear_input_grads(self) -> None:
        """Drop the inputs' gradients: a pipeline stage's input gradient is new for every micro-batch."""
        for a in self.args:
            if isinstance(a, torch.Tensor):
                a.grad = None

    def tracked(self) -> TrackedMemory:
        """The piece's memory in a pipeline stage's steady state (:func:`tracked_memory`)."""
        self.clear_input_grads()
        return tracked_memory(
            self.module,
            self.args,
            self.grads or [],
            self.forward,
            self.backward,
            self.input_backward,
            self.weight_backward,
        )


def measure_piece(
    piece: Piece,
    *,
    device: torch.device,
    repeats: int,
    warmup: int,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
    track_memory: bool = True,
    split: bool = True,
    probe: bool = True,
) -> PieceMeasurement:
    """Time forward and backward of ``piece`` on its captured inputs; median of ``repeats``.

    With ``split`` each iteration also times the backward split into I and W as the zero-bubble schedules run it
    (another forward and backward: half the iteration); without it ``backward_input_s`` and
    ``backward_weight_s`` are 0, for a piece whose split no plan reads (the whole model, a speed reference).

    With ``loss_fn`` the backward starts from ``loss_fn(output, target)`` (the last pipeline stage
    computes the loss); otherwise from fixed random gradients on the float outputs that need grad.
    With ``track_memory`` one more iteration, untimed (on every core of an otherwise idle CPU), measures
    :attr:`PieceMeasurement.memory` (:func:`tracked_memory`).

    With ``probe`` an untimed first iteration measures the bytes (and counts as the first of ``warmup``);
    without it the bytes are 0, for a piece whose bytes were measured already (a profiling round after the
    first).
    """
    run = _PieceRun(piece, device, loss_fn, target)
    output_bytes, saved_bytes, peak = run.probe() if probe else (0, 0, None)
    run.warm_up(max(warmup - 1, 0) if probe else warmup)  # the probe was the first warm-up iteration
    forward_times, backward_times, input_times, weight_times, kept_bytes, has_backward = run.timed(repeats, split)
    memory = None
    if track_memory:
        with untimed_on_every_core(device.type):  # bytes, not time: what it counts is the same at any thread count
            memory = run.tracked()
    run.clear_input_grads()
    piece.module.zero_grad(set_to_none=True)
    return PieceMeasurement(
        forward_s=statistics.median(forward_times),
        backward_s=statistics.median(backward_times) if has_backward else 0.0,
        output_bytes=output_bytes,
        saved_bytes=saved_bytes,
        peak_bytes=peak,
        backward_input_s=statistics.median(input_times) if has_backward else 0.0,
        backward_weight_s=statistics.median(weight_times) if has_backward else 0.0,
        weight_grad_bytes=kept_bytes,
        memory=memory,
    )


def tracked_memory(
    module: nn.Module,
    args: tuple[Any, ...],
    root_grads: list[torch.Tensor],
    forward: Callable[[], tuple[list[torch.Tensor], list[torch.Tensor | None], Any]],
    backward: Callable[[list[torch.Tensor], list[torch.Tensor | None]], None],
    input_backward: Callable[[list[torch.Tensor], list[torch.Tensor | None]], Any],
    weight_backward: Callable[[list[torch.Tensor], list[torch.Tensor | None], Any], None],
) -> TrackedMemory:
    """A piece's memory in the steady state a pipeline stage is in, by live tensor bytes
    (:class:`profiles.memory.LiveBytes`, the tracker verify measures stages with): one forward and backward,
    then one forward and its backward split into I and W.

    Before them, the parameters have their gradients (accumulated by the iterations before), and the inputs
    and the gradients the backward starts from exist: all held by the stage anyway. ``held``: what the forward
    leaves alive (saved tensors and outputs, the loss's for the last unit). Each transient: the action's peak
    above what was live when it began: the gradients flowing through the unit, its input's gradient, the weight
    gradients before they are added to those accumulated, and the operators' temporaries.
    """
    from profiles.memory import LiveBytes

    tracker = LiveBytes(default_owner=0)
    tracker.register(module.parameters(), 0, "weights")
    tracker.register(module.buffers(), 0, "weights")
    tracker.register((p.grad for p in module.parameters() if p.grad is not None), 0, "grads")
    tracker.register((a for a in args if isinstance(a, torch.Tensor)), 0, "buffers")
    tracker.register(root_grads, 0, "buffers")

    def grow(action: Callable[..., Any], *action_args: Any) -> tuple[Any, int]:
        """Run ``action`` as a backward; its result and its peak above the live bytes before it."""
        before = tracker.live(0).total_bytes
        tracker.reset_peaks()
        with tracker.acting(0, "transient"):
            result = action(*action_args)
        return result, tracker.peak(0).total_bytes - before

    with tracker:
        start = tracker.live(0).total_bytes
        with tracker.acting(0, "activations"):
            first = forward()
        held = tracker.live(0).total_bytes - start
        _, transient = grow(backward, first[0], first[1])
        del first
        for a in args:
            if isinstance(a, torch.Tensor):
                a.grad = None
        with tracker.acting(0, "activations"):
            second = forward()
        groups, input_transient = grow(input_backward, second[0], second[1])
        _, weight_transient = grow(weight_backward, second[0], second[1], groups)
        del second, groups
    return TrackedMemory(held, transient, input_transient, weight_transient)


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (``ru_maxrss``: Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
