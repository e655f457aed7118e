"""Tensor parallelism's cost: a profile as each of ``T`` devices of a tensor-parallel group computes it.

Two layouts, each what a runtime that runs the plan does (:class:`TpLayout`):

- ``blocks``, pipeplan's own runtime (planner/runtime/tensor_parallel.py): only the transformer blocks are split,
  without sequence parallelism; the embeddings, the output head and every other unit are replicated (whole
  weights, work and logits on every device, no collective of their own), and pipeline sends carry the whole
  activation from each device of the group.
- ``megatron``, for plans exported to Megatron-Core or torchtitan: everything below, the vocabulary-parallel
  embedding and head included, with sequence parallelism optional (on by default).

Megatron's layout (Shoeybi et al., 2019, Sec. 3; Narayanan et al., SC 2021, Sec. 2.3) with sequence parallelism
(Korthikanti et al., MLSys 2023, "Reducing Activation Recomputation in Large Transformer Models", Sec. 4.2.2):

- **transformer blocks** (the units named ``PREFIX.N`` of the prefix with the most distinct ``N``): attention
  split by heads, the MLP's first matrix by columns and its second by rows; each device holds ``1/T`` of the
  block's parameters and does ``1/T`` of its work. Per block and micro-batch, 2 all-reduces of the block's
  activation (``b x s x h``) in the forward and 2 in the backward; with sequence parallelism each all-reduce
  becomes an all-gather and a reduce-scatter of the same bytes, and every activation is split ``T`` ways.
- **embeddings** before the first block: split by rows (vocabulary-parallel, Megatron's
  ``VocabParallelEmbedding``, torchtitan's ``RowwiseParallel``): ``1/T`` of the table and of the work, one
  reduce-scatter (an all-reduce without sequence parallelism) of the output forward, its conjugate backward.
- **the output layer** after the last block, a ``Linear`` or a unit named ``*head*``/``output``: split by
  columns (vocabulary), with the loss computed on the split logits (Megatron's vocabulary-parallel cross
  entropy, torchtitan's ``loss_parallel``): ``1/T`` of the weights, work and logits; one all-gather of its input
  forward (nothing without sequence parallelism), one reduce-scatter (all-reduce) of the input gradient backward.
  The loss's own all-reduces of ``b x s`` numbers are left out (``1/h`` of the activation's bytes).
- **every other unit** (final norm, position-free glue) is replicated: each device runs it whole.

A measured unit's sharded time at micro-batch size ``b`` is ``fixed + (t(b) - fixed) / T`` where ``fixed`` is the
intercept of the straight line through the unit's profiled times over its micro-batch sizes (least squares,
clamped to ``[0, t(smallest)]``): the part of the time that does not shrink with the work (kernel launches,
small-matrix inefficiency) stays whole on every device. One profiled size: no fixed part (ideal ``1/T``). A
modelled profile's units are modelled again on their slices by the device model
(:func:`profiles.modelled.tensor_parallel_times`): each product at its sliced shape's efficiency, each kernel's
launch whole.
Collectives are rings on the intra-node link (``T`` divides a node): ``2 (T - 1)`` steps of ``n / T`` bytes for
an all-reduce, ``T - 1`` for an all-gather or a reduce-scatter (:func:`planner.calibration.ring_s`).

Memory: a sharded unit's weights, gradients and optimizer state are ``1/T``; its activations are ``1/T`` with
sequence parallelism (Korthikanti et al., eq. 3: ``sbh (34 + 5as/h) / t``) and, without it, ``10 sbh`` bytes stay
whole (the two LayerNorms' inputs, the inputs of the QKV and first MLP matrices, the two dropout masks; eq. 2:
``sbh (10 + 24/t + 5as/(ht))``), which is five copies of the block's 16-bit output. Pipeline sends carry ``1/T`` of
each float tensor from every device of the group (Narayanan et al., SC 2021, Sec. 4.1, scatter/gather; with
sequence parallelism the activations are split already); pipeplan's runtime sends them whole.
docs/cost-model.md, "Tensor parallelism", has it all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from planner.calibration import ring_s
from planner.errors import UsageError
from profiles.format import Profile, TensorFlow, UnitProfile, WholeModel

ModelledTimes = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]

__all__ = [
    "Role",
    "TpLayout",
    "TensorParallel",
    "layout_switches",
    "planned_switches",
    "unit_roles",
    "shardable_degrees",
    "check_degree",
    "sharded_profile",
    "fixed_part_s",
    "attention_heads",
]

_BLOCK = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)(?:\.|$)")
_HEAD = re.compile(r"(^|[._])(lm_head|head|output)([._+]|$)")
UNSPLIT_COPIES = 5
"""Without sequence parallelism, Korthikanti et al.'s ``10 sbh`` bytes that stay whole: five 16-bit ``b x s x h``."""


class Role(str, Enum):
    """How tensor parallelism splits a unit (module docstring)."""

    BLOCK = "block"
    EMBEDDING = "embedding"
    HEAD = "head"
    REPLICATED = "replicated"


class TpLayout(str, Enum):
    """Who runs a plan's tensor parallelism, and so what it splits (module docstring)."""

    BLOCKS = "blocks"
    """pipeplan's runtime: the blocks' linears only; embeddings, head and sequence whole."""
    MEGATRON = "megatron"
    """Megatron-Core, torchtitan: blocks, vocabulary-parallel embedding and head, sequence parallelism optional."""


def layout_switches(layout: TpLayout, sequence_parallel: bool | None = None) -> tuple[bool, bool]:
    """``(sequence_parallel, vocab_parallel)`` of ``layout``; ``sequence_parallel`` None takes the layout's own
    (off for ``blocks``, on for ``megatron``).

    Raises:
        UsageError: sequence parallelism asked of the ``blocks`` layout, whose runtime keeps the sequence whole.
    """
    if layout is TpLayout.BLOCKS:
        if sequence_parallel:
            raise UsageError(
                "--sequence-parallel on: pipeplan's runtime (--tp-layout blocks) keeps the sequence whole; plan "
                "with --tp-layout megatron for a trainer that splits it (Megatron-Core, torchtitan)"
            )
        return False, False
    return (True if sequence_parallel is None else sequence_parallel), True


def planned_switches(constraints: Mapping[str, object]) -> tuple[bool, bool]:
    """``(sequence_parallel, vocab_parallel)`` a plan was made with, from its constraints. A plan without
    ``vocab_parallel`` is read as planned with Megatron's layout, so each defaults to on."""
    return bool(constraints.get("sequence_parallel", True)), bool(constraints.get("vocab_parallel", True))


@dataclass(frozen=True)
class TensorParallel:
    """A tensor-parallel group of ``degree`` devices on one node's link. The defaults are pipeplan's runtime
    (the ``blocks`` layout); Megatron's layout sets both switches."""

    degree: int
    bytes_per_s: float
    """The intra-node link, one direction per device."""
    latency_s: float
    sequence_parallel: bool = False
    """Megatron's ``--sequence-parallel`` (torchtitan splits the norms' sequence under TP by default)."""
    vocab_parallel: bool = False
    """The embeddings split by vocabulary rows and the output head by vocabulary columns, the loss on the split
    logits (Megatron, torchtitan); off: both replicated, as pipeplan's runtime runs them."""

    def __post_init__(self) -> None:
        if self.degree < 1:
            raise UsageError(f"--tensor-parallel must be >= 1, got {self.degree}")
        if self.bytes_per_s <= 0 or self.latency_s < 0:
            raise UsageError(f"a tensor-parallel link needs bandwidth > 0 and latency >= 0, got {self}")

    @property
    def splits_sends(self) -> bool:
        """Pipeline sends carry ``1/T`` of each activation: a trainer's layout (split already with sequence
        parallelism, Megatron's scatter/gather without); pipeplan's runtime sends each device's whole copy."""
        return self.sequence_parallel or self.vocab_parallel

    def allreduce_s(self, num_bytes: float) -> float:
        return ring_s(2 * (self.degree - 1), num_bytes, self.degree, self.latency_s, self.bytes_per_s)

    def gather_s(self, num_bytes: float) -> float:
        """An all-gather or a reduce-scatter of ``num_bytes`` in all."""
        return ring_s(self.degree - 1, num_bytes, self.degree, self.latency_s, self.bytes_per_s)

    def block_comm_s(self, activation_bytes: float) -> tuple[float, float]:
        """``(forward, backward)`` collectives of one transformer block: 2 all-reduces each way, or with sequence
        parallelism 2 all-gathers and 2 reduce-scatters (the same bytes on a ring)."""
        if self.sequence_parallel:
            each = 4 * self.gather_s(activation_bytes)
        else:
            each = 2 * self.allreduce_s(activation_bytes)
        return each, each

    def embedding_comm_s(self, activation_bytes: float) -> tuple[float, float]:
        """Vocabulary-parallel embedding: its output reduced forward (reduce-scatter with sequence parallelism,
        gathered back backward for the table's gradient; all-reduce without, nothing backward)."""
        if self.sequence_parallel:
            return self.gather_s(activation_bytes), self.gather_s(activation_bytes)
        return self.allreduce_s(activation_bytes), 0.0

    def head_comm_s(self, activation_bytes: float) -> tuple[float, float]:
        """Column-parallel output layer: its input gathered forward (sequence parallelism only), its input
        gradient reduced backward (reduce-scatter, or all-reduce without sequence parallelism)."""
        if self.sequence_parallel:
            return self.gather_s(activation_bytes), self.gather_s(activation_bytes)
        return 0.0, self.allreduce_s(activation_bytes)


def unit_roles(profile: Profile) -> tuple[Role, ...]:
    """Each unit's :class:`Role`: blocks are the units named ``PREFIX.N`` (or ``PREFIX.N.sub``) of the prefix with
    the most distinct ``N`` (at least 2); embeddings are units of a type ending in ``Embedding`` before the first
    block; the head is a ``Linear`` or a unit named ``lm_head``/``head``/``output`` after the last. All replicated
    when the profile has no repeated blocks."""
    names = [u.name for u in profile.units]
    blocks: dict[str, set[int]] = {}
    for name in names:
        match = _BLOCK.match(name)
        if match:
            blocks.setdefault(match["prefix"], set()).add(int(match["index"]))
    longest = max((len(v) for v in blocks.values()), default=0)
    if longest < 2:
        return (Role.REPLICATED,) * len(names)
    prefix = min(p for p, v in blocks.items() if len(v) == longest)
    in_block = [bool((m := _BLOCK.match(n)) and m["prefix"] == prefix) for n in names]
    first, last = in_block.index(True), len(names) - 1 - in_block[::-1].index(True)
    roles = []
    for i, unit in enumerate(profile.units):
        if in_block[i]:
            roles.append(Role.BLOCK)
        elif i < first and unit.type.endswith("Embedding"):
            roles.append(Role.EMBEDDING)
        elif i > last and (unit.type == "Linear" or _HEAD.search(unit.name)):
            roles.append(Role.HEAD)
        else:
            roles.append(Role.REPLICATED)
    return tuple(roles)


def attention_heads(profile: Profile) -> tuple[int, int] | None:
    """``(attention heads, key-value heads)`` the profile records (``settings.attention_heads``, and
    ``settings.kv_heads``, default the same), or None."""
    heads = profile.settings.get("attention_heads")
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        return None
    kv = profile.settings.get("kv_heads", heads)
    return heads, kv if isinstance(kv, int) and not isinstance(kv, bool) and kv >= 1 else heads


def shardable_degrees(profile: Profile, devices_per_node: int, heads: tuple[int, int] | None) -> tuple[int, ...]:
    """The tensor-parallel degrees a search may try: divisors of the node size that divide the attention heads
    and the key-value heads (Megatron asserts both); just 1 when no unit shards or the heads are unknown."""
    if heads is None or all(r is Role.REPLICATED for r in unit_roles(profile)):
        return (1,)
    q, kv = heads
    return tuple(t for t in range(1, devices_per_node + 1) if devices_per_node % t == 0 and q % t == 0 and kv % t == 0)


def check_degree(profile: Profile, degree: int, devices_per_node: int, heads: tuple[int, int] | None) -> None:
    """Refuse a tensor-parallel degree the model or the nodes cannot take, in one line.

    Raises:
        UsageError: ``degree`` does not divide the node's devices or the heads, the heads are unknown, or no
            unit of the profile shards.
    """
    if degree == 1:
        return
    if devices_per_node % degree:
        raise UsageError(
            f"--tensor-parallel {degree} does not divide --devices-per-node {devices_per_node}: a tensor-parallel "
            "group stays inside one node (its collectives run every block)"
        )
    if all(r is Role.REPLICATED for r in unit_roles(profile)):
        raise UsageError(
            "--tensor-parallel: no unit of the profile shards (no repeated blocks named PREFIX.N): plan with "
            "--tensor-parallel 1"
        )
    if heads is None:
        raise UsageError(
            "--tensor-parallel needs the model's attention heads, which the profile does not record (made before "
            "pipeplan recorded them, or not a transformers model): give --attention-heads H"
        )
    q, kv = heads
    if q % degree or kv % degree:
        what = f"{q} attention heads" + (f" and {kv} key-value heads" if kv != q else "")
        raise UsageError(
            f"--tensor-parallel {degree} does not divide the model's {what}: each device holds whole heads"
        )


def fixed_part_s(sizes: Sequence[int], times: Sequence[float]) -> float:
    """The intercept of the least-squares line through ``(size, time)``, clamped to ``[0, time at the smallest
    size]``: what does not shrink with the work. 0 for one size.

    >>> fixed_part_s((1, 2, 4), (3.0, 5.0, 9.0))
    1.0
    """
    n = len(sizes)
    if n < 2:
        return 0.0
    mean_x, mean_y = sum(sizes) / n, sum(times) / n
    var = sum((x - mean_x) ** 2 for x in sizes)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, times, strict=True)) / var
    smallest = times[min(range(n), key=lambda i: sizes[i])]
    return min(max(mean_y - slope * mean_x, 0.0), smallest)


def _shrunk(sizes: Sequence[int], times: tuple[float, ...] | None, degree: int) -> tuple[float, ...] | None:
    if times is None:
        return None
    fixed = fixed_part_s(sizes, times)
    return tuple(fixed + (t - fixed) / degree for t in times)


def _added(times: tuple[float, ...] | None, extra: Sequence[float]) -> tuple[float, ...] | None:
    return None if times is None else tuple(t + e for t, e in zip(times, extra, strict=True))


def _split_bytes(values: tuple[int, ...] | None, degree: int) -> tuple[int, ...] | None:
    return None if values is None else tuple(-(-v // degree) for v in values)


def _activation_bytes(
    values: tuple[int, ...] | None, whole: Sequence[int], tp: TensorParallel
) -> tuple[int, ...] | None:
    """A block's activations on one device: all split with sequence parallelism, else ``whole`` bytes kept."""
    if values is None:
        return None
    if tp.sequence_parallel:
        return _split_bytes(values, tp.degree)
    return tuple(min(v, w) + -(-max(0, v - w) // tp.degree) for v, w in zip(values, whole, strict=True))


def _block_activation(profile: Profile, roles: Sequence[Role]) -> tuple[int, ...]:
    """Per size, the bytes of a block's ``b x s x h`` output: the first block's output."""
    first = next(u for u, r in zip(profile.units, roles, strict=True) if r is Role.BLOCK)
    return first.output_bytes


def _sharded_unit(
    unit: UnitProfile,
    role: Role,
    comm: tuple[Sequence[float], Sequence[float]],
    whole: Sequence[int],
    sizes: Sequence[int],
    tp: TensorParallel,
    modelled: ModelledTimes | None,
) -> UnitProfile:
    t = tp.degree
    forward, backward = comm
    if modelled is not None:
        compute = modelled[0], tuple(i + w for i, w in zip(modelled[1], modelled[2], strict=True))
        split = modelled[1], modelled[2]
    else:
        compute = _shrunk(sizes, unit.forward_s, t), _shrunk(sizes, unit.backward_s, t)
        split = _shrunk(sizes, unit.backward_input_s, t), _shrunk(sizes, unit.backward_weight_s, t)
    activations = (lambda v: _activation_bytes(v, whole, tp)) if role is Role.BLOCK else (lambda v: _split_bytes(v, t))
    return replace(
        unit,
        param_count=-(-unit.param_count // t),
        param_bytes=-(-unit.param_bytes // t),
        tied_param_count=-(-unit.tied_param_count // t),
        largest_param_bytes=-(-unit.largest_param_bytes // t),
        forward_s=_added(compute[0], forward),
        backward_s=_added(compute[1], backward),
        flops=tuple(-(-f // t) for f in unit.flops),
        # The input gradient's collective belongs to I, the action that makes the gradient a stage sends back.
        backward_input_s=_added(split[0], backward),
        backward_weight_s=split[1],
        saved_bytes=activations(unit.saved_bytes),
        held_bytes=activations(unit.held_bytes),
        transient_bytes=activations(unit.transient_bytes),
        input_transient_bytes=activations(unit.input_transient_bytes),
        weight_transient_bytes=activations(unit.weight_transient_bytes),
        weight_grad_bytes=_split_bytes(unit.weight_grad_bytes, t),
        # Without a trainer's split sends, a block's output is the all-reduced whole on every device.
        output_bytes=unit.output_bytes
        if role is Role.EMBEDDING or not tp.splits_sends
        else _split_bytes(unit.output_bytes, t),
        peak_bytes=_split_bytes(unit.peak_bytes, t),
    )


def sharded_profile(profile: Profile, tp: TensorParallel) -> Profile:
    """``profile`` as one device of a tensor-parallel group of ``tp.degree`` computes and holds it (module
    docstring); ``profile`` itself for degree 1. Every search, bound and simulator then runs on it unchanged."""
    t = tp.degree
    if t == 1:
        return profile
    roles = unit_roles(profile)
    if all(r is Role.REPLICATED for r in roles):
        raise UsageError("tensor parallelism: no unit of the profile shards (no repeated blocks named PREFIX.N)")
    activation = _block_activation(profile, roles)
    whole = [UNSPLIT_COPIES * a for a in activation]
    block_params: dict[str, int] = {}
    for unit, role in zip(profile.units, roles, strict=True):
        if role is Role.BLOCK:
            key = _block_key(unit.name)
            block_params[key] = block_params.get(key, 0) + unit.param_count
    # A modelled profile is split by its device model, at each slice's own shape; a measured one by the line
    # through its sizes (module docstring).
    modelled: dict[str, ModelledTimes] = {}
    if "modelled" in profile.settings:
        from profiles.modelled import tensor_parallel_times

        modelled = tensor_parallel_times(profile, t, tp.sequence_parallel)
    units = []
    for unit, role in zip(profile.units, roles, strict=True):
        if role is Role.REPLICATED or (role in (Role.EMBEDDING, Role.HEAD) and not tp.vocab_parallel):
            units.append(unit)
            continue
        if role is Role.BLOCK:
            pairs = [tp.block_comm_s(a) for a in activation]
            # A block cut into several units: its collectives shared by parameters (a parameter-free piece has none).
            key = _block_key(unit.name)
            share = unit.param_count / block_params[key] if block_params[key] else 1.0
        elif role is Role.EMBEDDING:
            pairs, share = [tp.embedding_comm_s(a) for a in activation], 1.0
        else:
            pairs, share = [tp.head_comm_s(a) for a in activation], 1.0
        comm = [f * share for f, _ in pairs], [b * share for _, b in pairs]
        units.append(_sharded_unit(unit, role, comm, whole, profile.micro_batch_sizes, tp, modelled.get(unit.name)))
    tensors = tuple(
        replace(x, bytes=tuple(-(-b // t) for b in x.bytes)) if tp.splits_sends and _split_on_the_wire(x) else x
        for x in profile.tensors
    )
    sums = [
        [
            sum(getattr(u, key)[k] for u in units) / max(sum(getattr(u, key)[k] for u in profile.units), 1e-300)
            for k in range(len(profile.micro_batch_sizes))
        ]
        for key in ("forward_s", "backward_s")
    ]
    whole_model = WholeModel(
        tuple(w * r for w, r in zip(profile.whole_model.forward_s, sums[0], strict=True)),
        tuple(w * r for w, r in zip(profile.whole_model.backward_s, sums[1], strict=True)),
    )
    settings = {
        **profile.settings,
        "tensor_parallel": t,
        "sequence_parallel": tp.sequence_parallel,
        "vocab_parallel": tp.vocab_parallel,
    }
    return replace(profile, units=tuple(units), tensors=tensors, whole_model=whole_model, settings=settings)


def _block_key(name: str) -> str:
    """``transformer.h.3`` for ``transformer.h.3`` and each of its sub-units ``transformer.h.3.attn``, ..."""
    match = _BLOCK.match(name)
    assert match is not None  # only called for blocks, which match
    return f"{match['prefix']}.{match['index']}"


def _split_on_the_wire(tensor: TensorFlow) -> bool:
    """Activations between stages travel as ``1/T`` from every device of the group; ids and masks whole."""
    return tensor.needs_grad and tensor.producer >= 0
