"""torchtitan's configuration read as torchtitan 0.3 builds the pipeline from it.

Its ``--section.key`` overrides (what ``pipeplan export --to torchtitan`` writes, appended to
``-m torchtitan.train --module M --config C``), or a TOML file of the same sections and keys (as torchtitan
0.2 and earlier read). Stages come from ``parallelism.module_fqns_per_model_part`` (each part's modules and
everything under them; a unit in no part is not trained, a name no unit has is dropped: both refused here,
by name), else from ``_generate_llm_fqn_per_model_part`` (``distributed/pipeline_parallel.py``): the
embedding and the final norm and head count as ``pipeline_parallel_first/last_stage_less_layers`` layers (1
each by default) and the layers are dealt out evenly, the first stages taking one more; the stage count is
``ceil((layers + first + last) / pipeline_parallel_layers_per_stage)``, or by default one stage per rank for
a single-stage schedule and two for the others (``_get_pipeline_metadata``). Stage ``s`` runs on rank
``s % pp``, or as a V for ZBVZeroBubble and DualPipeV; ``local_batch_size / pipeline_parallel_microbatch_size``
micro-batches per replica.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from planner.errors import ConfigError, shorten
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule
from planner.trainer_configs.layout import ModelParts, TrainerLayout, count_stages, model_parts, stages_from_names
from planner.trainer_configs.words import as_int, command_words, read_flags

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["read_torchtitan", "torchtitan_layers_per_stage", "torchtitan_settings"]

_KEYS = {
    "parallelism": (
        "pipeline_parallel_degree",
        "module_fqns_per_model_part",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "tensor_parallel_degree",
        "enable_sequence_parallel",
        "context_parallel_degree",
        "expert_parallel_degree",
    ),
    "training": ("local_batch_size", "global_batch_size", "disable_cuda_graphs"),
    "activation_checkpoint": ("mode",),
}
_DEFAULTS: dict[str, Any] = {
    # torchtitan 0.3's ParallelismConfig and TrainingConfig (config/configs.py).
    "pipeline_parallel_degree": 1,
    "module_fqns_per_model_part": None,
    "pipeline_parallel_layers_per_stage": None,
    "pipeline_parallel_first_stage_less_layers": 1,
    "pipeline_parallel_last_stage_less_layers": 1,
    "pipeline_parallel_schedule": "1F1B",
    "pipeline_parallel_microbatch_size": 1,
    "data_parallel_replicate_degree": 1,
    "data_parallel_shard_degree": -1,
    "tensor_parallel_degree": 1,
    "enable_sequence_parallel": True,
    "context_parallel_degree": 1,
    "expert_parallel_degree": 1,
    "local_batch_size": 8,
    "disable_cuda_graphs": False,
    "global_batch_size": -1,
    "mode": "none",
}
_SCHEDULES = {TORCH_SCHEDULE_CLASS[s].removeprefix("Schedule").lower(): s for s in Schedule if s is not Schedule.NAIVE}
_SINGLE_STAGE = (Schedule.GPIPE, Schedule.ONE_F_ONE_B)


def torchtitan_settings(text: str) -> dict[str, Any]:
    """The settings in ``text``: a TOML file (``[parallelism]``, ``[training]``, ``[activation_checkpoint]``) or
    torchtitan's ``--section.key value`` overrides with the ``activation-checkpoint:MODE`` subcommand; each key
    not given has torchtitan's default."""
    settings = dict(_DEFAULTS)
    if _is_toml(text):
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cannot read the TOML file: {exc}") from None
        for section, keys in _KEYS.items():
            values = table.get(section, {})
            if not isinstance(values, Mapping):
                raise ConfigError(f"[{section}] must be a table")
            settings.update({k: values[k] for k in keys if k in values})
        return settings
    words = command_words(text)
    valued = {f"--{section}.{key}" for section, keys in _KEYS.items() for key in keys}
    switches = {
        "--parallelism.enable_sequence_parallel",
        "--parallelism.no_enable_sequence_parallel",
        "--training.disable_cuda_graphs",
        "--training.no_disable_cuda_graphs",
    }
    modes = [w for w in words if w.startswith("activation-checkpoint:")]
    words = [w for w in words if not w.startswith("activation-checkpoint:")]
    parts, rest = _take_parts(words)
    flags = read_flags(rest, valued - switches, switches)
    for flag, raw in flags.values.items():
        settings[flag.rpartition(".")[2]] = raw
    if "--parallelism.no_enable_sequence_parallel" in flags.switches:
        settings["enable_sequence_parallel"] = False
    if "--training.disable_cuda_graphs" in flags.switches:
        settings["disable_cuda_graphs"] = True
    if parts is not None:
        settings["module_fqns_per_model_part"] = parts
    if modes:
        settings["mode"] = modes[-1].partition(":")[2]
    return settings


def _is_toml(text: str) -> bool:
    """A TOML file begins (past comments) with a ``[section]`` or a ``key = value``; a command line with a word."""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line.startswith("[") or ("=" in line and not line.startswith("-"))
    return False


def _take_parts(words: Sequence[str]) -> tuple[list[list[str]] | None, list[str]]:
    """``--parallelism.module_fqns_per_model_part`` takes every word up to the next flag: one per model part,
    its modules comma-joined (tyro's reading of ``list[list[str]]``)."""
    flag = "--parallelism.module_fqns_per_model_part"
    parts: list[list[str]] | None = None
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word != flag and not word.startswith(flag + "="):
            rest.append(word)
            continue
        values = [word.partition("=")[2]] if "=" in word else []
        while i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        parts = [[name for name in value.split(",") if name] for value in values]
    return parts, rest


def torchtitan_layers_per_stage(num_stages: int, num_layers: int, first_less: int, last_less: int) -> list[int]:
    """Decoder layers per stage by torchtitan's ``_generate_llm_fqn_per_model_part``, with its errors."""
    if num_stages == 1:
        return [num_layers]
    effective = num_layers + first_less + last_less
    if num_stages > effective:
        raise ConfigError(
            f"torchtitan: Number of stages ({num_stages}) cannot be greater than effective layers ({effective})"
        )
    per, extra = divmod(effective, num_stages)
    if first_less > per or last_less > per:
        which, weight = ("input", first_less) if first_less > per else ("output", last_less)
        raise ConfigError(f"torchtitan: {which}_weight ({weight}) exceeds minimum layers per stage ({per})")
    counts, placed = [], 0
    for s in range(num_stages):
        take = per + (s < extra) - (first_less if s == 0 else last_less if s == num_stages - 1 else 0)
        take = max(0, min(take, num_layers - placed))
        counts.append(take)
        placed += take
    return counts


def read_torchtitan(
    text: str, units: Sequence[str], *, renames: Sequence[tuple[str, str]] = (), devices: int | None = None
) -> TrainerLayout:
    """The layout torchtitan 0.3 builds from ``text`` for a model of ``units`` (the profile's names mapped onto
    torchtitan's with ``renames``); ``devices`` is the world size, which ``data_parallel_shard_degree -1`` fills
    (default: the other degrees' product, one shard)."""
    s = torchtitan_settings(text)
    pp = _int(s, "pipeline_parallel_degree")
    tp = _int(s, "tensor_parallel_degree")
    if pp > 1 and not _bool(s["disable_cuda_graphs"], "disable_cuda_graphs"):
        raise ConfigError(
            "torchtitan: CUDA graphs do not support pipeline parallelism yet. Set --training.disable_cuda_graphs."
        )
    for key in ("context_parallel_degree", "expert_parallel_degree"):
        if _int(s, key) > 1:
            raise ConfigError(f"{key} {s[key]}: pipeplan does not model context or expert parallelism")
    replicate = _int(s, "data_parallel_replicate_degree")
    shard = _int(s, "data_parallel_shard_degree", least=-1)
    if shard == 0 or shard < -1:
        raise ConfigError(f"data_parallel_shard_degree must be -1 or >= 1, got {shard}")
    world = devices or pp * tp * replicate * max(shard, 1)
    if shard == -1:
        if world % (pp * tp * replicate):
            raise ConfigError(
                f"torchtitan: the world size {world} is not divisible by pp {pp} x tp {tp} x dp_replicate {replicate}"
            )
        shard = world // (pp * tp * replicate)
    if pp * tp * replicate * shard != world:
        raise ConfigError(
            f"torchtitan: Invalid parallel dims: dp_replicate({replicate}) * dp_shard({shard}) * tp({tp}) * "
            f"pp({pp}) != WORLD_SIZE({world})"
        )
    dp = replicate * shard
    name = str(s["pipeline_parallel_schedule"])
    schedule = _SCHEDULES.get(name.lower())
    if schedule is None:
        raise ConfigError(
            f"pipeline_parallel_schedule {shorten(repr(name), 40)} is none of torch's ({', '.join(sorted(_SCHEDULES))})"
        )
    stages, split = _stages(s, units, renames, pp, schedule)
    vp = len(stages) // pp
    micro = _int(s, "pipeline_parallel_microbatch_size")
    local = _int(s, "local_batch_size")
    if local % micro:
        raise ConfigError(f"torchtitan: Batch size {local} must be divisible by microbatch_size {micro}")
    m = local // micro
    global_batch = _int(s, "global_batch_size", least=-1)
    notes = []
    if global_batch not in (-1, local * dp):
        if global_batch % (local * dp):
            raise ConfigError(
                f"torchtitan: global batch size {global_batch} must be a multiple of local_batch_size {local} times "
                f"the data-parallel degree {dp}"
            )
        notes.append(
            f"gradient accumulation: {global_batch // (local * dp)} pipeline steps per optimizer step; the predicted "
            "iteration is one pipeline step"
        )
    mode = str(s["mode"])
    if mode not in ("none", "full", "selective"):
        raise ConfigError(f"activation checkpointing mode {shorten(repr(mode), 30)} is not none, full or selective")
    if mode == "selective":
        notes.append(
            "selective activation checkpointing is not modelled: predicted without recomputation (memory an upper "
            "bound, time a lower one)"
        )
    if replicate > 1 and shard > 1:
        notes.append(f"HSDP ({replicate} replicas of {shard} shards) is modelled as FSDP over all {dp} replicas")
    sequence = _bool(s["enable_sequence_parallel"], "enable_sequence_parallel") and tp > 1
    read = [
        f"pipeline_parallel_degree = {pp}, schedule {name}" + (f", {vp} stages per rank" if vp > 1 else ""),
        f"decoder layers per stage = {split}",
        f"tensor_parallel_degree = {tp}" + (" with sequence parallelism" if sequence else ""),
        f"world size = {world}: data parallel {dp} (replicate {replicate} x shard {shard})"
        + ("" if devices else " (--devices to give the job's world size)"),
        f"local_batch_size = {local}, microbatch_size = {micro}: {m} micro-batches per replica",
    ]
    return TrainerLayout(
        trainer="torchtitan",
        stages=stages,
        num_ranks=pp,
        schedule=schedule,
        micro_batch_size=micro,
        num_microbatches=m,
        recompute=(mode == "full",) * len(stages),
        data_parallel=dp,
        tensor_parallel=tp,
        sequence_parallel=sequence,
        shard="full" if shard > 1 else "none",
        read=tuple(read),
        notes=tuple(notes),
    )


def _stages(
    s: Mapping[str, Any], units: Sequence[str], renames: Sequence[tuple[str, str]], pp: int, schedule: Schedule
) -> tuple[tuple[tuple[str, ...], ...], str]:
    explicit = s["module_fqns_per_model_part"]
    if explicit is not None:
        if not isinstance(explicit, list) or not all(isinstance(p, list) for p in explicit):
            raise ConfigError("module_fqns_per_model_part must be a list of lists of module names")
        stages = stages_from_names(explicit, units, renames, "torchtitan", "module_fqns_per_model_part")
        _check_stage_count(len(stages), pp, schedule)
        return stages, f"as named ({len(stages)} parts)"
    parts: ModelParts = model_parts(units, "torchtitan")
    first, last = (
        _int(s, "pipeline_parallel_first_stage_less_layers", 0),
        _int(s, "pipeline_parallel_last_stage_less_layers", 0),
    )
    per_stage = s["pipeline_parallel_layers_per_stage"]
    if per_stage is not None:
        per = _int(s, "pipeline_parallel_layers_per_stage")
        num_stages = math.ceil((len(parts.layers) + first + last) / per)
        if num_stages % pp:
            raise ConfigError(
                f"torchtitan: Number of virtual stages ({num_stages}) must be divisible by pipeline parallel size "
                f"({pp})"
            )
    else:
        num_stages = pp * (1 if schedule in _SINGLE_STAGE else 2)
    _check_stage_count(num_stages, pp, schedule)
    counts = torchtitan_layers_per_stage(num_stages, len(parts.layers), first, last)
    return parts.stages(counts, "torchtitan"), count_stages(counts)


def _check_stage_count(num_stages: int, pp: int, schedule: Schedule) -> None:
    if num_stages % pp:
        raise ConfigError(f"torchtitan: num_stages {num_stages} must be evenly divisible by pp_degree {pp}")
    per_rank = num_stages // pp
    if schedule in _SINGLE_STAGE and per_rank != 1:
        raise ConfigError(f"torchtitan: Single stage schedule requires exactly 1 stage per rank, but got {per_rank}")
    if schedule not in _SINGLE_STAGE and per_rank < 2:
        raise ConfigError(f"torchtitan: Multi-stage schedule requires at least 2 stages per rank, but got {per_rank}")
    if schedule.v_shape and per_rank != 2:
        raise ConfigError(f"torchtitan: v schedules assume 2 stages per rank, got {per_rank}")


def _int(s: Mapping[str, Any], key: str, least: int = 1) -> int:
    value = s[key]
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer, got {value}")
    return as_int(key, str(value), least)


def _bool(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{key} must be true or false, got {shorten(repr(value), 30)}")
