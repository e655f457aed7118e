"""A profile of a transformer on a GPU one does not have: every unit's times from its operations' FLOPs and bytes
through the device model's roofline (:mod:`profiles.device_model`), its memory by the trainers' accounting.

A unit is a list of operations, each a kernel of a micro-batch: matrix products (``m x k`` by ``k x n``),
element-wise kernels (norms, activations, residuals, dropout, the loss) and the attention core. Each takes
``max(FLOPs / (peak * efficiency), bytes / (bandwidth * memory_efficiency)) + kernel_s``, the efficiency of a
product falling with its smaller dimensions (``DeviceModel.matmul_half_size``), so the time per sample falls with
the micro-batch as a GPU's does. The backward of a product is two products of the same FLOPs, its input gradient
(I) and its weight gradient (W); an element-wise kernel's backward moves twice its bytes; flash attention's
backward does 2.5x its forward's work (FlashAttention-2's five products to the forward's two). Saved activations
follow Korthikanti et al. (MLSys 2023, Sec. 4.1: ``34 s b h + 5 a s^2 b`` bytes a GPT block without flash
attention), counted tensor by tensor so that Llama's grouped-query attention and SwiGLU MLP are counted too.

Recomputation inside a unit is a property of the profile (``recompute``): ``none``; ``selective``, Korthikanti et
al.'s (the attention core, its softmax and dropout, recomputed in the backward; nothing to recompute under flash
attention, which never keeps them); ``op``, torch's op-level selective activation checkpointing as torchtitan runs
it (every second matrix product's output and every element-wise output recomputed). Full recomputation is the
plan's, per stage. docs/cost-model.md, "Device models", has the constants and their sources.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import PipeplanError, UsageError, shorten
from planner.fileio import check_tree
from planner.limits import MAX_UNITS
from profiles.device_model import DeviceModel, recorded_device_model
from profiles.format import DeviceInfo, ModelInfo, Profile, TensorFlow, UnitProfile, WholeModel, profile_from_dict
from profiles.models.hf_spec import PREFIX, resolve_hf_spec

__all__ = [
    "TransformerShape",
    "RECOMPUTE_MODES",
    "PRECISIONS",
    "shape_from_hf_config",
    "modelled_profile",
    "tensor_parallel_times",
    "model_flops",
    "modelled_calibration",
]

RECOMPUTE_MODES = ("none", "selective", "op")
PRECISIONS = ("bf16", "fp16", "fp8")
EXTRA_UNITS = 4
"""Units beside the layers, at most: gpt's two embeddings, final norm and head."""
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only language model's shape: ``gpt`` (learned positions, LayerNorm, GELU MLP, dropout) or
    ``llama`` (rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no dropout)."""

    name: str
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    tied_embeddings: bool

    def __post_init__(self) -> None:
        if self.arch not in ("gpt", "llama"):
            raise UsageError(f"{self.name}: a modelled profile needs a gpt or llama architecture, got {self.arch!r}")
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UsageError(f"{self.name}: {name} must be a positive whole number, got {shorten(repr(value), 40)}")
        if self.layers + EXTRA_UNITS > MAX_UNITS:
            raise UsageError(f"{self.name}: {self.layers:,} layers make more units than pipeplan plans ({MAX_UNITS:,})")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise UsageError(f"{self.name}: heads must divide hidden, and key-value heads divide heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def block_params(self) -> int:
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_heads * self.head_dim
        if self.arch == "gpt":
            return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attention, MLP, two LayerNorms with biases
        return 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h


def shape_from_hf_config(config: dict[str, Any], name: str, seq_len: int | None = None) -> TransformerShape:
    """The shape of a transformers config (``model_type`` gpt2, or llama and its kin)."""
    kind = str(config.get("model_type", ""))

    def need(*keys: str, default: int | None = None) -> int:
        for key in keys:
            value = config.get(key)
            if value is None:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value != int(value):
                raise UsageError(f"{name}: {key} must be a whole number, got {shorten(repr(value), 40)}")
            return int(value)
        if default is not None:
            return default
        raise UsageError(f"{name}: the config has no {keys[0]!r}, which a modelled profile needs")

    if kind == "gpt2":
        hidden = int(need("n_embd"))
        return TransformerShape(
            name,
            "gpt",
            int(need("n_layer")),
            hidden,
            int(need("n_head")),
            int(need("n_head")),
            int(need("n_inner", default=4 * hidden)),
            int(need("vocab_size")),
            int(seq_len or need("n_positions", "n_ctx")),
            bool(config.get("tie_word_embeddings", True)),
        )
    if kind in LLAMA_LIKE:
        heads = int(need("num_attention_heads"))
        return TransformerShape(
            name,
            "llama",
            int(need("num_hidden_layers")),
            int(need("hidden_size")),
            heads,
            int(need("num_key_value_heads", default=heads)),
            int(need("intermediate_size")),
            int(need("vocab_size")),
            int(seq_len or need("max_position_embeddings")),
            bool(config.get("tie_word_embeddings", False)),
        )
    raise UsageError(
        f"{name}: model_type {kind!r} cannot be modelled: a device model takes gpt2 or {', '.join(LLAMA_LIKE)} configs"
    )


def load_hf_shape(spec: str, seq_len: int | None) -> TransformerShape:
    """``hf:PATH.json[?seq_len=N]`` as a shape (the config alone; nothing is built)."""
    if not spec.startswith(PREFIX):
        raise UsageError(f"a device model profiles an hf:CONFIG.json transformers config, got {shorten(spec, 120)}")
    path, _, wanted = resolve_hf_spec(spec, None, seq_len)
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read the config ({shorten(str(exc), 100)})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: a transformers config is a JSON object")
    return shape_from_hf_config(config, spec, wanted)


@dataclass(frozen=True)
class _Op:
    """One kernel of one micro-batch."""

    flops: float
    """Executed floating-point operations (two per multiply-add)."""
    bytes: float
    """Bytes it moves to and from HBM."""
    kind: str = "memory"
    """``matmul`` (tensor cores, shape-dependent), ``attention`` (a flash kernel) or ``memory`` (element-wise)."""
    dims: tuple[int, int] = (1, 1)
    """A product's two output dimensions, whose size sets its efficiency."""
    fp8: bool = False


@dataclass
class _Unit:
    name: str
    type: str
    params: int
    param_tensors: int
    largest_param: int
    forward: list[_Op] = field(default_factory=list)
    backward_input: list[_Op] = field(default_factory=list)
    backward_weight: list[_Op] = field(default_factory=list)
    saved_bytes: float = 0.0
    output_bytes: float = 0.0
    transient_bytes: float = 0.0
    model_flops: float = 0.0
    """Forward FLOPs as model-FLOPs utilisation counts them (attention without its causal mask)."""
    tied: tuple[str, ...] = ()
    tied_count: int = 0


class _Builder:
    """The operations of each unit at one micro-batch size."""

    def __init__(
        self,
        shape: TransformerShape,
        micro_batch: int,
        precision: str,
        flash: bool,
        recompute: str,
        transformer_engine: bool = False,
        tensor_parallel: int = 1,
        sequence_parallel: bool = False,
    ):
        self.shape, self.b, self.flash, self.recompute = shape, micro_batch, flash, recompute
        self.fp8 = precision == "fp8"
        self.transformer_engine = transformer_engine
        self.tokens = micro_batch * shape.seq_len
        self.tp, self.sp = tensor_parallel, sequence_parallel

    def split(self, elements: float) -> float:
        """A tensor Megatron's layout splits across the tensor-parallel group: heads, the MLP's hidden, logits."""
        return elements / self.tp

    def along_sequence(self, elements: float) -> float:
        """A tensor of the model's width: split by sequence parallelism, else whole on every device."""
        return elements / self.tp if self.sp else elements

    def fp8_saving(self) -> float:
        """Bytes a layer saves less when its products keep their inputs in fp8 (one byte, not two), as Transformer
        Engine's do: the two norms' outputs, the attention core's output and the MLP's last input."""
        if not (self.fp8 and self.transformer_engine):
            return 0.0
        return self.tokens * (3 * self.shape.hidden + self.shape.ffn_hidden)

    def matmul(self, unit: _Unit, n: int, k: int, *, split: str = "") -> float:
        """``tokens x k`` by ``k x n``: forward, input gradient (I) and weight gradient (W); returns the bytes of
        its output. ``split``: ``columns`` (``n``) or ``rows`` (``k``) over the tensor-parallel group."""
        m = self.tokens
        if split == "columns":
            n = -(-n // self.tp)
        elif split == "rows":
            k = -(-k // self.tp)
        flops = 2.0 * m * n * k
        unit.forward.append(_Op(flops, 2.0 * (m * k + k * n + m * n), "matmul", (m, n), self.fp8))
        unit.backward_input.append(_Op(flops, 2.0 * (m * n + k * n + m * k), "matmul", (m, k), self.fp8))
        unit.backward_weight.append(_Op(flops, 2.0 * (m * n + m * k) + 4.0 * k * n, "matmul", (k, n), self.fp8))
        unit.model_flops += flops
        return 2.0 * m * n

    def elementwise(self, unit: _Unit, elements: float, reads: int = 1, writes: int = 1) -> None:
        """A kernel reading ``reads`` and writing ``writes`` 16-bit tensors of ``elements``; its backward moves
        twice as much."""
        moved = 2.0 * elements * (reads + writes)
        unit.forward.append(_Op(0.0, moved))
        unit.backward_input.append(_Op(0.0, 2 * moved))

    def attention_core(self, unit: _Unit) -> tuple[float, list[_Op]]:
        """Scores, softmax (and GPT's dropout), weighted values; returns the bytes the core keeps for its
        backward beyond q, k and v, and its forward operations (which selective recomputation runs again)."""
        s, b = self.shape.seq_len, self.b
        h, a = self.split(self.shape.hidden), self.split(self.shape.heads)
        # Fewer key/value heads than devices: Megatron replicates them, one a device.
        kv = max(self.split(self.shape.kv_heads), 1.0) * self.shape.head_dim
        full = 4.0 * b * s * s * h  # QK^T and AV, as model FLOPs count them
        unit.model_flops += full
        if self.flash:
            executed = full / 2  # the causal mask skips half the tiles
            moved = 2.0 * b * s * (2 * h + 2 * kv)
            forward = [_Op(executed, moved, "attention")]
            unit.forward += forward
            unit.backward_input.append(_Op(2.5 * executed, 2 * moved, "attention"))
            return 4.0 * b * a * s, forward  # the log-sum-exp of each row (fp32)
        scores = b * a * s * s
        product = _Op(full / 2, 2.0 * (2 * b * s * h + scores), "matmul", (s, s))
        softmax = _Op(0.0, 2.0 * 2 * scores)
        forward = [product, softmax]
        kept = 2.0 * scores  # the softmax's output
        if self.shape.arch == "gpt":  # attention dropout: its mask and output
            forward.append(_Op(0.0, 2.0 * 2 * scores + scores))
            kept += 3.0 * scores
        forward.append(product)
        unit.forward += forward
        unit.backward_input += [product, product, _Op(0.0, 2.0 * 3 * scores), product, product]
        return kept, forward


def _gpt_block(builder: _Builder, name: str) -> _Unit:
    shape, tokens = builder.shape, builder.tokens
    h, f = shape.hidden, shape.ffn_hidden
    unit = _Unit(name, "GPT2Block", shape.block_params(), 12, 2 * h * f)
    act = float(tokens * h)
    builder.elementwise(unit, builder.along_sequence(act))  # ln_1
    builder.matmul(unit, 3 * h, h, split="columns")
    kept, core = builder.attention_core(unit)
    builder.matmul(unit, h, h, split="rows")
    builder.elementwise(unit, builder.along_sequence(act), reads=2, writes=2)  # dropout and residual
    builder.elementwise(unit, builder.along_sequence(act))  # ln_2
    builder.matmul(unit, f, h, split="columns")
    builder.elementwise(unit, builder.split(tokens * f))  # GELU
    builder.matmul(unit, h, f, split="rows")
    builder.elementwise(unit, builder.along_sequence(act), reads=2, writes=2)
    # Korthikanti et al., Sec. 4.1: 11 s b h + 5 a s^2 b (attention), 19 s b h (MLP), 4 s b h (LayerNorms).
    base = 2 * act * 2 + 2 * act * 2 + 2 * act + act + 2 * act + 2 * tokens * f * 2 + act + 4 * act
    unit.saved_bytes = base - builder.fp8_saving() + _kept_core(builder, unit, kept, core)
    unit.output_bytes = 2 * act
    unit.transient_bytes = 2 * 2 * act + 2 * 2.0 * tokens * f
    return unit


def _llama_block(builder: _Builder, name: str) -> _Unit:
    shape, tokens = builder.shape, builder.tokens
    h, f, kv = shape.hidden, shape.ffn_hidden, shape.kv_heads * shape.head_dim
    unit = _Unit(name, "LlamaDecoderLayer", shape.block_params(), 9, 2 * h * f)
    act = float(tokens * h)
    builder.elementwise(unit, builder.along_sequence(act))  # input RMSNorm
    builder.matmul(unit, h + 2 * kv, h, split="columns")
    builder.elementwise(unit, builder.split(tokens * (h + kv)))  # rotary embedding of q and k
    kept, core = builder.attention_core(unit)
    builder.matmul(unit, h, h, split="rows")
    builder.elementwise(unit, builder.along_sequence(act), reads=2)  # residual
    builder.elementwise(unit, builder.along_sequence(act))  # post-attention RMSNorm
    builder.matmul(unit, 2 * f, h, split="columns")
    builder.elementwise(unit, builder.split(tokens * f), reads=2)  # SiLU(gate) * up
    builder.matmul(unit, h, f, split="rows")
    builder.elementwise(unit, builder.along_sequence(act), reads=2)
    # The norms' inputs and outputs (2 + 2), q, k, v and the core's output (h + 2 kv + h), the MLP's gate, up,
    # SiLU and product (4 f): 16-bit each.
    if builder.recompute == "op":
        # torch's op-level checkpointing as torchtitan runs it: the outputs of the attention and of every second
        # product are kept (q, v, the first MLP half and the down projection), the rest recomputed.
        unit.saved_bytes = 2.0 * tokens * (h + h + kv + f + h + h)
        products = [op for op in unit.forward if op.kind == "matmul"]
        unit.backward_input += [op for op in unit.forward if op.kind == "memory"] + products[1::2]
    else:
        # Transformer Engine's SwiGLU is one fused kernel keeping its input (gate and up), not SiLU's output too.
        swiglu = 3 if builder.transformer_engine else 4
        saved = 2.0 * tokens * (4 * h + 2 * h + 2 * kv + swiglu * f) - builder.fp8_saving()
        unit.saved_bytes = saved + _kept_core(builder, unit, kept, core)
    unit.output_bytes = 2 * act
    unit.transient_bytes = 2 * 2 * act + 3 * 2.0 * tokens * f
    return unit


def _kept_core(builder: _Builder, unit: _Unit, kept: float, core: list[_Op]) -> float:
    """The attention core's kept bytes, or none with its forward run again in the backward (selective)."""
    if builder.recompute == "selective" and not builder.flash:
        unit.backward_input += core
        return 0.0
    return kept


def _units(shape: TransformerShape, builder: _Builder) -> list[_Unit]:
    s, h, v, tokens = shape.seq_len, shape.hidden, shape.vocab, builder.tokens
    act = float(tokens * h)
    units: list[_Unit] = []
    if shape.arch == "gpt":
        names = ("transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f")
        units.append(_Unit(names[0], "Embedding", v * h, 1, 2 * v * h))
        units.append(_Unit(names[1], "Embedding", s * h, 1, 2 * s * h))
    else:
        names = ("model.embed_tokens", "", "model.layers", "model.norm")
        units.append(_Unit(names[0], "Embedding", v * h, 1, 2 * v * h))
    for unit in units:  # a gather of rows, and its gradient scattered back
        builder.elementwise(unit, act)
        unit.output_bytes = 2 * act
    block = _gpt_block if shape.arch == "gpt" else _llama_block
    units += [block(builder, f"{names[2]}.{k}") for k in range(shape.layers)]
    norm = _Unit(
        names[3],
        "LayerNorm" if shape.arch == "gpt" else "LlamaRMSNorm",
        2 * h if shape.arch == "gpt" else h,
        2 if shape.arch == "gpt" else 1,
        2 * h,
    )
    builder.elementwise(norm, act)
    norm.saved_bytes, norm.output_bytes = 2 * act, 2 * act
    units.append(norm)
    tied = shape.tied_embeddings
    head = _Unit("lm_head", "Linear", 0 if tied else v * h, 0 if tied else 1, 2 * v * h)
    if tied:
        head.tied, head.tied_count = (f"{names[0]}.weight",), v * h
    builder.matmul(head, v, h, split="columns")
    logits = builder.split(tokens * v)
    # The loss in fp32 over the logits: read them, write the probabilities; its backward writes their gradient.
    head.forward.append(_Op(0.0, logits * (2 + 4 + 4)))
    head.backward_input.append(_Op(0.0, logits * (4 + 2)))
    head.saved_bytes = 2 * act + 4 * logits
    head.output_bytes = 4.0 * builder.b
    head.transient_bytes = 2 * 4 * logits
    units.append(head)
    return units


def _op_s(op: _Op, device: DeviceModel) -> float:
    memory_s = op.bytes / (device.memory_bytes_per_s * device.memory_efficiency)
    if op.kind == "memory":
        return memory_s + device.kernel_s
    if op.kind == "attention":
        return max(op.flops / (device.matmul_flops_per_s * device.attention_efficiency), memory_s) + device.kernel_s
    efficiency = device.matmul_efficiency
    for d in op.dims:
        efficiency *= d / (d + device.matmul_half_size)
    rate = device.matmul_flops_per_s * efficiency * (device.fp8_speedup if op.fp8 else 1.0)
    # fp8 products cast their 16-bit inputs first: one more pass over them.
    cast_s = op.bytes / 2 / (device.memory_bytes_per_s * device.memory_efficiency) if op.fp8 else 0.0
    return max(op.flops / rate, memory_s) + cast_s + device.kernel_s


def _total_s(ops: Iterable[_Op], device: DeviceModel) -> float:
    return sum(_op_s(op, device) for op in ops)


def model_flops(shape: TransformerShape, micro_batch: int = 1) -> float:
    """FLOPs of one sample's forward and backward as model-FLOPs utilisation counts them (``3x`` the forward:
    every product, attention as if unmasked; no recomputation)."""
    builder = _Builder(shape, micro_batch, "bf16", True, "none")
    return 3 * sum(u.model_flops for u in _units(shape, builder)) / micro_batch


def modelled_profile(
    shape: TransformerShape,
    device: DeviceModel,
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4),
    *,
    precision: str = "bf16",
    recompute: str = "none",
    flash_attention: bool | None = None,
    transformer_engine: bool = False,
) -> Profile:
    """``shape`` profiled on ``device`` by its roofline (module docstring): a profile like a measured one, marked
    ``settings.modelled``. ``transformer_engine``: the layers are Transformer Engine's, as Megatron and NeMo run
    them: SwiGLU fused (its input kept, not SiLU's output too) and, in fp8, the products' inputs kept in fp8
    (torch's ``Float8Linear`` keeps them in 16 bits)."""
    if precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if recompute not in RECOMPUTE_MODES:
        raise UsageError(f"--recompute-within must be one of {', '.join(RECOMPUTE_MODES)}, got {recompute!r}")
    if recompute == "op" and shape.arch != "llama":
        raise UsageError("op-level recomputation is modelled as torchtitan runs it, for llama models")
    if precision == "fp8" and device.fp8_speedup <= 1:
        raise UsageError(f"{device.name} has no fp8 tensor cores: model it in bf16 or fp16")
    if not micro_batch_sizes or any(b < 1 for b in micro_batch_sizes):
        raise UsageError("micro-batch sizes must be positive")
    flash = device.flash_attention if flash_attention is None else flash_attention and device.flash_attention
    sizes = tuple(sorted(set(micro_batch_sizes)))
    per_size = [_units(shape, _Builder(shape, b, precision, flash, recompute, transformer_engine)) for b in sizes]

    def per(k: int, value: Any) -> tuple[Any, ...]:
        return tuple(value(units[k]) for units in per_size)

    units = []
    for k, first in enumerate(per_size[0]):
        forward, backward_input, backward_weight = _times(per_size, k, device)
        units.append(
            UnitProfile(
                name=first.name,
                type=first.type,
                param_count=first.params,
                param_bytes=2 * first.params,
                forward_s=forward,
                backward_s=tuple(i + w for i, w in zip(backward_input, backward_weight, strict=True)),
                flops=per(k, lambda u: int(u.model_flops / 2)),
                output_bytes=per(k, lambda u: int(u.output_bytes)),
                saved_bytes=per(k, lambda u: int(u.saved_bytes)),
                tied_params=first.tied,
                tied_param_count=first.tied_count,
                param_tensor_count=first.param_tensors,
                backward_input_s=backward_input,
                backward_weight_s=backward_weight,
                held_bytes=per(k, lambda u: int(u.saved_bytes + u.output_bytes)),
                transient_bytes=per(k, lambda u: int(u.transient_bytes)),
                largest_param_bytes=first.largest_param,
            )
        )
    tensors = _tensors(shape, sizes)
    whole = WholeModel(
        tuple(sum(u.forward_s[i] for u in units) for i in range(len(sizes))),
        tuple(sum(u.backward_s[i] for u in units) for i in range(len(sizes))),
    )
    params = sum(u.param_count for u in units)
    dtype = "float16" if precision == "fp16" else "bfloat16"
    # The fingerprint names what was modelled: the shape (a model's fingerprint is its structure's).
    fingerprint = hashlib.sha256(json.dumps(asdict(shape), sort_keys=True).encode()).hexdigest()
    profile = Profile(
        model=ModelInfo(shape.name, fingerprint, params, 2 * params),
        device=DeviceInfo("cuda", f"{device.name} (modelled)", device.memory_bytes, dtype, "modelled"),
        micro_batch_sizes=sizes,
        units=tuple(units),
        tensors=tensors,
        whole_model=whole,
        settings={
            "modelled": {
                "device_model": device.as_dict(),
                "shape": asdict(shape),
                "precision": precision,
                "recompute_within": recompute,
                "flash_attention": flash,
                "transformer_engine": transformer_engine,
            },
            "attention_heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "seq_len": shape.seq_len,
            "whole_model_path": "unit sum (modelled)",
        },
        pipeline_calibration=modelled_calibration(device),
    )
    _check_readable(profile, f"{shape.name} on {device.name}")
    return profile


def _check_readable(profile: Profile, what: str) -> None:
    """Refuse, in one line, a modelled profile that pipeplan's own reader would refuse (a shape or device of
    numbers so large that its bytes or seconds pass the readers' limits), before it is written."""
    data = json.loads(json.dumps(profile.to_dict()))  # as the file will hold it: lists, not tuples
    check_tree(data, UsageError, f"{what}: the modelled profile is beyond what pipeplan reads")
    try:
        profile_from_dict(data)
    except PipeplanError as exc:
        raise UsageError(f"{what}: the modelled profile is beyond what pipeplan reads: {exc}") from None


# Bytes an optimizer step moves per parameter in mixed precision: Adam reads the fp32 gradient, master weight,
# m and v and writes the last three and the 16-bit weight (4 x 4 + 3 x 4 + 2); SGD with momentum reads the
# gradient, weight and momentum and writes the last two and the 16-bit weight.
OPTIMIZER_BYTES_PER_PARAM = {"adam": 30, "sgd": 22}


def _times(
    per_size: list[list[_Unit]], k: int, device: DeviceModel
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Unit ``k``'s forward, input-gradient and weight-gradient times at each size."""
    return (
        tuple(_total_s(units[k].forward, device) for units in per_size),
        tuple(_total_s(units[k].backward_input, device) for units in per_size),
        tuple(_total_s(units[k].backward_weight, device) for units in per_size),
    )


def tensor_parallel_times(
    profile: Profile, degree: int, sequence_parallel: bool
) -> dict[str, tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]]:
    """A modelled profile's units as one device of a tensor-parallel group of ``degree`` computes them in
    Megatron's layout: by name, the forward, input-gradient and weight-gradient times at each profiled size, every
    product on its slice (its columns or rows over ``degree``, at that shape's efficiency), the attention core on
    its heads, the norms and residuals on a sequence slice with ``sequence_parallel`` and whole without. Empty for
    a measured profile. Collectives are not in them (:mod:`planner.tensor_parallel` adds its own)."""
    device = recorded_device_model(profile.settings)
    if device is None:
        return {}
    modelled = profile.settings["modelled"]
    shape = TransformerShape(**modelled["shape"])
    per_size = [
        _units(
            shape,
            _Builder(
                shape,
                b,
                modelled["precision"],
                modelled["flash_attention"],
                modelled["recompute_within"],
                modelled.get("transformer_engine", False),
                tensor_parallel=degree,
                sequence_parallel=sequence_parallel,
            ),
        )
        for b in profile.micro_batch_sizes
    ]
    return {unit.name: _times(per_size, k, device) for k, unit in enumerate(per_size[0])}


def modelled_calibration(device: DeviceModel) -> dict[str, Any]:
    """The runtime terms of ``device`` as a ``pipeplan.calibration`` document: the shipped CUDA estimate's
    per-action cost, and an optimizer step as fast as the device's HBM moves its bytes (fused kernels: one
    launch per parameter group, not per tensor)."""
    text = resources.files("planner").joinpath("calibrations", "cuda-nccl.json").read_text()
    calibration = json.loads(text)
    bandwidth = device.memory_bytes_per_s * device.memory_efficiency
    for name, moved in OPTIMIZER_BYTES_PER_PARAM.items():
        calibration["optimizer"][name] = {"per_param_s": moved / bandwidth, "per_step_s": 10 * device.kernel_s}
    calibration["notes"] = {
        "how": f"modelled for {device.name}: the shipped CUDA estimate's per-action cost; the optimizer step "
        "from the device's HBM bandwidth (profiles/modelled.py OPTIMIZER_BYTES_PER_PARAM)"
    }
    return calibration


def _tensors(shape: TransformerShape, sizes: tuple[int, ...]) -> tuple[TensorFlow, ...]:
    """The tensors between units: the token ids into the embeddings, each unit's hidden state into the next."""
    s, h = shape.seq_len, shape.hidden
    hidden = tuple(2 * s * h * b for b in sizes)
    gpt = shape.arch == "gpt"
    count = shape.layers + (4 if gpt else 3)
    flows = [TensorFlow(-1, (0, 1) if gpt else (0,), tuple(8 * s * b for b in sizes), "int64", False, "input_ids")]
    if gpt:  # the token and position embeddings both feed the first block
        flows.append(TensorFlow(0, (2,), hidden, "bfloat16", True, "tokens"))
    flows += [
        TensorFlow(k, (k + 1,), hidden, "bfloat16", True, f"hidden{k}") for k in range(1 if gpt else 0, count - 1)
    ]
    return tuple(flows)
