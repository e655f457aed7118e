"""Megatron-Core: the pipeline layout (``--pipeline-model-parallel-layout``) and flags for the plan."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import ExportError, shorten
from planner.export.common import (
    Trainer,
    _check_looped,
    _data_parallel_note,
    _flag_text,
    _header,
    _pipeline_inner,
    _recompute_note,
    tensor_parallel_of,
    whole_vocabulary_note,
)
from planner.plan import Plan
from planner.schedule.orders import Schedule

# --- Megatron-Core ----------------------------------------------------------------------------------------

# A unit of a numbered block: ``transformer.h.3`` or ``transformer.h.3.attn`` -> (``transformer.h``, 3).
_BLOCK = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)(?:\.|$)")


@dataclass(frozen=True)
class MegatronLayers:
    """The plan's units in Megatron's terms: the embedding, the decoder layers, the loss (final norm and head)."""

    embedding: tuple[str, ...]
    """Units before the first decoder layer: Megatron's ``E``."""
    decoder: tuple[tuple[str, ...], ...]
    """The units of each decoder layer (``t``), in order; one unit each unless the profile cut inside layers."""
    loss: tuple[str, ...]
    """Units after the last decoder layer: the final norm and output layer, Megatron's ``L``."""
    prefix: str
    """The block list's path, e.g. ``transformer.h``."""


def megatron_layers(units: Sequence[str]) -> MegatronLayers:
    """Classify ``units`` (in execution order) as Megatron's embedding, decoder layers and loss.

    Raises:
        ExportError: no repeated block list, two equally long ones, a unit between decoder layers that is not
            one, layers out of order, or nothing before (no embedding) or after (no output layer) the layers.

    >>> m = megatron_layers(["transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1", "lm_head"])
    >>> m.embedding, len(m.decoder), m.loss
    (('transformer.wte', 'transformer.wpe'), 2, ('lm_head',))
    """
    blocks: dict[str, set[int]] = {}
    for name in units:
        match = _BLOCK.match(name)
        if match:
            blocks.setdefault(match["prefix"], set()).add(int(match["index"]))
    longest = max((len(indices) for indices in blocks.values()), default=0)
    if longest < 2:
        raise ExportError(
            "Megatron's layout is for transformers: no repeated decoder layers (units named PREFIX.N, e.g. "
            f"transformer.h.0) among the plan's units ({shorten(', '.join(units), 100)})"
        )
    prefixes = sorted(p for p, indices in blocks.items() if len(indices) == longest)
    if len(prefixes) > 1:
        raise ExportError(
            f"Megatron's layout has one decoder stack, and the plan's units have {len(prefixes)} block lists of "
            f"{longest} ({shorten(', '.join(prefixes), 80)}): an encoder-decoder or non-transformer model"
        )
    prefix = prefixes[0]

    def layer_of(name: str) -> int | None:
        match = _BLOCK.match(name)
        return int(match["index"]) if match and match["prefix"] == prefix else None

    positions = [i for i, name in enumerate(units) if layer_of(name) is not None]
    first, last = positions[0], positions[-1]
    decoder: list[list[str]] = []
    previous: int | None = None
    for name in units[first : last + 1]:
        index = layer_of(name)
        if index is None:
            raise ExportError(
                f"unit {shorten(name, 60)} runs between decoder layers of {shorten(prefix, 40)} and is neither "
                "embedding, decoder layer nor final norm/head: Megatron's layout cannot place it"
            )
        if index == previous:
            decoder[-1].append(name)
            continue
        if previous is not None and index != previous + 1:
            raise ExportError(
                f"decoder layer {shorten(prefix, 40)}.{index} follows layer {previous}: Megatron counts decoder "
                "layers in order, each once"
            )
        decoder.append([name])
        previous = index
    embedding, loss = tuple(units[:first]), tuple(units[last + 1 :])
    if not embedding:
        raise ExportError(
            f"Megatron's layout begins with the embedding (E), and no unit runs before the first decoder layer "
            f"{shorten(units[first], 60)}: not a language model Megatron builds"
        )
    if not loss:
        raise ExportError(
            f"Megatron's layout ends with the loss (L: final norm and output layer), and no unit runs after the last "
            f"decoder layer {shorten(units[last], 60)}"
        )
    return MegatronLayers(embedding, tuple(tuple(layer) for layer in decoder), loss, prefix)


@dataclass(frozen=True)
class MegatronExport:
    """Megatron-Core's command-line flags for the plan's layout, batch sizes and rank order."""

    trainer_version: str
    pipeline_model_parallel_size: int
    pipeline_model_parallel_layout: str
    virtual_stages_per_rank: int
    """Megatron derives it from the layout (stages / pp); it is not a flag next to the layout."""
    num_layers: int
    micro_batch_size: int
    global_batch_size: int
    use_distributed_optimizer: bool = False
    """The plan shards over its replicas: Megatron's distributed optimizer (ZeRO-1)."""
    use_tp_pp_dp_mapping: bool = False
    """The plan puts each pipeline on consecutive devices: Megatron's rank order tp-cp-ep-pp-dp."""
    tensor_model_parallel_size: int = 1
    """The plan's ``tp`` (written only above 1: an export without tensor parallelism carries no trace of it)."""
    sequence_parallel: bool = False
    """The plan's tensor parallelism splits the activations outside the matrices too."""
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def flags(self) -> tuple[str, ...]:
        tensor = [f"--tensor-model-parallel-size {self.tensor_model_parallel_size}"]
        tensor += ["--sequence-parallel"] if self.sequence_parallel else []
        return (
            *(tensor if self.tensor_model_parallel_size > 1 else []),
            f"--pipeline-model-parallel-size {self.pipeline_model_parallel_size}",
            f'--pipeline-model-parallel-layout "{self.pipeline_model_parallel_layout}"',
            f"--num-layers {self.num_layers}",
            f"--micro-batch-size {self.micro_batch_size}",
            f"--global-batch-size {self.global_batch_size}",
            *(["--use-distributed-optimizer"] if self.use_distributed_optimizer else []),
            *(["--use-tp-pp-dp-mapping"] if self.use_tp_pp_dp_mapping else []),
        )

    def text(self) -> str:
        """The flags, one per line with shell continuations, under comments."""
        return _flag_text([*self.header, *self.notes], self.flags())


def _stage_symbols(embedding: bool, layers: int, loss: bool) -> str:
    decoder = "" if layers == 0 else "t" if layers == 1 else f"t*{layers}"
    return ("E" if embedding else "") + decoder + ("L" if loss else "")


def _megatron(plan: Plan, version: str) -> MegatronExport:
    _check_looped(plan, Trainer.MEGATRON)
    roles = megatron_layers([u for s in plan.stages for u in s.units])
    pp, v, m = plan.num_ranks, plan.num_stages // plan.num_ranks, plan.num_microbatches
    if v > 1 and m % pp != 0:
        raise ExportError(
            f"Megatron's interleaved schedule runs micro-batches in groups of pp (core/pipeline_parallel/"
            f"schedules.py), and the plan has {m} micro-batches on pp {pp}: plan with --global-batch and "
            f"--micro-batch giving a multiple of {pp}"
        )
    layout = _megatron_layout(plan, roles)
    pipeline_inner = _pipeline_inner(plan)
    tp, sequence = tensor_parallel_of(plan)
    notes = _megatron_notes(plan, roles)
    return MegatronExport(
        trainer_version=version,
        pipeline_model_parallel_size=pp,
        pipeline_model_parallel_layout=layout,
        virtual_stages_per_rank=v,
        num_layers=len(roles.decoder),
        micro_batch_size=plan.micro_batch_size,
        global_batch_size=plan.mesh.global_batch_size if plan.mesh is not None else plan.global_batch_size,
        use_distributed_optimizer=plan.mesh is not None and plan.mesh.shard != "none",
        use_tp_pp_dp_mapping=pipeline_inner,
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence,
        header=_header(plan, Trainer.MEGATRON, version),
        notes=tuple(notes),
    )


def _megatron_layout(plan: Plan, roles: MegatronLayers) -> str:
    """``--pipeline-model-parallel-layout``: per stage, E, its decoder layers and L; raises where the plan cuts
    inside the embedding, a decoder layer or the loss (Megatron builds each as one)."""
    stage_of = {u: s.index for s in plan.stages for u in s.units}
    last = plan.num_stages - 1

    def one_stage(names: Sequence[str], what: str, fix: str) -> int:
        stages = sorted({stage_of[n] for n in names})
        if len(stages) > 1:
            cut = next(b for a, b in zip(names, names[1:], strict=False) if stage_of[a] != stage_of[b])
            raise ExportError(
                f"the plan cuts inside {what} before {shorten(cut, 50)} (stages {stages[0]}-{stages[-1]}), and "
                f"Megatron builds it as one layer: keep it on one stage, e.g. plan with {fix}"
            )
        return stages[0]

    # E is the first units and L the last, so uncut they are on the first and the last stage.
    embedding, loss = roles.embedding, roles.loss
    one_stage(embedding, f"the embedding (E: {shorten(', '.join(embedding), 60)})", f"--pin {embedding[-1]}=0")
    one_stage(loss, f"the final norm and head (L: {shorten(', '.join(loss), 60)})", f"--pin {loss[0]}={last}")
    layers_per_stage = [0] * plan.num_stages
    for k, layer in enumerate(roles.decoder):
        stage = one_stage(layer, f"decoder layer {k} ({shorten(layer[0], 50)} ..)", f"--pin {layer[-1]}=STAGE")
        layers_per_stage[stage] += 1
    return "|".join(_stage_symbols(s == 0, layers_per_stage[s], s == last) for s in range(plan.num_stages))


def _megatron_notes(plan: Plan, roles: MegatronLayers) -> list[str]:
    """What a user of the export should know: the symbols, the virtual stages, data and tensor parallelism, and
    where Megatron runs other than the plan (schedule, sharding, recomputation)."""
    pp, v = plan.num_ranks, plan.num_stages // plan.num_ranks
    notes = [
        "E = " + shorten(", ".join(roles.embedding), 80) + f"; t = {shorten(roles.prefix, 60)}.N; "
        "L = " + shorten(", ".join(roles.loss), 80),
        f"{plan.num_stages} stages / pp {pp} = {v} virtual stage(s) per rank: Megatron derives it from the "
        "layout (do not add --num-virtual-stages-per-pipeline-rank, nor --decoder-first/last-pipeline-num-layers)",
        _data_parallel_note(plan),
        "megatron-core 0.19 needs Python >= 3.12 (0.16.1 is the last release for 3.11)",
    ]
    if v > 1 and pp == 2:
        notes.append(
            "interleaved on pp 2: keep p2p overlap on (no --no-overlap-p2p-communication), which Megatron "
            "refuses there (arguments.py)"
        )
    if plan.mesh is not None and plan.mesh.shard == "full":
        notes.append(
            "the plan shards weights too (--shard full); Megatron's distributed optimizer shards optimizer state "
            "and gradients only: the plan's memory does not carry over"
        )
    if _pipeline_inner(plan):
        notes.append(
            "the plan puts each pipeline on consecutive devices: --use-tp-pp-dp-mapping makes Megatron's rank "
            "order tp-cp-ep-pp-dp (its default, tp-cp-ep-dp-pp, puts replicas of a stage on consecutive ranks)"
        )
    tp, sequence = tensor_parallel_of(plan)
    notes += whole_vocabulary_note(plan, Trainer.MEGATRON)
    if tp > 1:
        notes.append(
            f"tensor parallelism {tp}: Megatron splits attention by heads and the MLP by columns/rows, the embedding "
            "and output layer by vocabulary (num-attention-heads and num-query-groups must divide by it)"
            + ("; --sequence-parallel as planned" if sequence else "")
        )
    megatron_schedule = "interleaved 1F1B" if v > 1 else "1F1B"
    if plan.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
        notes.append(
            f"Megatron runs {megatron_schedule} with this layout, not the plan's {plan.schedule.value}: the partition "
            "carries over, the predicted iteration does not"
        )
    notes += _recompute_note(plan, "Megatron's --recompute-* flags apply to every stage alike; set them by hand")
    return notes
