"""Megatron-Core's arguments read as megatron-core 0.16-0.19 builds the pipeline from them.

Stage ``i`` of ``pp x vp`` (virtual chunk ``i // pp`` of rank ``i % pp``) holds, in order:

- with ``--pipeline-model-parallel-layout``: the layout's ``i``-th ``|``-separated part (``E`` the embedding,
  ``t`` a decoder layer, ``L`` the final norm and head; ``x*n`` and ``(...)*n`` repeat), checked as
  ``PipelineParallelLayerLayout.validate_layer_layout`` does (``pipeline_parallel_layer_layout.py``);
- else ``get_num_layers_to_build`` (``transformer/transformer_block.py``): ``num_layers / pp`` per rank (Megatron
  asserts it divides), split evenly over the ``vp`` chunks; ``--decoder-first/last-pipeline-num-layers`` fix the
  first / last rank's and the others share the rest evenly; ``--account-for-embedding/loss-in-pipeline-split``
  count the embedding / loss as a layer of the first / last stage. Layers follow in stage order
  (``get_transformer_layer_offset``).

The schedule is 1F1B, interleaved when ``vp > 1``; the micro-batches per replica are ``global / (micro x dp)``
with ``dp = world / (tp x pp)`` (``megatron/training/arguments.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from planner.errors import ConfigError, shorten
from planner.schedule.orders import Schedule
from planner.trainer_configs.layout import ModelParts, TrainerLayout, count_stages, model_parts
from planner.trainer_configs.words import Flags, as_int, command_words, read_flags

__all__ = ["read_megatron", "megatron_layers_per_stage", "parse_layout"]

_VALUED = (
    "--pipeline-model-parallel-size",
    "--pipeline-model-parallel-layout",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--tensor-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--num-layers",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    # torchrun's, where the command line launches Megatron: the world size.
    "--nproc-per-node",
    "--nproc_per_node",
    "--nnodes",
)
_SWITCHES = (
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--use-tp-pp-dp-mapping",
)
_LAYOUT_SYMBOLS = {"E": "embedding", "t": "decoder", "L": "loss", "m": "mtp"}


def parse_layout(text: str) -> list[list[str]]:
    """``--pipeline-model-parallel-layout`` as Megatron's ``parse_str_to_list``: commas dropped, ``(...)*n`` then
    ``x*n`` unrolled, stages split at ``|``; each stage a list of ``E``, ``t``, ``L``, ``m``.

    >>> parse_layout("Et*2|(tt|)*2L")
    [['E', 't', 't'], ['t', 't'], ['t', 't'], ['L']]
    """
    unrolled = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        unrolled = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), unrolled)
    stages = []
    for stage in unrolled.split("|"):
        for symbol in stage:
            if symbol not in _LAYOUT_SYMBOLS:
                raise ConfigError(
                    f"--pipeline-model-parallel-layout {shorten(repr(text), 60)}: invalid layer character "
                    f"{symbol!r} (Megatron knows E, t, L, m)"
                )
        stages.append(list(stage))
    return stages


def megatron_layers_per_stage(
    num_layers: int,
    pp: int,
    vp: int,
    *,
    first: int | None = None,
    last: int | None = None,
    embedding_counts: bool = False,
    loss_counts: bool = False,
) -> list[int]:
    """Decoder layers of each of the ``pp x vp`` stages, in stage order (stage ``i``: chunk ``i // pp`` of rank
    ``i % pp``), by ``get_num_layers_to_build``; raises with Megatron's own assertion where it would."""
    per_rank: list[int] = []
    for rank in range(pp):
        if first is not None or last is not None:
            if embedding_counts or loss_counts:
                raise ConfigError(
                    "Megatron: Does not support standalone embedding stage and standalone loss stage with uneven pp "
                    "(--decoder-first/last-pipeline-num-layers with --account-for-embedding/loss-in-pipeline-split)"
                )
            rest, ranks_left = num_layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
            if bool(rest) != bool(ranks_left):
                raise ConfigError(
                    f"Megatron: Mismatch: {rest} middle layers remaining but {ranks_left} middle PP stages available "
                    "(--decoder-first/last-pipeline-num-layers)"
                )
            if ranks_left > 0 and rest % ranks_left:
                raise ConfigError(
                    f"Megatron: With uneven pipelineing the left over layers must be divisible by left over stages "
                    f"({rest} layers left for {ranks_left} ranks)"
                )
            count = rest // ranks_left if ranks_left > 0 else 0
            count = first if rank == 0 and first is not None else count
            count = last if rank == pp - 1 and last is not None else count
        else:
            total = num_layers + embedding_counts + loss_counts
            if total % pp:
                raise ConfigError(
                    f"Megatron: num_layers should be divisible by pipeline_model_parallel_size ({total} layers"
                    f"{' counting the embedding/loss' if embedding_counts or loss_counts else ''} on pp {pp}; "
                    f"it trains no uneven split without --decoder-first/last-pipeline-num-layers or a layout)"
                )
            count = total // pp
        if vp > 1 and count % vp:
            raise ConfigError(
                f"Megatron: num_layers_per_pipeline_rank {count} should be divisible by vp_size {vp} (rank {rank})"
            )
        per_rank.append(count)
    stages = []
    for chunk in range(vp):
        for rank in range(pp):
            count = per_rank[rank] // vp
            if embedding_counts and chunk == 0 and rank == 0:
                count -= 1
            if loss_counts and chunk == vp - 1 and rank == pp - 1:
                count -= 1
            if count < 0:
                raise ConfigError("Megatron: Not enough layers in the first (or last) virtual pipeline stage")
            stages.append(count)
    return stages


def read_megatron(text: str, units: Sequence[str], *, devices: int | None = None) -> TrainerLayout:
    """The layout Megatron-Core builds from the arguments in ``text`` (a command line or a file of them) for a
    model of ``units``; ``devices`` is the world size (default: torchrun's ``--nproc-per-node x --nnodes`` in
    ``text``, else ``tp x pp``: one replica)."""
    flags = read_flags(command_words(text), _VALUED, _SWITCHES)
    parts = model_parts(units, "Megatron")
    value = flags.values.get

    def number(flag: str, default: int | None) -> int | None:
        raw = value(flag)
        return default if raw is None else as_int(flag, raw)

    pp = number("--pipeline-model-parallel-size", 1) or 1
    tp = number("--tensor-model-parallel-size", 1) or 1
    for flag in ("--context-parallel-size", "--expert-model-parallel-size"):
        if (number(flag, 1) or 1) > 1:
            raise ConfigError(f"{flag} {value(flag)}: pipeplan does not model context or expert parallelism")
    world = devices or _torchrun_world(flags) or tp * pp
    if world % (tp * pp):
        raise ConfigError(
            f"Megatron: world size ({world}) is not divisible by tensor parallel size ({tp}) times pipeline "
            f"parallel size ({pp})"
        )
    dp = world // (tp * pp)
    micro = number("--micro-batch-size", None)
    if micro is None:
        raise ConfigError("--micro-batch-size is missing: Megatron needs it")
    global_batch = number("--global-batch-size", micro * dp) or micro * dp
    if global_batch % (micro * dp):
        raise ConfigError(
            f"Megatron: global batch size ({global_batch}) is not divisible by micro batch size ({micro}) times data "
            f"parallel size ({dp})"
        )
    num_layers = number("--num-layers", len(parts.layers))
    if num_layers != len(parts.layers):
        raise ConfigError(
            f"--num-layers {num_layers}, and the profiled model has {len(parts.layers)} decoder layers: the "
            "configuration is for another model"
        )
    stages, vp, split = _stages(flags, parts, pp)
    m = global_batch // (micro * dp)
    if vp > 1 and m % pp:
        raise ConfigError(
            f"Megatron's interleaved schedule runs micro-batches in groups of pp: {m} micro-batches on pp {pp}"
        )
    recompute, recompute_notes = _recompute(flags, len(stages))
    sequence = "--sequence-parallel" in flags.switches
    if sequence and tp == 1:
        sequence = False  # Megatron turns it off without tensor parallelism (arguments.py)
    read = [
        f"pipeline-model-parallel-size = {pp}" + (f" x {vp} virtual stages" if vp > 1 else ""),
        f"decoder layers per stage = {split}",
        f"tensor-model-parallel-size = {tp}" + (" with sequence parallelism" if sequence else ""),
        f"world size = {world}: data parallel {dp}"
        + ("" if devices or _torchrun_world(flags) else " (--devices to give the job's world size)"),
        f"micro-batch-size = {micro}, global-batch-size = {global_batch}: {m} micro-batches per replica",
    ]
    notes = [*recompute_notes]
    if flags.ignored:
        notes.append(
            f"not read (they do not change the layout): {shorten(', '.join(dict.fromkeys(flags.ignored)), 120)}"
        )
    return TrainerLayout(
        trainer="megatron",
        stages=stages,
        num_ranks=pp,
        schedule=Schedule.INTERLEAVED_1F1B if vp > 1 else Schedule.ONE_F_ONE_B,
        micro_batch_size=micro,
        num_microbatches=m,
        recompute=recompute,
        data_parallel=dp,
        tensor_parallel=tp,
        sequence_parallel=sequence,
        shard="optimizer" if "--use-distributed-optimizer" in flags.switches and dp > 1 else "none",
        placement="pipeline-in-node" if "--use-tp-pp-dp-mapping" in flags.switches else "replicas-in-node",
        read=tuple(read),
        notes=tuple(notes),
    )


def _torchrun_world(flags: Flags) -> int | None:
    nproc = flags.values.get("--nproc-per-node") or flags.values.get("--nproc_per_node")
    if nproc is None:
        return None
    return as_int("--nproc-per-node", nproc) * as_int("--nnodes", flags.values.get("--nnodes", "1"))


def _stages(flags: Flags, parts: ModelParts, pp: int) -> tuple[tuple[tuple[str, ...], ...], int, str]:
    """Each stage's units, the virtual stages per rank, and the decoder layers per stage as the report says."""
    value = flags.values.get
    layout = value("--pipeline-model-parallel-layout")
    per_vstage = value("--num-layers-per-virtual-pipeline-stage")
    vstages = value("--num-virtual-stages-per-pipeline-rank")
    first, last = value("--decoder-first-pipeline-num-layers"), value("--decoder-last-pipeline-num-layers")
    if layout is not None:
        others = {
            "--num-virtual-stages-per-pipeline-rank": vstages,
            "--num-layers-per-virtual-pipeline-stage": per_vstage,
            "--decoder-first-pipeline-num-layers": first,
            "--decoder-last-pipeline-num-layers": last,
        }
        given = [flag for flag, v in others.items() if v is not None]
        if given:
            raise ConfigError(
                f"Megatron: --pipeline-model-parallel-layout sets the stages, and {given[0]} cannot be given with it"
            )
        return _layout_stages(layout, parts, pp)
    if per_vstage is not None and vstages is not None:
        raise ConfigError(
            "Megatron: --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are "
            "mutually exclusive"
        )
    vp = 1
    if vstages is not None:
        vp = as_int("--num-virtual-stages-per-pipeline-rank", vstages)
    elif per_vstage is not None:
        layers = len(parts.layers) // pp
        vp = layers // as_int("--num-layers-per-virtual-pipeline-stage", per_vstage)
        if vp < 1:
            raise ConfigError(
                f"Megatron: --num-layers-per-virtual-pipeline-stage {per_vstage} exceeds the layers per rank"
            )
    counts = megatron_layers_per_stage(
        len(parts.layers),
        pp,
        vp if pp > 1 else 1,
        first=None if first is None else as_int("--decoder-first-pipeline-num-layers", first),
        last=None if last is None else as_int("--decoder-last-pipeline-num-layers", last),
        embedding_counts="--account-for-embedding-in-pipeline-split" in flags.switches,
        loss_counts="--account-for-loss-in-pipeline-split" in flags.switches,
    )
    vp = vp if pp > 1 else 1
    return parts.stages(counts, "Megatron"), vp, count_stages(counts)


def _layout_stages(text: str, parts: ModelParts, pp: int) -> tuple[tuple[tuple[str, ...], ...], int, str]:
    stages = parse_layout(text)
    if len(stages) % pp:
        raise ConfigError(
            f"Megatron: pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size "
            f"({len(stages)} stages, pp {pp})"
        )
    flat = [s for stage in stages for s in stage]
    if not flat or flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        raise ConfigError(
            f"Megatron: the layout {shorten(repr(text), 60)} must begin with the embedding E and end with the loss L, "
            "each once"
        )
    if "m" in flat:
        raise ConfigError("the layout places multi-token-prediction layers (m), which the profiled model has none of")
    if flat.count("t") != len(parts.layers):
        raise ConfigError(
            f"Megatron: Number of decoder layers {flat.count('t')} must match num_layers {len(parts.layers)} "
            f"(the layout {shorten(repr(text), 60)})"
        )
    counts = [stage.count("t") for stage in stages]
    return parts.stages(counts, "Megatron"), len(stages) // pp, count_stages(counts)


def _recompute(flags: Flags, num_stages: int) -> tuple[tuple[bool, ...], list[str]]:
    granularity = flags.values.get("--recompute-granularity")
    if granularity is None:
        return (False,) * num_stages, []
    if granularity == "selective":
        return (False,) * num_stages, [
            "--recompute-granularity selective (the attention core) is not modelled: predicted without "
            "recomputation, so its memory is an upper bound and its time a lower one"
        ]
    if granularity != "full":
        raise ConfigError(f"--recompute-granularity must be full or selective, got {shorten(repr(granularity), 30)}")
    method = flags.values.get("--recompute-method")
    if method is None:
        raise ConfigError(
            "Megatron: --recompute-method is required with --recompute-granularity full (uniform or block)"
        )
    if method not in ("uniform", "block"):
        raise ConfigError(f"--recompute-method must be uniform or block, got {shorten(repr(method), 30)}")
    notes = []
    if method == "block":
        notes.append(
            "--recompute-method block recomputes --recompute-num-layers layers of each stage; pipeplan models "
            "whole-stage recomputation: predicted as every layer recomputed"
        )
    return (True,) * num_stages, notes
