"""DeepSpeed's pipeline configuration read as DeepSpeed 0.19 partitions a ``PipelineModule``.

The layers are the profile's units, in order (``PipelineModule(layers=...)``). DeepSpeed takes the stage count
and the partition method as ``PipelineModule`` arguments, not from ds_config, so pipeplan reads them from the
ds_config's ``pipeline`` section: ``stages`` (``num_stages``), ``partition_method`` (``parameters``, DeepSpeed's
default, ``uniform`` or ``type:REGEX``) or ``parts`` (explicit boundaries, which DeepSpeed has no argument for
and ``pipeplan export --to deepspeed`` sets by a subclass), and ``activation_checkpoint_interval``. That export's
Python (its ``PLAN_PARTS``, ``PLAN_TOPOLOGY``, ``PLAN_DS_CONFIG``) is read too.

Partitions as ``PipelineModule._partition_layers`` (``runtime/pipe/module.py``): ``uniform`` by
``partition_uniform``, ``parameters`` and ``type:REGEX`` by ``partition_balanced`` (``runtime/utils.py``) over
each layer's parameters, or 1 for the layers whose class name the regular expression finds (case-insensitive),
0 for the others. One stage per rank, DeepSpeed's 1F1B-like schedule; ``train_batch_size = micro-batch x
gradient_accumulation_steps x data-parallel size`` (``runtime/config.py``, ``_batch_assertion``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from planner.errors import ConfigError, shorten
from planner.schedule.orders import Schedule
from planner.trainer_configs.layout import TrainerLayout
from planner.trainer_configs.words import as_int
from profiles.format import UnitProfile

__all__ = ["read_deepspeed", "partition_uniform", "partition_balanced"]


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: ``num_items // num_parts`` each, the first ``num_items % num_parts``
    parts one more; ``parts[p] = min(p, num_items)`` when there are no more items than parts.

    >>> partition_uniform(10, 4)
    [0, 3, 6, 8, 10]
    """
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced``: the linear partition minimising the spread (largest part less smallest)
    of the parts' weight sums, by its dynamic programme with its tie-breaking (the last split point of equal cost
    wins), so that the boundaries are DeepSpeed's own (Skiena, The Algorithm Design Manual, Sec. 8.5)."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = float("inf")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    dp_max[0][0] = 0.0
    cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                high, low = max(dp_max[k][j - 1], part), min(dp_min[k][j - 1], part)
                if cost[i][j] >= high - low:
                    cost[i][j], dp_max[i][j], dp_min[i][j], position[i][j] = high - low, high, low, k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


def read_deepspeed(
    text: str,
    units: Sequence[UnitProfile],
    *,
    renames: Sequence[tuple[str, str]] = (),
    devices: int | None = None,
) -> TrainerLayout:
    """The layout DeepSpeed builds from ``text`` (a ds_config JSON with its ``pipeline`` section, or the Python
    of ``pipeplan export --to deepspeed``) for a model whose layers are ``units``; ``devices`` is the world size
    (default: ``stages x train_batch_size / (micro-batch x accumulation steps)``)."""
    config, module = _python_export(text, units, renames) if _is_python(text) else _json_config(text)
    names = [u.name for u in units]
    by_name = {u.name: u for u in units}
    stages_value = module.get("stages")
    if stages_value is None or stages_value == "auto":
        raise ConfigError(
            "the stage count is missing: give ds_config's pipeline section \"stages\": N (PipelineModule's num_stages)"
        )
    num_stages = as_int("pipeline.stages", str(stages_value))
    parts, method = _parts(module, units, num_stages)
    empty = [s for s in range(num_stages) if parts[s + 1] <= parts[s]]
    if empty:
        raise ConfigError(
            f"DeepSpeed's partition ({method}) gives stage{'s' if len(empty) > 1 else ''} "
            f"{', '.join(map(str, empty))} of {num_stages} no layers (parts {parts}): those ranks would idle and "
            "pipeplan plans stages of at least one unit; use another partition_method or explicit parts"
        )
    micro, accumulation, dp, batch_read = _batch(config, num_stages, devices, module.get("data_parallel"))
    zero = _zero_stage(config)
    interval = as_int("activation_checkpoint_interval", str(module.get("activation_checkpoint_interval", 0)), 0)
    stages = tuple(tuple(names[parts[s] : parts[s + 1]]) for s in range(num_stages))
    notes = []
    if method.lower().startswith("type:"):
        pattern = re.compile(method.split(":")[1], re.IGNORECASE)
        none = [s for s, held in enumerate(stages) if not any(pattern.search(by_name[u].type) for u in held)]
        if none:
            notes.append(
                f"{method} balances only the layers it matches, and stage{'s' if len(none) > 1 else ''} "
                f"{', '.join(map(str, none))} hold{'s' if len(none) == 1 else ''} none of them"
            )
    if interval > 1:
        notes.append(
            f"activation_checkpoint_interval {interval} checkpoints every {interval} layers; pipeplan models "
            "whole-stage recomputation: predicted as every layer recomputed"
        )
    read = [
        f"stages = {num_stages}, partition {method}: layers per stage {', '.join(str(len(s)) for s in stages)}",
        f"world size = {num_stages * dp}: data parallel {dp}, ZeRO stage {zero}",
        batch_read,
    ]
    return TrainerLayout(
        trainer="deepspeed",
        stages=stages,
        num_ranks=num_stages,
        schedule=Schedule.ONE_F_ONE_B,
        micro_batch_size=micro,
        num_microbatches=accumulation,
        recompute=(interval > 0,) * num_stages,
        data_parallel=dp,
        shard="optimizer" if zero == 1 and dp > 1 else "none",
        placement=_placement(module),
        read=tuple(read),
        notes=tuple(notes),
    )


def _is_python(text: str) -> bool:
    return "PLAN_PARTS" in text and not text.lstrip().startswith("{")


def _json_config(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"cannot read the ds_config as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError("a ds_config is a JSON object")
    module = config.get("pipeline", {})
    if not isinstance(module, dict):
        raise ConfigError("the ds_config's pipeline section must be an object")
    return config, module


def _python_export(
    text: str, units: Sequence[UnitProfile], renames: Sequence[tuple[str, str]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values of ``pipeplan export --to deepspeed``'s Python: its assignments, read without running it."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise ConfigError(f"cannot read the Python: {exc.msg} (line {exc.lineno})") from None
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "PLAN_TOPOLOGY" and isinstance(node.value, ast.Call):
                found[name] = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
            elif name.startswith("PLAN_"):
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError:
                    raise ConfigError(f"{name} is not a literal value") from None
    missing = [n for n in ("PLAN_PARTS", "PLAN_TOPOLOGY", "PLAN_DS_CONFIG") if n not in found]
    if missing:
        raise ConfigError(f"the Python lacks {', '.join(missing)} (as `pipeplan export --to deepspeed` writes them)")
    from planner.export import apply_renames

    listed = found.get("PLAN_UNITS")
    if listed is not None and list(listed) != list(apply_renames([u.name for u in units], renames)):
        raise ConfigError(
            f"PLAN_UNITS names {len(listed)} layers that are not the profile's {len(units)} units in order "
            "(map the names with --rename OLD=NEW)"
        )
    topology = found["PLAN_TOPOLOGY"]
    if "num_pp" in topology:
        pp, dp, placement = topology["num_pp"], topology.get("num_dp", 1), "replicas-in-node"
    else:
        axes, dims = topology.get("axes", []), topology.get("dims", [])
        if sorted(axes) != ["data", "pipe"] or len(dims) != 2:
            raise ConfigError(f"PLAN_TOPOLOGY {shorten(str(topology), 60)} is not a pipe x data topology")
        sizes = dict(zip(axes, dims, strict=True))
        pp, dp = sizes["pipe"], sizes["data"]
        placement = "pipeline-in-node" if axes[-1] == "pipe" else "replicas-in-node"
    config = dict(found["PLAN_DS_CONFIG"])
    module = {
        "data_parallel": dp,
        "stages": pp,
        "parts": found["PLAN_PARTS"],
        "activation_checkpoint_interval": found.get("PLAN_ACTIVATION_CHECKPOINT_INTERVAL", 0),
        "placement": placement,
    }
    return config, module


def _parts(module: Mapping[str, Any], units: Sequence[UnitProfile], num_stages: int) -> tuple[list[int], str]:
    explicit = module.get("parts")
    if explicit is not None:
        parts = [as_int("pipeline.parts", str(p), 0) for p in explicit]
        if len(parts) != num_stages + 1 or parts[0] != 0 or parts[-1] != len(units) or parts != sorted(parts):
            raise ConfigError(
                f"pipeline.parts {shorten(str(explicit), 60)} must rise from 0 to the {len(units)} layers in "
                f"{num_stages + 1} boundaries"
            )
        return parts, "explicit parts"
    method = str(module.get("partition_method", "parameters"))
    key = method.lower()
    if key == "uniform":
        return partition_uniform(len(units), num_stages), method
    if key == "parameters":
        # A layer built on its stage holds its parameters, a tied one (TiedLayerSpec) included.
        return partition_balanced([u.param_count + u.tied_param_count for u in units], num_stages), method
    if key.startswith("type:"):
        try:
            pattern = re.compile(method.split(":")[1], re.IGNORECASE)
        except re.error as exc:
            raise ConfigError(f"partition_method {shorten(repr(method), 40)}: {exc}") from None
        weights = [1 if pattern.search(u.type) else 0 for u in units]
        if not any(weights):
            raise ConfigError(f"DeepSpeed: Partitioning '{method.split(':')[1]}' found no valid layers to partition.")
        return partition_balanced(weights, num_stages), method
    raise ConfigError(
        f"DeepSpeed: Partitioning method {shorten(repr(method), 40)} not implemented (uniform, parameters, type:REGEX)"
    )


def _batch(
    config: Mapping[str, Any], num_stages: int, devices: int | None, dp: int | None
) -> tuple[int, int, int, str]:
    """Micro-batch, accumulation steps (micro-batches per step) and data-parallel size, by DeepSpeed's rules:
    any two of train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps give the third."""

    def get(key: str) -> int | None:
        value = config.get(key)
        return None if value is None or value == "auto" else as_int(key, str(value))

    batch, micro, steps = (
        get("train_batch_size"),
        get("train_micro_batch_size_per_gpu"),
        get("gradient_accumulation_steps"),
    )
    if devices is not None:
        if devices % num_stages:
            raise ConfigError(f"--devices {devices} is not a multiple of the {num_stages} pipeline stages")
        dp = devices // num_stages
    if dp is None:
        dp = batch // (micro * steps) if batch and micro and steps and batch % (micro * steps) == 0 else 1
    if batch is not None and micro is not None and steps is None:
        steps = batch // (micro * dp) if batch % (micro * dp) == 0 else None
    elif batch is not None and steps is not None and micro is None:
        micro = batch // (steps * dp) if batch % (steps * dp) == 0 else None
    elif batch is None and micro is not None:
        steps = steps or 1
        batch = micro * steps * dp
    if batch is None or micro is None or steps is None or batch != micro * steps * dp:
        raise ConfigError(
            f"DeepSpeed: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
            f"gradient_acc_step * world_size {batch} != {micro} * {steps} * {dp}"
        )
    return micro, steps, dp, f"train_batch_size = {batch} = micro-batch {micro} x {steps} steps x data parallel {dp}"


def _placement(module: Mapping[str, Any]) -> str:
    """The export's topology says where ranks go (``pipe`` innermost: each pipeline on consecutive ranks);
    DeepSpeed's default ``PipeDataParallelTopology`` puts a stage's replicas on consecutive ranks."""
    placement = module.get("placement", "replicas-in-node")
    if placement not in ("pipeline-in-node", "replicas-in-node"):
        raise ConfigError(f"pipeline.placement must be pipeline-in-node or replicas-in-node, got {placement!r}")
    return str(placement)


def _zero_stage(config: Mapping[str, Any]) -> int:
    zero = config.get("zero_optimization", {})
    stage = as_int("zero_optimization.stage", str(zero.get("stage", 0) if isinstance(zero, Mapping) else 0), 0)
    if stage > 1:
        raise ConfigError("DeepSpeed: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    return stage
