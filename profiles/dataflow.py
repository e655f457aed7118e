"""Splitting a model into one piece per unit, capturing each piece's real inputs, and the data flow.

``capture_export`` splits with torch's own ``torch.distributed.pipelining.pipeline`` (the executor
splits the same way, so profile and execution agree): code in a parent's forward between two units
lands in one of the pieces, nothing is dropped, and the split graph names every tensor passed between
pieces with its producer and all its consumers (skip connections, GPT-2's attention mask).
``capture_hooks`` is the fallback for models ``torch.export`` cannot trace: forward hooks on the unit
modules; code between units is not attributed and the data flow is assumed to be the chain of units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from planner.errors import ProfilingError
from profiles.export_split import split_model

__all__ = [
    "Piece",
    "Edge",
    "Capture",
    "capture_export",
    "capture_hooks",
    "tensor_bytes",
    "needs_grad",
    "run_as_generated_code",
    "param_ownership",
    "used_parameters",
    "Source",
]


@dataclass(frozen=True)
class Piece:
    """One unit as a runnable module with the real inputs it received in a full forward pass."""

    name: str
    module: nn.Module
    args: tuple[Any, ...]
    """Captured inputs, detached; ``arg_needs_grad`` says which received a gradient-carrying tensor."""
    arg_needs_grad: tuple[bool, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Edge:
    """A tensor passed from one piece (or the model input, -1) to later pieces."""

    producer: int
    consumers: tuple[int, ...]
    nbytes: int
    dtype: str
    needs_grad: bool
    name: str
    shape: tuple[int, ...]


Source = tuple[int, int]
"""Where a value passed to a piece comes from: (producer piece or -1 for the model input, output index or
-1 for a piece's single output)."""


@dataclass(frozen=True)
class Capture:
    mode: str
    """``export`` (split by torch.distributed.pipelining) or ``hooks`` (forward hooks, chain flow)."""
    pieces: tuple[Piece, ...]
    edges: tuple[Edge, ...]
    sources: tuple[tuple[Source | None, ...], ...] = ()
    """Export only: per piece, where each of its arguments comes from (None: a constant). A meta profile
    (profiles/meta_profile.py) feeds each materialised piece the real outputs of the pieces before it."""
    outputs: tuple[tuple[tuple[tuple[int, ...], str], ...], ...] = ()
    """Export only: per piece, the (shape, dtype) of each tensor it returns."""


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def needs_grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _detach(value: Any) -> Any:
    return tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)


def _edge(producer: int, consumers: set[int], t: torch.Tensor, name: str) -> Edge:
    return Edge(
        producer, tuple(sorted(consumers)), tensor_bytes(t), _dtype_name(t), needs_grad(t), name, tuple(t.shape)
    )


def run_as_generated_code(module: nn.Module) -> int:
    """Make the pieces of a ``pipeline()`` split run their generated Python code, not ``torch.fx.Interpreter``.

    torch 2.13 rebuilds each split piece's module hierarchy from ``InterpreterModule``s that run every forward
    node by node through ``torch.fx.Interpreter`` (which also builds a tqdm bar per call). Switching their
    ``_run_with_interpreter`` off runs the same graph as a GraphModule's generated code, the path torch itself
    takes under dynamo: on this CPU gpt2-tiny's pieces went from 17-22 ms to 8-9 ms per forward+backward
    (eager: 9-12 ms), mlp's from 2.9-4.4 ms to 0.8-1.0 ms. The profiler and ``apply_plan`` both call it, so the
    profiled pieces are the pieces that run. Returns how many modules were switched.
    """
    switched = 0
    for sub in module.modules():
        if getattr(sub, "_run_with_interpreter", False) and _codegen_safe(sub):
            sub._run_with_interpreter = False
            switched += 1
    return switched


def _codegen_safe(sub: nn.Module) -> bool:
    """Rename graph nodes called ``self`` so that the generated code can run; False if one cannot be.

    A submodule named ``self`` (BERT's ``attention.self``) becomes a call node named ``self``, and torch
    2.13's code generation then writes ``self = self.self(...)``: the next ``self.output(...)`` reads an
    attribute of a tensor. The interpreter looks nodes up by object and is not affected.
    """
    graph = getattr(sub, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return True
    clashing = [n for n in graph.nodes if n.name == "self"]
    if not clashing:
        return True
    if any(n.op == "placeholder" for n in clashing) or not hasattr(sub, "finalize"):
        return False
    for node in clashing:
        node._rename("self_module")
    sub.finalize()  # regenerate the code from the renamed graph
    return True


def _split_graph(model: nn.Module, inputs: tuple[torch.Tensor, ...], units: list[str]) -> torch.fx.GraphModule:
    """``pipeline()``'s split of ``model`` before every unit but the first, its pieces run as generated code.

    One unit: the model as one piece, cut from the trace the units' split took where it is the last one taken
    (profiles/export_split.py)."""
    pipe = split_model(model, inputs, units[1:])
    gm = pipe.split_gm
    run_as_generated_code(gm)
    return gm


def _record_calls(gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> dict[int, tuple[tuple[Any, ...], Any]]:
    """Run the split graph once: each piece's (inputs, output), in call order."""
    captured: dict[int, tuple[tuple[Any, ...], Any]] = {}

    class _Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            out = super().call_module(target, args, kwargs)
            captured[len(captured)] = (args, out)
            return out

    _Recorder(gm).run(*inputs)
    return captured


def _source_of(
    node: torch.fx.Node, placeholders: dict[torch.fx.Node, int], index: dict[torch.fx.Node, int]
) -> Source | None:
    """Where a value passed between pieces comes from: a placeholder, a piece's single output, or
    ``getitem(piece, j)``; None for anything else."""
    if node in placeholders:
        return (-1, placeholders[node])
    if node in index:
        return (index[node], -1)
    if node.op == "call_function" and node.args and node.args[0] in index:
        return (index[node.args[0]], int(node.args[1]))
    return None


def _edges(
    consumers: dict[Source, set[int]],
    inputs: tuple[torch.Tensor, ...],
    captured: dict[int, tuple[tuple[Any, ...], Any]],
    units: list[str],
) -> tuple[Edge, ...]:
    """The tensors among the values passed between pieces, each with its producer and consumers."""

    def tensor_of(key: Source) -> Any:
        producer, j = key
        if producer == -1:
            return inputs[j]
        out = captured[producer][1]
        return out if j == -1 else out[j]

    edges = []
    for key in sorted(consumers):
        t = tensor_of(key)
        if not isinstance(t, torch.Tensor):
            continue
        producer = key[0]
        name = f"input{key[1]}" if producer == -1 else f"{units[producer]}:out{max(key[1], 0)}"
        edges.append(_edge(producer, consumers[key], t, name))
    return tuple(edges)


def capture_export(model: nn.Module, inputs: tuple[torch.Tensor, ...], units: list[str]) -> Capture:
    """Split ``model`` at every unit but the first with ``pipeline()`` and run it once to capture.

    Raises whatever ``pipeline()`` raises when the model cannot be traced (the caller falls back to
    hooks), and :class:`ProfilingError` when the split does not give one piece per unit.
    """
    gm = _split_graph(model, inputs, units)
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    if len(calls) != len(units):
        raise ProfilingError(
            f"splitting at {len(units)} units gave {len(calls)} pieces: a unit is probably called more than "
            "once or inside another unit; choose other units"
        )
    index = {node: i for i, node in enumerate(calls)}
    captured = _record_calls(gm, inputs)
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    consumers: dict[Source, set[int]] = {}
    for node, i in index.items():
        used: list[torch.fx.Node] = []
        torch.fx.node.map_arg((node.args, node.kwargs), used.append)
        for arg in used:
            key = _source_of(arg, placeholders, index)
            if key is None:
                raise ProfilingError(f"unexpected value {arg.name!r} between pieces of {type(model).__name__}")
            consumers.setdefault(key, set()).add(i)
    pieces = tuple(
        Piece(
            units[i],
            getattr(gm, node.target),
            _detach(captured[i][0]),
            tuple(needs_grad(a) for a in captured[i][0]),
        )
        for i, node in enumerate(calls)
    )
    sources = tuple(
        tuple(_source_of(a, placeholders, index) if isinstance(a, torch.fx.Node) else None for a in node.args)
        for node in calls
    )
    outputs = tuple(
        tuple((tuple(t.shape), _dtype_name(t)) for t in tree_leaves(captured[i][1]) if isinstance(t, torch.Tensor))
        for i in range(len(calls))
    )
    return Capture("export", pieces, _edges(consumers, inputs, captured, units), sources, outputs)


def capture_hooks(model: nn.Module, inputs: tuple[torch.Tensor, ...], units: list[str]) -> Capture:
    """Capture each unit module's first call by forward hooks; the data flow is the chain of units."""
    calls: dict[str, tuple[tuple[Any, ...], dict[str, Any], Any]] = {}
    handles = []
    for unit in units:
        module = model.get_submodule(unit)

        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, _u: str = unit) -> None:
            calls.setdefault(_u, (args, kwargs, out))

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    missing = [u for u in units if u not in calls]
    if missing:
        raise ProfilingError(f"units never called in the forward pass: {', '.join(missing)}")
    pieces = []
    for unit in units:
        args, kwargs, _ = calls[unit]
        pieces.append(
            Piece(unit, model.get_submodule(unit), _detach(args), tuple(needs_grad(a) for a in args), _detach(kwargs))
        )
    edges = [_edge(-1, {0}, t, f"input{j}") for j, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    for i, unit in enumerate(units[:-1]):
        leaves = [t for t in tree_leaves(calls[unit][2]) if isinstance(t, torch.Tensor)]
        edges += [_edge(i, {i + 1}, t, f"{unit}:out{j}") for j, t in enumerate(leaves)]
    return Capture("hooks", tuple(pieces), tuple(edges))


def param_ownership(model: nn.Module, capture: Capture) -> list[tuple[int, int, tuple[str, ...], int, int]]:
    """Per piece: (param_count, param_bytes, tied names, tied count, parameter tensors held).

    A shared parameter counts at its first piece; later pieces that use it count it in ``tied count``,
    because a pipeline stage holding such a piece keeps its own copy.
    """
    by_name = dict(model.named_parameters(remove_duplicate=False))
    users: dict[int, list[int]] = {}
    piece_params: list[dict[int, tuple[torch.Tensor, list[str]]]] = []
    for i, piece in enumerate(capture.pieces):
        params: dict[int, tuple[torch.Tensor, list[str]]] = {}
        # export pieces name parameters by their model FQNs; hooks pieces are the unit modules themselves
        prefix = f"{piece.name}." if capture.mode == "hooks" else ""
        for local, p in piece.module.named_parameters(remove_duplicate=False):
            name = prefix + local
            original = by_name.get(name, p)  # pipeline() may copy a tied weight: identify it by its name
            params.setdefault(id(original), (original, []))[1].append(name)
        for key in params:
            users.setdefault(key, []).append(i)
        piece_params.append(params)
    result = []
    for i, params in enumerate(piece_params):
        count = nbytes = tied_count = 0
        tied: list[str] = []
        for key, (p, names) in params.items():
            if users[key][0] == i:
                count += p.numel()
                nbytes += p.numel() * p.element_size()
            else:
                tied_count += p.numel()
            if len(users[key]) > 1:
                tied += names
        result.append((count, nbytes, tuple(sorted(tied)), tied_count, len(params)))
    return result


def used_parameters(module: nn.Module) -> set[str]:
    """The names of the parameters the piece's code reads (``get_attr``, or a module it calls as it is).

    torch's ``pipeline()`` leaves a tied weight's other name in the first piece (GPT-2's and Llama 3.2's
    embedding pieces also hold ``lm_head.weight``, which nothing there reads): a meta profile makes only what
    the code reads real (profiles/meta.py), and the runtime drops the rest (planner/runtime/apply.py).
    """
    used: set[str] = set()
    called: set[str] = set()
    for sub_name, sub in module.named_modules():
        graph = getattr(sub, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        prefix = f"{sub_name}." if sub_name else ""
        for node in graph.nodes:
            if node.op == "get_attr":
                used.add(prefix + str(node.target))
            elif node.op == "call_module":
                called.add(prefix + str(node.target))
    if not any(isinstance(getattr(sub, "graph", None), torch.fx.Graph) for sub in module.modules()):
        return {name for name, _ in module.named_parameters(remove_duplicate=False)}
    for name in called:
        sub = module.get_submodule(name)
        if not isinstance(getattr(sub, "graph", None), torch.fx.Graph):
            used.update(f"{name}.{leaf}" for leaf, _ in sub.named_parameters(remove_duplicate=False))
    return used
