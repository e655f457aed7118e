"""torch's ``pipeline()`` split of a model, one ``torch.export`` trace shared by every split of it.

``pipeline(model, split_spec=...)`` wraps each split point's forward so that it calls torch's ``pipe_split()``
marker first, exports the model, and cuts the exported graph at the markers (``Pipe._from_traced``). The trace is
most of its cost (gpt2-small: seconds per call on one thread), and a process often splits one model several ways
on the same inputs: the profiler at every unit and then as one piece (the whole model it checks the unit sum
against), a rank at every unit for its speed reference and then at its stages' boundaries.

:func:`split_model` exports with a marker before every point it cuts at, keeps that trace for the model and the
inputs' shapes, and cuts a later split before a subset of those points from the same trace with the other markers
erased: what ``pipeline()`` would have cut with only those markers in the graph, since a marker is a side-effect-only
node that changes nothing else in the trace (``tests/profiles/test_export_split.py`` holds the graphs equal).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch
from torch import nn

__all__ = ["split_model"]


@dataclass(frozen=True)
class _Trace:
    model: weakref.ref[nn.Module]
    inputs: tuple[Any, ...]
    """Each input's (shape, dtype, device), or the value itself where it is not a tensor."""
    marks: tuple[str, ...]
    """The points marked, in the order the trace met their markers (each once)."""
    program: Any  # torch.export.ExportedProgram


_last: _Trace | None = None
"""The last trace: one model's, held until the model is freed or another trace replaces it."""


def _signature(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else t for t in inputs)


def _export_marked(model: nn.Module, inputs: tuple[Any, ...], marks: Sequence[str]) -> tuple[Any, tuple[str, ...]]:
    """``model`` exported with ``pipe_split()`` before each of ``marks``, and the order the trace met them in.

    The forwards are wrapped as torch's ``annotate_split_points`` wraps them, and put back afterwards: a wrapped
    forward wrapped again by a later call would recurse forever (torch 2.13 wraps in place)."""
    from torch.distributed.pipelining import pipe_split
    from torch.export import export

    met: list[str] = []
    saved = {m: model.get_submodule(m).__dict__.get("forward") for m in marks}

    def wrap(module: nn.Module, name: str) -> None:
        inner = module.forward

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            met.append(name)
            pipe_split()
            return inner(*args, **kwargs)

        module.forward = MethodType(forward, module)

    try:
        for m in marks:
            wrap(model.get_submodule(m), m)
        program = export(model, inputs)
    finally:
        for m, forward in saved.items():
            module = model.get_submodule(m)
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward
    return program, tuple(met)


def _pipe(model: nn.Module, program: Any, policy: Any = None) -> Any:
    """``Pipe.from_tracing`` of ``model`` on a trace already taken: torch's own steps after its export (the cut,
    the first stage's signature), with its export step answered by ``program``."""
    from torch.distributed.pipelining._IR import Pipe

    traced = Pipe.__dict__["_trace_with_export"]
    Pipe._trace_with_export = staticmethod(lambda *_, **__: program)
    try:
        return Pipe.from_tracing(model, (), split_policy=policy)
    finally:
        Pipe._trace_with_export = traced


def _cut(model: nn.Module, trace: _Trace, cut_before: set[str]) -> Any:
    """``Pipe`` of ``trace`` cut before ``cut_before`` alone: the other markers erased from a fresh copy of the
    exported graph (``ExportedProgram.module()`` builds one per call, so the trace stays as it was)."""
    from torch.distributed.pipelining._IR import aten_pipe_split_alias

    def keep_cuts(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        markers = [n for n in gm.graph.nodes if (n.op, n.target) == ("call_function", aten_pipe_split_alias)]
        for node, name in zip(markers, trace.marks, strict=True):
            if name not in cut_before:
                gm.graph.erase_node(node)
        gm.recompile()
        return gm

    return _pipe(model, trace.program, keep_cuts)


def _forget(ref: weakref.ref[nn.Module]) -> None:
    """The traced model was freed: so is its trace (it holds the model's parameters)."""
    global _last
    if _last is not None and _last.model is ref:
        _last = None


def split_model(model: nn.Module, inputs: tuple[Any, ...], cut_before: Sequence[str]) -> Any:
    """torch's ``pipeline()`` of ``model`` on ``inputs``, cut before each of ``cut_before`` (a ``Pipe``).

    Cut from the last trace where it is of this model, on inputs of the same shapes, and marked every point of
    ``cut_before`` (none: the model as one piece); traced anew otherwise, with a marker before each point, and
    kept for the next split.

    Raises:
        Whatever ``torch.export`` raises for a model it cannot trace (the caller falls back or says so).
    """
    global _last
    wanted, signature, trace = set(cut_before), _signature(inputs), _last
    if trace is None or trace.model() is not model or trace.inputs != signature or not wanted <= set(trace.marks):
        program, met = _export_marked(model, inputs, tuple(cut_before))
        if sorted(met) != sorted(cut_before):
            # A point called twice or never: its markers cannot be told apart. Cut at every marker, as pipeline()
            # would (the caller counts the pieces and says what is wrong).
            return _pipe(model, program)
        trace = _Trace(weakref.ref(model, _forget), signature, met, program)
        _last = trace
    return _cut(model, trace, wanted)
