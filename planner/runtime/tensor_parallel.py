"""Tensor parallelism inside a pipeline stage: which linears are split over a plan's ``tp`` ranks, and how.

A plan with ``mesh.tp > 1`` runs each stage on a group of ``tp`` processes. Each stage's projections are
sharded with torch's own ``parallelize_module``: Megatron's layout, a column-wise linear (``ColwiseParallel``:
each rank computes some output features, whole attention heads) feeding a row-wise one (``RowwiseParallel``:
each rank multiplies its slice of the input, one all-reduce sums them), so that a block costs one all-reduce in
the forward and one in the backward per pair, and everything between (norms, residuals, embeddings, the LM
head) stays replicated on the group.

Stages are pieces of a graph traced by torch's ``pipeline()`` (planner/runtime/apply.py), and a traced graph
bakes in the shapes it saw: GPT-2's attention splits its fused q/k/v output at ``split_size`` and Llama's
``repeat_kv`` expands to the key/value head count, as numbers. So the model is traced as one rank sees it:
:func:`local_shapes` swaps each sharded linear for one of its local size (and divides the head counts the
attention module keeps) for the duration of the trace. Each of this rank's pieces then gets the whole linear
back (:func:`shard_stage`) and ``parallelize_module`` shards it; its hooks turn the replicated input into a
DTensor and hand the local output back, which is what the local graph around it expects.

Layouts: :func:`tp_layout` finds the built-in ones by module structure (Llama-style ``q/k/v/o_proj`` and
``gate/up/down_proj``, GPT-2's ``Conv1D`` ``c_attn``/``c_proj``/``c_fc``, BERT's ``query/key/value`` and
``dense``, ``fc1``/``fc2`` MLPs as ViT's), or takes a Workload's ``tp_plan`` hook for any other model; a
model with neither is refused with :class:`~planner.errors.TensorParallelError`.

GPT-2's ``Conv1D`` keeps its weight as ``(in, out)``, the transpose of ``nn.Linear``'s, and its ``c_attn`` packs
q, k and v along the output: the whole linear given back to a piece is an ``nn.Linear`` (weight transposed)
whose output rows are reordered so that rank t's block is ``[q_t | k_t | v_t]``, whole heads of each.
:func:`original_gradient` undoes both for comparing gradients with the unsharded model.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import TensorParallelError, UsageError
from planner.plan import Plan
from planner.tensor_parallel import planned_switches

__all__ = [
    "ShardedLinear",
    "TensorParallelLayout",
    "TpPlanHook",
    "check_runtime_layout",
    "tp_layout",
    "builtin_tp_plan",
    "local_shapes",
    "shard_stage",
    "original_gradient",
    "local_parameters",
    "as_dtensor",
]

TpPlanHook = Callable[[nn.Module], Mapping[str, Any]]
"""A Workload's ``tp_plan``: the model -> ``{module FQN: ColwiseParallel() | RowwiseParallel()}``."""


@dataclass(frozen=True)
class ShardedLinear:
    """One linear split over the tensor-parallel ranks."""

    fqn: str
    rowwise: bool
    """Row-wise: the input features are split (the output is summed over the ranks); else the output features."""
    parts: int = 1
    """The output packs this many equal blocks, each split over the ranks (GPT-2's fused q, k, v: 3)."""
    transposed: bool = False
    """The module keeps its weight as ``(in, out)`` (HF ``Conv1D``)."""

    def style(self) -> Any:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return RowwiseParallel() if self.rowwise else ColwiseParallel()


@dataclass(frozen=True)
class TensorParallelLayout:
    """What a model shards over ``tp`` ranks: its linears, and the head counts its attention modules keep."""

    tp: int
    linears: tuple[ShardedLinear, ...]
    attributes: tuple[tuple[str, str, int], ...] = ()
    """``(module FQN, attribute, value for one rank)``: what an attention module reads in its forward."""
    source: str = "built-in"
    """``built-in`` or ``tp_plan`` (the Workload's hook)."""

    def linear(self, fqn: str) -> ShardedLinear | None:
        return next((s for s in self.linears if s.fqn == fqn), None)


def check_runtime_layout(plan: Plan) -> None:
    """Refuse a tensor-parallel plan modelled for a layout this runtime does not run: its predicted memory and
    times would be another runtime's (sequence parallelism, or the embedding and head split by vocabulary).

    Raises:
        UsageError: the plan's ``constraints`` record sequence or vocabulary parallelism (a plan without the
            fields is read as Megatron's layout, the one such plans were planned with).
    """
    if plan.mesh is None or plan.mesh.tp == 1:
        return
    sequence, vocab = planned_switches(plan.constraints)
    if sequence or vocab:
        switches = (("sequence parallelism", sequence), ("a vocabulary-parallel embedding and head", vocab))
        what = " and ".join(w for w, on in switches if on)
        raise UsageError(
            f"the plan models Megatron's tensor-parallel layout ({what}), which pipeplan's runtime does not run (it "
            "splits the blocks only): export it to Megatron or torchtitan, or re-plan with --tp-layout blocks"
        )


def _is_conv1d(module: nn.Module) -> bool:
    # HF's Conv1D (transformers.pytorch_utils), by name: transformers is not a dependency of the runtime.
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def _features(module: nn.Module) -> tuple[int, int]:
    """``(in, out)`` features of an ``nn.Linear`` or HF ``Conv1D``."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return int(module.nx), int(module.nf)


def _children(module: nn.Module, names: tuple[str, ...], kind: Callable[[nn.Module], bool]) -> bool:
    return all(kind(getattr(module, n, None)) for n in names)  # type: ignore[arg-type]


def _linear(m: nn.Module | None) -> bool:
    return isinstance(m, nn.Linear)


def _conv1d(m: nn.Module | None) -> bool:
    return m is not None and _is_conv1d(m)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _heads(fqn: str, out_features: int, head_dim: int, tp: int, what: str) -> int:
    heads, rest = divmod(out_features, head_dim)
    if rest or heads % tp:
        raise TensorParallelError(
            f"{fqn} has {out_features / head_dim:g} {what} heads of {head_dim}: tensor parallelism {tp} needs a "
            f"head count divisible by {tp}; plan with --tensor-parallel dividing it"
        )
    return heads


def _builtin_layout(model: nn.Module, tp: int) -> tuple[list[ShardedLinear], list[tuple[str, str, int]]]:
    linears: list[ShardedLinear] = []
    attrs: list[tuple[str, str, int]] = []
    for fqn, m in model.named_modules():
        at = functools.partial(_join, fqn)
        if _children(m, ("q_proj", "k_proj", "v_proj", "o_proj"), _linear):  # Llama, Mistral, Qwen2, Mixtral
            head_dim = getattr(m, "head_dim", None)
            if isinstance(head_dim, int) and head_dim > 0:
                _heads(fqn, m.q_proj.out_features, head_dim, tp, "query")
                _heads(fqn, m.k_proj.out_features, head_dim, tp, "key/value")
            # Llama (and ViT, the same shape in transformers 5) read their head counts from the shapes
            # (view(..., -1, head_dim)); a count kept as an attribute is divided all the same, for any reader.
            linears += [ShardedLinear(at(n), rowwise=False) for n in ("q_proj", "k_proj", "v_proj")]
            linears.append(ShardedLinear(at("o_proj"), rowwise=True))
            attrs += [(fqn, a, int(getattr(m, a)) // tp) for a in ("num_attention_heads", "num_heads") if hasattr(m, a)]
        elif _children(m, ("gate_proj", "up_proj", "down_proj"), _linear):
            linears += [ShardedLinear(at("gate_proj"), False), ShardedLinear(at("up_proj"), False)]
            linears.append(ShardedLinear(at("down_proj"), rowwise=True))
        elif _children(m, ("fc1", "fc2"), _linear):  # ViT's (transformers 5) and CLIP's MLP
            linears += [ShardedLinear(at("fc1"), rowwise=False), ShardedLinear(at("fc2"), rowwise=True)]
        elif _children(m, ("c_attn", "c_proj"), _conv1d) and hasattr(m, "split_size"):  # GPT-2 attention
            if getattr(m, "q_attn", None) is not None:
                continue  # cross-attention (an encoder-decoder GPT-2): its q/kv split differs; left replicated
            heads = int(m.num_heads)
            _heads(fqn, heads * int(m.head_dim), int(m.head_dim), tp, "attention")
            linears.append(ShardedLinear(at("c_attn"), rowwise=False, parts=3, transposed=True))
            linears.append(ShardedLinear(at("c_proj"), rowwise=True, transposed=True))
            # split_size: where the fused output is cut into q, k, v (the traced graph bakes it in).
            attrs += [(fqn, "split_size", int(m.split_size) // tp), (fqn, "num_heads", heads // tp)]
            attrs.append((fqn, "embed_dim", int(m.embed_dim) // tp))
        elif _children(m, ("c_fc", "c_proj"), _conv1d):  # GPT-2 MLP
            linears.append(ShardedLinear(at("c_fc"), rowwise=False, transposed=True))
            linears.append(ShardedLinear(at("c_proj"), rowwise=True, transposed=True))
        elif _children(m, ("query", "key", "value"), _linear) and hasattr(m, "num_attention_heads"):  # BERT
            heads = int(m.num_attention_heads)
            _heads(fqn, m.query.out_features, m.query.out_features // heads, tp, "attention")
            linears += [ShardedLinear(at(n), rowwise=False) for n in ("query", "key", "value")]
            attrs.append((fqn, "num_attention_heads", heads // tp))
            if hasattr(m, "all_head_size"):
                attrs.append((fqn, "all_head_size", int(m.all_head_size) // tp))
            # The projection after it: the sibling ``output.dense`` (BertAttention; ViT before transformers 5).
            parent, _, _ = fqn.rpartition(".")
            dense = _join(parent, "output.dense") if parent else "output.dense"
            if isinstance(_submodule(model, dense), nn.Linear):
                linears.append(ShardedLinear(dense, rowwise=True))
        elif isinstance(_submodule(m, "intermediate.dense"), nn.Linear) and isinstance(
            _submodule(m, "output.dense"), nn.Linear
        ):  # BERT's MLP (ViT's before transformers 5): intermediate.dense, then the layer's output.dense
            linears.append(ShardedLinear(at("intermediate.dense"), rowwise=False))
            linears.append(ShardedLinear(at("output.dense"), rowwise=True))
    return linears, attrs


def _submodule(model: nn.Module, fqn: str) -> nn.Module | None:
    try:
        return model.get_submodule(fqn)
    except AttributeError:
        return None


def _from_hook(model: nn.Module, hook: TpPlanHook) -> list[ShardedLinear]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out = []
    for fqn, style in dict(hook(model)).items():
        module = _submodule(model, fqn)
        if module is None or not (isinstance(module, nn.Linear) or _is_conv1d(module)):
            kind = "no module" if module is None else type(module).__name__
            raise TensorParallelError(
                f"tp_plan shards {fqn!r} ({kind}): pipeplan shards nn.Linear (or HF Conv1D) modules only"
            )
        # The stage is traced with local shapes around each linear: the styles must hand local tensors in
        # and out as the defaults do (replicated input, split features, or split input, replicated output).
        if isinstance(style, RowwiseParallel):
            default = style.input_layouts == (Shard(-1),) and style.output_layouts == (Replicate(),)
        elif isinstance(style, ColwiseParallel):
            default = style.input_layouts == (Replicate(),) and style.output_layouts == (Shard(-1),)
        else:
            raise TensorParallelError(
                f"tp_plan gives {fqn!r} a {type(style).__name__}: pipeplan applies ColwiseParallel() and "
                "RowwiseParallel() only"
            )
        if not default or not style.use_local_output:
            raise TensorParallelError(
                f"tp_plan gives {fqn!r} a {type(style).__name__} with other layouts: pipeplan applies the "
                "default ColwiseParallel() and RowwiseParallel() only"
            )
        out.append(ShardedLinear(fqn, rowwise=isinstance(style, RowwiseParallel), transposed=_is_conv1d(module)))
    return out


def tp_layout(model: nn.Module, tp: int, hook: TpPlanHook | None = None) -> TensorParallelLayout:
    """The layout that splits ``model`` over ``tp`` ranks: the Workload's ``hook`` if given, else built in.

    Raises:
        TensorParallelError: no layout (neither built in nor a hook), a head count or feature count that
            ``tp`` does not divide, or a hook naming something other than a linear with a default style.
    """
    if hook is not None:
        linears, attrs, source = _from_hook(model, hook), [], "tp_plan"
    else:
        linears, attrs = _builtin_layout(model, tp)
        source = "built-in"
    if not linears:
        raise TensorParallelError(
            f"{type(model).__name__} has no tensor-parallel layout: built-in ones cover Llama-style, GPT-2, BERT "
            "and ViT blocks; give the Workload a tp_plan (docs/guide.md, Tensor parallelism) or plan without "
            "--tensor-parallel"
        )
    for s in linears:
        fan_in, fan_out = _features(model.get_submodule(s.fqn))
        split = fan_in if s.rowwise else fan_out // s.parts
        if split % tp or (not s.rowwise and fan_out % s.parts):
            raise TensorParallelError(
                f"{s.fqn} splits {split} {'input' if s.rowwise else 'output'} features over tensor parallelism "
                f"{tp}: they must divide evenly; plan with --tensor-parallel dividing {split}"
            )
    return TensorParallelLayout(tp, tuple(linears), tuple(attrs), source)


def builtin_tp_plan(model: nn.Module, tp: int = 1) -> dict[str, Any]:
    """The built-in layout as torch styles, ``{FQN: ColwiseParallel() | RowwiseParallel()}``: a starting point
    for a Workload's ``tp_plan`` hook (``tp`` only checks divisibility)."""
    return {s.fqn: s.style() for s in tp_layout(model, tp).linears}


def _fused_order(out_features: int, parts: int, tp: int) -> torch.Tensor:
    """Row order of a fused linear such that rank t's contiguous block holds part p's t-th slice for every p
    (``[q_0 | k_0 | v_0 | q_1 | k_1 | v_1]``); identity for one part."""
    part = out_features // parts
    rows = torch.arange(out_features).view(parts, tp, part // tp)
    return rows.transpose(0, 1).reshape(-1)


def _whole_linear(module: nn.Module, spec: ShardedLinear, tp: int) -> nn.Linear:
    """The module as one ``nn.Linear`` in the sharded layout (weight ``(out, in)``, fused rows reordered)."""
    fan_in, fan_out = _features(module)
    weight = module.weight.detach()
    weight = weight.t() if spec.transposed else weight
    bias = module.bias.detach() if getattr(module, "bias", None) is not None else None
    order = _fused_order(fan_out, spec.parts, tp)
    linear = nn.Linear(fan_in, fan_out, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight[order])
        if bias is not None:
            linear.bias.copy_(bias[order])
    linear.weight.requires_grad_(module.weight.requires_grad)
    return linear


def _local_linear(whole: nn.Linear, spec: ShardedLinear, tp: int, tp_rank: int) -> nn.Linear:
    """Rank ``tp_rank``'s block of ``whole`` as a plain ``nn.Linear`` of the local size (for tracing)."""
    dim = 1 if spec.rowwise else 0
    weight = whole.weight.detach().chunk(tp, dim=dim)[tp_rank]
    local = nn.Linear(weight.shape[1], weight.shape[0], bias=whole.bias is not None, dtype=weight.dtype)
    with torch.no_grad():
        local.weight.copy_(weight)
        if whole.bias is not None:
            # A row-wise linear's bias is added once, after the sum: for tracing its value does not matter.
            local.bias.copy_(whole.bias.detach() if spec.rowwise else whole.bias.detach().chunk(tp)[tp_rank])
    return local


@contextlib.contextmanager
def local_shapes(model: nn.Module, layout: TensorParallelLayout, tp_rank: int) -> Iterator[None]:
    """``model`` as one tensor-parallel rank computes it, for as long as the block runs: each sharded linear
    replaced by its local block and the attention modules' head counts divided. Restored afterwards."""
    originals = {s.fqn: model.get_submodule(s.fqn) for s in layout.linears}
    old_attrs = [(fqn, name, getattr(model.get_submodule(fqn), name)) for fqn, name, _ in layout.attributes]
    try:
        for s in layout.linears:
            whole = _whole_linear(originals[s.fqn], s, layout.tp)
            model.set_submodule(s.fqn, _local_linear(whole, s, layout.tp, tp_rank))
        for fqn, name, value in layout.attributes:
            setattr(model.get_submodule(fqn), name, value)
        yield
    finally:
        for fqn, module in originals.items():
            model.set_submodule(fqn, module)
        for fqn, name, value in old_attrs:
            setattr(model.get_submodule(fqn), name, value)


def _single_input(piece: nn.Module, fqn: str) -> None:
    graph = getattr(piece.get_submodule(fqn), "graph", None)
    if isinstance(graph, torch.fx.Graph):
        inputs = [n for n in graph.nodes if n.op == "placeholder"]
        outputs = next(n for n in graph.nodes if n.op == "output").args[0]
        if len(inputs) != 1 or isinstance(outputs, (tuple, list)):
            raise TensorParallelError(
                f"{fqn} is traced with {len(inputs)} inputs: tensor parallelism shards linears called on one tensor"
            )


def shard_stage(piece: nn.Module, model: nn.Module, layout: TensorParallelLayout, tp_mesh: Any) -> tuple[str, ...]:
    """Give ``piece`` (a stage traced under :func:`local_shapes`) its whole linears back and shard them over
    ``tp_mesh`` with ``parallelize_module``. Returns the FQNs sharded in this piece.

    ``model`` is the unsharded model the piece was traced from (its linears hold the weights).
    """
    from torch.distributed.tensor.parallel import parallelize_module

    plan: dict[str, Any] = {}
    for s in layout.linears:
        try:
            piece.get_submodule(s.fqn)
        except AttributeError:
            continue  # another stage's
        _single_input(piece, s.fqn)
        device = next((p.device for p in piece.parameters()), torch.device("cpu"))
        piece.set_submodule(s.fqn, _whole_linear(model.get_submodule(s.fqn), s, layout.tp).to(device))
        plan[s.fqn] = s.style()
    if plan:
        parallelize_module(piece, tp_mesh, plan)
    return tuple(plan)


_SPEC = "_pipeplan_dtensor"
"""Attribute of a local parameter made by :func:`local_parameters`: ``(mesh, placements, shape, stride)``."""


def local_parameters(piece: nn.Module, fqns: tuple[str, ...]) -> None:
    """Make the sharded linears ``fqns`` of ``piece`` hold their local shards as plain parameters, rebuilt
    into DTensors for each call: what DDP can reduce (it buckets plain tensors).

    torch's own bridge (``torch.distributed.tensor.parallel.ddp``) does this around the whole module's forward
    and registers a gradient hook on every parameter at every forward, so the hooks pile up step after step,
    and a stage recomputing its forward in the backward (activation checkpointing) would find the plain
    tensors there. Here each linear swaps its own parameters on its own calls, the recomputed ones included.
    """
    from torch.distributed.tensor import DTensor

    for fqn in fqns:
        linear = piece.get_submodule(fqn)
        names = [n for n, p in linear._parameters.items() if isinstance(p, DTensor)]
        for name in names:
            sharded = linear._parameters[name]
            local = nn.Parameter(sharded.to_local().detach(), requires_grad=sharded.requires_grad)
            setattr(local, _SPEC, (sharded.device_mesh, sharded.placements, sharded.shape, sharded.stride()))
            linear._parameters[name] = local
        linear.register_forward_pre_hook(functools.partial(_as_dtensors, names=tuple(names)))
        linear.register_forward_hook(functools.partial(_as_locals, locals_={n: linear._parameters[n] for n in names}))


def _as_dtensors(linear: nn.Module, _args: Any, *, names: tuple[str, ...]) -> None:
    for name in names:
        linear._parameters[name] = as_dtensor(linear._parameters[name])  # type: ignore[assignment]


def _as_locals(linear: nn.Module, _args: Any, _out: Any, *, locals_: dict[str, nn.Parameter]) -> None:
    linear._parameters.update(locals_)


def as_dtensor(tensor: torch.Tensor, spec_of: torch.Tensor | None = None) -> torch.Tensor:
    """A local shard made by :func:`local_parameters` (or, with ``spec_of``, that parameter's gradient) as the
    DTensor it stands for; anything else as it is."""
    from torch.distributed.tensor import DTensor

    spec = getattr(tensor if spec_of is None else spec_of, _SPEC, None)
    if spec is None:
        return tensor
    mesh, placements, shape, stride = spec
    return DTensor.from_local(tensor, mesh, placements, run_check=False, shape=shape, stride=stride)


def original_gradient(layout: TensorParallelLayout | None, name: str, grad: torch.Tensor) -> torch.Tensor:
    """A parameter's whole gradient (``full_tensor()`` of a sharded one) in the unsharded model's layout."""
    owner, _, leaf = name.rpartition(".")
    spec = layout.linear(owner) if layout is not None else None
    if spec is None:
        return grad
    fan_out = grad.shape[0]
    inverse = torch.argsort(_fused_order(fan_out, spec.parts, layout.tp))  # type: ignore[union-attr]
    grad = grad[inverse]
    return grad.t().contiguous() if spec.transposed and leaf == "weight" else grad
