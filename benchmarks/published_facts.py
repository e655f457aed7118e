"""What a published table states, read into pipeplan's terms (``../shared/published/README.md`` has the schema).

The GPU as a device model, the model as a :class:`~profiles.modelled.TransformerShape`, the row's schedule,
recomputation and precision, and the iteration its throughput implies. A fact that cannot be read, or names what
pipeplan does not model (a GPU with no device model of its family, a mixture of experts, tf32), is a
:class:`~planner.errors.PipeplanError` that names it: the row is reported with it as its note, not predicted, and the
other rows go on. Nothing here depends on which table is read.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.errors import PipeplanError
from planner.schedule.orders import Schedule
from profiles.device_model import DEVICE_MODELS, GIB, DeviceModel, device_model
from profiles.modelled import TransformerShape, model_flops

__all__ = [
    "DEVICE_FILES",
    "stated_number",
    "stated_whole",
    "gpu_key",
    "device_for",
    "shape_for",
    "schedule_for",
    "recompute_for",
    "precision_for",
    "year_of",
    "torchtitan_microbatch_size",
    "measured_iteration_s",
]

DEVICE_FILES = Path(__file__).resolve().parent / "device_models"

GPT_LIKE = ("gpt", "gpt2", "gpt3", "gpt-neox", "megatron-gpt", "bloom", "opt", "falcon")
"""Architectures of ``gpt``'s layer (LayerNorm, a GELU MLP); their position encodings differ, not their costs."""
LLAMA_LIKE = ("llama", "llama2", "llama3", "mistral", "qwen", "qwen2", "qwen3")
"""Architectures of ``llama``'s layer (RMSNorm, SwiGLU, grouped-query attention)."""

SCHEDULE_NAMES = {"interleaved": "interleaved-1f1b", "vpp": "interleaved-1f1b"}
"""Other names tables give pipeplan's schedules."""


def gpu_key(name: str) -> str:
    """A GPU's name as the device models spell it: ``NVIDIA A100 SXM4 80GB`` -> ``a100-80gb``."""
    key = re.sub(r"[\s_/]+", "-", name.strip().lower())
    key = re.sub(r"^nvidia-", "", key)
    key = re.sub(r"-(sxm\d*|hbm\w*)(?=-|$)", "", key)
    return re.sub(r"(\d+)-gb\b", r"\1gb", key)


def stated_number(facts: dict[str, Any], key: str) -> float | None:
    """``facts[key]`` as a positive number; None where it is not stated (null or 0, as the tables leave a blank)."""
    value = facts.get(key)
    if value is None or value == 0:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PipeplanError(f"{key} {value!r} is not a number") from None
    if not number > 0 or number == float("inf"):
        raise PipeplanError(f"{key} {value!r} is not a positive number")
    return number


def stated_whole(row: dict[str, Any], key: str, default: int | None = 1) -> int | None:
    """``row[key]`` as a positive whole number; ``default`` where it is not stated."""
    value = row.get(key)
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise PipeplanError(f"{key} {value!r} is not a whole number") from None
    exact = number == value or str(number) == str(value).strip()  # 8, 8.0 and "8", not 2.5
    if not exact or number < 1:
        raise PipeplanError(f"{key} {value!r} is not a positive whole number")
    return number


def _stated_memory_gib(key: str, hardware: dict[str, Any]) -> float | None:
    """The memory the table states, else the one the GPU's name gives (``h100-94gb``: 94)."""
    stated = stated_number(hardware, "hbm_gib")
    named = re.search(r"(\d+)gb\b", key)
    return stated or (float(named.group(1)) if named else None)


def device_for(hardware: dict[str, Any]) -> tuple[DeviceModel, str]:
    """The table's GPU as a device model, with the links and node size the table states, and a note where the GPU
    is not a device model of its own: a GPU of a family that has one (``h100-94gb``) takes that family's constants,
    with the memory and 16-bit peak the table states."""
    given = str(hardware.get("gpu") or "")
    key = gpu_key(given)
    note = ""
    if key in DEVICE_MODELS:
        base = DEVICE_MODELS[key]
    elif (DEVICE_FILES / f"{key}.json").is_file():
        base = device_model(str(DEVICE_FILES / f"{key}.json"))
    else:
        family = [m for name, m in DEVICE_MODELS.items() if key and name.split("-")[0] == key.split("-")[0]]
        if not family:
            raise PipeplanError(f"GPU {given!r} has no device model (built-ins: {', '.join(DEVICE_MODELS)})")
        memory_gib = _stated_memory_gib(key, hardware)
        same = [m for m in family if memory_gib and round(m.memory_bytes / GIB) == round(memory_gib)]
        base = (same or family)[0]
        changes: dict[str, Any] = {"name": key}
        if memory_gib:
            changes["memory_bytes"] = int(memory_gib * GIB)
        peak = stated_number(hardware, "peak_tflops_16bit")
        if peak:
            changes["matmul_flops_per_s"] = peak * 1e12
        base = replace(base, **changes)
        note = f"GPU {given!r}: {(same or family)[0].name}'s constants with the table's memory and peak"
    links: dict[str, Any] = {}
    nvlink = stated_number(hardware, "intra_node_GBps_per_gpu")
    network = stated_number(hardware, "inter_node_Gbps_per_gpu")
    if nvlink:  # tables give NVLink's both directions together
        links["intra_node_bytes_per_s"] = nvlink * 1e9 / 2
    if network:
        links["inter_node_bytes_per_s"] = network * 1e9 / 8
    node = stated_number(hardware, "gpus_per_node")
    if node:
        links["devices_per_node"] = int(node)
    return replace(base, **links), note


def _arch(name: str, stated: Any) -> str:
    arch = str(stated or "").strip().lower()
    if arch in GPT_LIKE:
        return "gpt"
    if arch in LLAMA_LIKE or not arch:
        return "llama"
    raise PipeplanError(f"{name}: architecture {stated!r} is not modelled (gpt- or llama-like layers)")


def shape_for(name: str, entry: dict[str, Any] | None) -> tuple[TransformerShape, list[str]]:
    """The model's shape, and notes on what was assumed (an unpublished vocabulary)."""
    if not isinstance(entry, dict):
        raise PipeplanError(f"model {name!r} has no shape in the table")
    missing = [k for k in ("layers", "hidden", "heads", "seq_len") if not entry.get(k)]
    if missing:
        raise PipeplanError(f"{name}: {', '.join(missing)} not published")
    notes = []
    arch = _arch(name, entry.get("arch"))
    vocab = entry.get("vocab")
    if not vocab:
        vocab = 51200
        notes.append("vocabulary not published: 51,200 assumed")
    tied = entry.get("tied_embeddings")
    try:
        shape = TransformerShape(
            name,
            arch,
            int(entry["layers"]),
            int(entry["hidden"]),
            int(entry["heads"]),
            int(entry.get("kv_heads") or entry["heads"]),
            int(entry.get("ffn_hidden") or 4 * entry["hidden"]),
            int(vocab),
            int(entry["seq_len"]),
            bool(arch == "gpt" if tied is None else tied),
        )
    except (TypeError, ValueError):
        raise PipeplanError(f"{name}: its shape is not numbers") from None
    return shape, notes


def schedule_for(row: dict[str, Any]) -> tuple[Schedule, int]:
    """The row's schedule and virtual stages a rank: unstated, 1F1B; 1F1B with several virtual stages a rank is
    interleaved 1F1B (Megatron's virtual pipeline), and interleaved 1F1B of one is 1F1B; virtual stages unstated
    with an interleaved schedule, 2."""
    vp_stated = stated_whole(row, "vp", None)
    name = row.get("schedule") or "1f1b"
    schedule = Schedule.parse(SCHEDULE_NAMES.get(str(name).strip().lower(), name))
    if schedule is Schedule.ONE_F_ONE_B and (vp_stated or 1) > 1:
        schedule = Schedule.INTERLEAVED_1F1B
    vp = vp_stated or (2 if schedule is Schedule.INTERLEAVED_1F1B else 1)
    if schedule is Schedule.INTERLEAVED_1F1B and vp == 1:
        schedule = Schedule.ONE_F_ONE_B
    return schedule, vp


def recompute_for(row: dict[str, Any]) -> str:
    """``none``, ``selective`` or ``full`` (unstated: none)."""
    recompute = str(row.get("recompute") or "none").strip().lower()
    if recompute not in ("none", "selective", "full"):
        raise PipeplanError(f"recomputation {row.get('recompute')!r} is not modelled (none, selective, full)")
    return recompute


def precision_for(table: dict[str, Any], device: DeviceModel) -> str:
    """``fp8`` where the table ran Float8 products on a GPU that has them, else 16-bit (``bf16``)."""
    precision = str(table.get("precision") or "bf16").strip().lower()
    if precision in ("fp32", "tf32", "float32"):
        raise PipeplanError(f"precision {table.get('precision')!r} is not modelled (16-bit and fp8 products)")
    return "fp8" if precision == "fp8" and device.fp8_speedup > 1 else "bf16"


def _month_of(row: dict[str, Any], table: dict[str, Any]) -> tuple[int, int] | None:
    """``(year, month)`` of the row's date, else of its framework's; a year alone is taken as its December."""
    for text in (str(row.get("date") or ""), str(table.get("framework") or "")):
        found = re.search(r"\b(20\d\d)(?:-(0[1-9]|1[0-2]))?\b", text)
        if found:
            return int(found.group(1)), int(found.group(2) or 12)
    return None


def year_of(row: dict[str, Any], table: dict[str, Any]) -> int | None:
    when = _month_of(row, table)
    return when[0] if when else None


TORCHTITAN_STAGES_FROM = (2025, 1)
"""torchtitan pull request #781 (2025-01-07): an unset ``experimental.pipeline_parallel_microbatches`` became the
number of stages, ``pipeline_parallel_degree`` times the stages a rank, where it had been the degree alone."""
TORCHTITAN_SIZE_FROM = (2025, 4)
"""torchtitan pull request #1073 (2025-04-08): ``parallelism.pipeline_parallel_microbatch_size`` (default 1) replaced
the count of micro-batches."""


def torchtitan_microbatch_size(row: dict[str, Any], table: dict[str, Any], per_replica: int, pp: int, vp: int) -> int:
    """The micro-batch torchtitan runs a row at that does not state it: its default at the row's date (else its
    framework's; neither: today's). Under a pipeline, a replica's batch of ``per_replica`` samples in as many
    micro-batches as pipeline ranks before :data:`TORCHTITAN_STAGES_FROM`, as stages until
    :data:`TORCHTITAN_SIZE_FROM`, in micro-batches of 1 since; without one, in one micro-batch."""
    if pp == 1:
        return per_replica
    when = _month_of(row, table) or TORCHTITAN_SIZE_FROM
    if when >= TORCHTITAN_SIZE_FROM:
        return 1
    count = pp if when < TORCHTITAN_STAGES_FROM else pp * vp
    return max(1, per_replica // count)


def measured_iteration_s(
    row: dict[str, Any], shape: TransformerShape, peak_flops_per_s: float | None, gpus: int, gbs: int | None
) -> float | None:
    """The published iteration, or the one its throughput implies (tokens or samples a second, TFLOP/s or MFU a
    GPU, over ``gbs`` samples a step); None where none was published."""
    measured = row.get("measured") or {}
    if not isinstance(measured, dict):
        raise PipeplanError("measured is not an object of the schema's fields")
    if stated_number(measured, "iteration_s"):
        return stated_number(measured, "iteration_s")
    if not gbs or not gpus:
        return None
    if tokens := stated_number(measured, "tokens_per_s_per_gpu"):
        return gbs * shape.seq_len / (tokens * gpus)
    if samples := stated_number(measured, "samples_per_s"):
        return gbs / samples
    flops = model_flops(shape) * gbs
    if tflops := stated_number(measured, "tflops_per_gpu"):
        return flops / (tflops * 1e12 * gpus)
    if (mfu := stated_number(measured, "mfu")) and peak_flops_per_s:
        return flops / (mfu * peak_flops_per_s * gpus)
    return None
