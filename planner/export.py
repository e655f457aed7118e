"""A plan in the words of the trainers that run pipelines at scale: torchtitan, Megatron-Core, DeepSpeed, accelerate.

Each of them takes the same decision -- which modules each pipeline stage holds -- in its own form. The rules
below were read in each trainer's source (2026-11-30; docs/export.md cites the files):

- **torchtitan**, ``[parallelism] module_fqns_per_model_part``: one list of FQNs per model part (stage).
  ``torchtitan/distributed/pipeline_parallel.py:pipeline_module_split`` keeps, in each part, the top-level modules
  named in its list and the items ``NAME.KEY`` of top-level ``ModuleList``/``ModuleDict`` containers (it "does
  not support nested moduledict and modulelist structures"), and removes every other top-level module. Stage
  ``s`` runs on rank ``s % pp`` (V placement for ZBVZeroBubble/DualPipeV); ``pipeline_parallel_schedule`` is
  torch's schedule class name without ``Schedule``; ``local_batch_size / pipeline_parallel_microbatch_size``
  micro-batches.
- **Megatron-Core**, ``--pipeline-model-parallel-layout``: stages separated by ``|``, ``E`` the embedding, ``t``
  a decoder layer, ``L`` the loss (output layer; the final norm is built with it on the last stage), ``x*n``
  repeats ``x`` (``megatron/core/transformer/pipeline_parallel_layer_layout.py``). The stage count must be a
  multiple of ``--pipeline-model-parallel-size``; the quotient is the virtual pipeline size, stage ``i`` on rank
  ``i % pp`` -- and ``--num-virtual-stages-per-pipeline-rank`` must then not be given (``arguments.py`` asserts
  at most one of the two). ``E`` comes first and once, ``L`` last and once, ``t`` as often as ``--num-layers``.
- **DeepSpeed**, ``PipelineModule(layers, num_stages, partition_method=...)``: no explicit partition argument
  (``parameters``, ``uniform`` or ``type:REGEX``). ``__init__`` calls ``_partition_layers``, which sets
  ``self.parts`` (``num_stages + 1`` layer boundaries) and ``_set_bounds`` of this rank's stage, so a subclass
  overriding it takes the plan's boundaries. One stage per rank, DeepSpeed's own schedule.
- **accelerate**, ``prepare_pippy(model, split_points=[...], num_chunks=M)``: torch's ``pipeline()`` split before
  each point (``SplitPoint.BEGINNING``), one stage per process, ``ScheduleGPipe``, forward only (inference).

How the plan's units map to Megatron's notion (the names carry it; the plan records no module types): the decoder
layers are the units named ``PREFIX.N`` (or ``PREFIX.N.sub``) of the prefix with the most distinct ``N``; what
runs before the first of them is the embedding ``E``, what runs after the last is ``L`` (final norm and head).

Pure: plans in, text out; no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from planner.errors import ExportError, UsageError, shorten
from planner.plan import Plan
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule

__all__ = [
    "Trainer",
    "MegatronLayers",
    "TorchtitanExport",
    "MegatronExport",
    "DeepSpeedExport",
    "AccelerateExport",
    "megatron_layers",
    "apply_renames",
    "export_plan",
]


class Trainer(str, Enum):
    """A trainer ``pipeplan export --to`` writes for; the value is the name users type."""

    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    ACCELERATE = "accelerate"

    @classmethod
    def parse(cls, text: str | Trainer) -> Trainer:
        if isinstance(text, Trainer):
            return text
        key = str(text).strip().lower()
        for member in cls:
            if member.value == key:
                return member
        raise UsageError(f"unknown trainer {shorten(repr(text), 40)} (valid: {', '.join(m.value for m in cls)})")


# --- names ------------------------------------------------------------------------------------------------


def apply_renames(names: Sequence[str], renames: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Each name with its longest matching ``OLD`` prefix (on a dot boundary) replaced by ``NEW``.

    The plan names the modules of the profiled model (``model.layers.3`` in transformers' Llama); the trainer
    may build the same model under other names (``layers.3`` in torchtitan's). ``NEW`` empty strips the prefix.

    >>> apply_renames(["model.embed_tokens", "model.layers.0", "lm_head"], [("model", ""), ("lm_head", "output")])
    ('embed_tokens', 'layers.0', 'output')
    """
    out: list[str] = []
    for name in names:
        best: tuple[str, str] | None = None
        for old, new in renames:
            if (name == old or name.startswith(old + ".")) and (best is None or len(old) > len(best[0])):
                best = (old, new)
        if best is None:
            out.append(name)
            continue
        old, new = best
        rest = name[len(old) :].lstrip(".")
        renamed = ".".join(part for part in (new, rest) if part)
        if not renamed:
            raise UsageError(f"--rename {shorten(old, 40)}= leaves unit {shorten(name, 60)} without a name")
        out.append(renamed)
    seen: dict[str, str] = {}
    for original, renamed in zip(names, out, strict=True):
        if renamed in seen:
            raise UsageError(
                f"--rename gives units {shorten(seen[renamed], 50)} and {shorten(original, 50)} the same name "
                f"{shorten(renamed, 50)}"
            )
        seen[renamed] = original
    return tuple(out)


def _renamed_stages(plan: Plan, renames: Sequence[tuple[str, str]]) -> tuple[tuple[str, ...], ...]:
    flat = apply_renames([u for s in plan.stages for u in s.units], renames)
    stages, start = [], 0
    for s in plan.stages:
        stages.append(tuple(flat[start : start + len(s.units)]))
        start += len(s.units)
    return tuple(stages)


# --- common checks ----------------------------------------------------------------------------------------


def _check_schedule(plan: Plan, trainer: Trainer) -> None:
    if plan.schedule is Schedule.NAIVE:
        raise ExportError(
            f"{trainer.value}: schedule naive (one micro-batch through all stages at a time) is pipeplan's reference "
            "for comparisons, not a training schedule: plan with gpipe, 1f1b or interleaved-1f1b"
        )


def _check_looped(plan: Plan, trainer: Trainer) -> None:
    """Megatron places layout stage ``i`` on rank ``i % pp``: the plan must place its stages the same way."""
    for s in plan.stages:
        if s.rank != s.index % plan.num_ranks:
            raise ExportError(
                f"{trainer.value} places stage i on rank i % pp, but the plan (schedule {plan.schedule.value}) puts "
                f"stage {s.index} on rank {s.rank}"
            )


def _check_one_stage_per_rank(plan: Plan, trainer: Trainer, why: str) -> None:
    if plan.num_stages != plan.num_ranks:
        raise ExportError(
            f"{trainer.value} runs one stage per rank ({why}), and the plan has {plan.num_stages} stages on "
            f"{plan.num_ranks} ranks (schedule {plan.schedule.value}): plan with --schedule 1f1b or gpipe for it"
        )


def _header(plan: Plan) -> list[str]:
    return [
        f"pipeplan plan of {plan.model_name}: {plan.num_ranks} ranks, {plan.num_stages} stages, schedule "
        f"{plan.schedule.value}, micro-batch {plan.micro_batch_size} x {plan.num_microbatches} = "
        f"{plan.global_batch_size}, predicted iteration {plan.predicted.iteration_s:.4g} s",
    ]


def _recompute_note(plan: Plan, how: str) -> list[str]:
    stages = [s.index for s in plan.stages if s.recompute]
    if not stages:
        return []
    which = "every stage" if len(stages) == plan.num_stages else f"stages {', '.join(map(str, stages))} only"
    return [f"the plan recomputes activations on {which}: {how}"]


def _comment(lines: Sequence[str], mark: str = "#") -> list[str]:
    return [f"{mark} {line}" if line else mark for line in lines]


# --- torchtitan -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchtitanExport:
    """torchtitan's job config for the plan (``[parallelism]`` and ``[training]`` sections)."""

    pipeline_parallel_degree: int
    pipeline_parallel_schedule: str
    """torch's schedule class name without ``Schedule`` (torch's ``get_schedule_class`` takes it)."""
    pipeline_parallel_microbatch_size: int
    local_batch_size: int
    """Samples per data-parallel rank per step: ``microbatch_size x micro-batches``."""
    module_fqns_per_model_part: tuple[tuple[str, ...], ...]
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    data_parallel_replicate_degree: int = 1
    """DDP replicas (a cluster plan's ``dp`` with ``--shard none``)."""
    data_parallel_shard_degree: int = 1
    """FSDP shards (a cluster plan's ``dp`` with ``--shard full`` or ``optimizer``)."""

    def text(self) -> str:
        """A TOML snippet (``tomllib`` reads it)."""
        parts = ",\n".join(
            "    [" + ", ".join(json.dumps(name) for name in part) + "]" for part in self.module_fqns_per_model_part
        )
        lines = _comment([*self.header, *self.notes])
        lines += [
            "[parallelism]",
            f"pipeline_parallel_degree = {self.pipeline_parallel_degree}",
            f"pipeline_parallel_schedule = {json.dumps(self.pipeline_parallel_schedule)}",
            f"pipeline_parallel_microbatch_size = {self.pipeline_parallel_microbatch_size}",
            f"module_fqns_per_model_part = [\n{parts},\n]",
            *(
                [
                    f"data_parallel_replicate_degree = {self.data_parallel_replicate_degree}",
                    f"data_parallel_shard_degree = {self.data_parallel_shard_degree}",
                ]
                if self.data_parallel_replicate_degree * self.data_parallel_shard_degree > 1
                else []
            ),
            "",
            "[training]",
            f"local_batch_size = {self.local_batch_size}",
        ]
        return "\n".join(lines) + "\n"


def _data_parallel_note(plan: Plan) -> str:
    if plan.mesh is None:
        return "batch sizes are per data-parallel rank (pipeline only: data-parallel degree 1)"
    m = plan.mesh
    return (
        f"cluster plan: pp {m.pp} x dp {m.dp} = {m.used_devices} processes (world size); shard {m.shard}; "
        f"{m.global_batch_size} samples per step, {plan.global_batch_size} per replica"
    )


def _torchtitan(plan: Plan, renames: Sequence[tuple[str, str]]) -> TorchtitanExport:
    stages = _renamed_stages(plan, renames)
    for index, names in enumerate(stages):
        for name in names:
            if name.count(".") > 1 or name.startswith(".") or name.endswith("."):
                raise ExportError(
                    f"torchtitan splits only top-level modules and items NAME.KEY of top-level ModuleList/ModuleDict "
                    f"(pipeline_module_split), and stage {index} holds {shorten(name, 60)}: map the names onto "
                    "torchtitan's model with --rename OLD=NEW (e.g. --rename model.layers=layers)"
                )
    schedule = TORCH_SCHEDULE_CLASS[plan.schedule].removeprefix("Schedule")
    notes = [
        "names must be the FQNs of the model torchtitan builds; every top-level module a part does not list is",
        "removed from that part",
        _data_parallel_note(plan),
        *_recompute_note(plan, '[activation_checkpoint] mode = "full" applies to every stage alike'),
    ]
    dp = plan.mesh.dp if plan.mesh is not None else 1
    sharded = plan.mesh is not None and plan.mesh.shard != "none"
    return TorchtitanExport(
        data_parallel_replicate_degree=1 if sharded else dp,
        data_parallel_shard_degree=dp if sharded else 1,
        pipeline_parallel_degree=plan.num_ranks,
        pipeline_parallel_schedule=schedule,
        pipeline_parallel_microbatch_size=plan.micro_batch_size,
        local_batch_size=plan.global_batch_size,
        module_fqns_per_model_part=stages,
        header=tuple(_header(plan)),
        notes=tuple(notes),
    )


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
    """Megatron-Core's command-line flags for the plan's layout."""

    pipeline_model_parallel_size: int
    pipeline_model_parallel_layout: str
    virtual_stages_per_rank: int
    """Megatron derives it from the layout (stages / pp); it is not a flag next to the layout."""
    num_layers: int
    micro_batch_size: int
    global_batch_size: int
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def flags(self) -> tuple[str, ...]:
        return (
            f"--pipeline-model-parallel-size {self.pipeline_model_parallel_size}",
            f'--pipeline-model-parallel-layout "{self.pipeline_model_parallel_layout}"',
            f"--num-layers {self.num_layers}",
            f"--micro-batch-size {self.micro_batch_size}",
            f"--global-batch-size {self.global_batch_size}",
        )

    def text(self) -> str:
        """The flags, one per line with shell continuations, under comments."""
        flags = self.flags()
        body = [f"{flag} \\" for flag in flags[:-1]] + [flags[-1]]
        return "\n".join([*_comment([*self.header, *self.notes]), *body]) + "\n"


def _stage_symbols(embedding: bool, layers: int, loss: bool) -> str:
    decoder = "" if layers == 0 else "t" if layers == 1 else f"t*{layers}"
    return ("E" if embedding else "") + decoder + ("L" if loss else "")


def _megatron(plan: Plan) -> MegatronExport:
    _check_looped(plan, Trainer.MEGATRON)
    units = [u for s in plan.stages for u in s.units]
    stage_of = {u: s.index for s in plan.stages for u in s.units}
    roles = megatron_layers(units)
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
    layout = "|".join(_stage_symbols(s == 0, layers_per_stage[s], s == last) for s in range(plan.num_stages))
    v = plan.num_stages // plan.num_ranks
    notes = [
        "E = " + shorten(", ".join(roles.embedding), 80) + f"; t = {shorten(roles.prefix, 60)}.N; "
        "L = " + shorten(", ".join(roles.loss), 80),
        f"{plan.num_stages} stages / pp {plan.num_ranks} = {v} virtual stage(s) per rank: Megatron derives it from the "
        "layout (do not add --num-virtual-stages-per-pipeline-rank, nor --decoder-first/last-pipeline-num-layers)",
        _data_parallel_note(plan),
    ]
    if plan.mesh is not None and plan.mesh.shard != "none":
        notes.append("the plan shards over its replicas: add --use-distributed-optimizer (ZeRO-1)")
    megatron_schedule = "interleaved 1F1B" if v > 1 else "1F1B"
    if plan.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
        notes.append(
            f"Megatron runs {megatron_schedule} with this layout, not the plan's {plan.schedule.value}: the partition "
            "carries over, the predicted iteration does not"
        )
    notes += _recompute_note(plan, "Megatron's --recompute-* flags apply to every stage alike; set them by hand")
    return MegatronExport(
        pipeline_model_parallel_size=plan.num_ranks,
        pipeline_model_parallel_layout=layout,
        virtual_stages_per_rank=v,
        num_layers=len(roles.decoder),
        micro_batch_size=plan.micro_batch_size,
        global_batch_size=plan.mesh.global_batch_size if plan.mesh is not None else plan.global_batch_size,
        header=tuple(_header(plan)),
        notes=tuple(notes),
    )


# --- DeepSpeed --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepSpeedExport:
    """A ``PipelineModule`` subclass cut at the plan's boundaries, and the batch settings of ds_config."""

    num_stages: int
    parts: tuple[int, ...]
    """Layer boundaries: stage ``s`` holds ``layers[parts[s]:parts[s + 1]]``; ``parts[-1]`` is the layer count."""
    layer_names: tuple[str, ...]
    """What ``layers[i]`` must compute: the plan's unit ``i``."""
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    train_batch_size: int
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """A Python snippet: the subclass, and how to build it."""
        names = "".join(f"    {name!r},\n" for name in self.layer_names)
        ds_config = {
            "train_batch_size": self.train_batch_size,
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }
        lines = _comment([*self.header, *self.notes])
        lines += [
            "from deepspeed.pipe import PipelineModule",
            "",
            f"# layers[i] must compute PLAN_UNITS[i]: {len(self.layer_names)} layers, in this order.",
            f"PLAN_UNITS = [\n{names}]",
            "# Stage s holds layers[PLAN_PARTS[s]:PLAN_PARTS[s + 1]].",
            f"PLAN_PARTS = {list(self.parts)}",
            "",
            "",
            "class PlannedPipelineModule(PipelineModule):",
            '    """PipelineModule cut where the pipeplan plan cuts, instead of by partition_method."""',
            "",
            "    def _partition_layers(self, method='uniform'):",
            "        num_stages = self._topo.get_dim('pipe')",
            "        if num_stages != len(PLAN_PARTS) - 1 or len(self._layer_specs) != PLAN_PARTS[-1]:",
            "            raise ValueError(",
            "                f'the plan cuts {PLAN_PARTS[-1]} layers into {len(PLAN_PARTS) - 1} stages, got '",
            "                f'{len(self._layer_specs)} layers and num_stages={num_stages}'",
            "            )",
            "        self.parts = list(PLAN_PARTS)",
            "        stage_id = self._topo.get_coord(self.global_rank).pipe",
            "        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])",
            "",
            "",
            f"# model = PlannedPipelineModule(layers=layers, num_stages={self.num_stages}, loss_fn=loss_fn)",
            f"# ds_config batch settings: {json.dumps(ds_config)}",
        ]
        return "\n".join(lines) + "\n"


def _deepspeed(plan: Plan, renames: Sequence[tuple[str, str]]) -> DeepSpeedExport:
    _check_one_stage_per_rank(plan, Trainer.DEEPSPEED, "PipelineModule's num_stages is the pipe dimension")
    stages = _renamed_stages(plan, renames)
    parts = [0]
    for names in stages:
        parts.append(parts[-1] + len(names))
    notes = [
        "PipelineModule takes no explicit parts (partition_method: parameters | uniform | type:REGEX), so",
        "the subclass below overrides _partition_layers to set self.parts to the plan's boundaries",
        "batch settings assume data-parallel degree 1 (train_batch_size = micro-batch x steps x data-parallel)",
    ]
    if plan.schedule is not Schedule.ONE_F_ONE_B:
        notes.append(
            f"DeepSpeed runs its own 1F1B-like TrainSchedule, not the plan's {plan.schedule.value}: the partition "
            "carries over, the predicted iteration does not"
        )
    notes += _recompute_note(plan, "DeepSpeed's activation_checkpoint_interval applies to every stage alike")
    return DeepSpeedExport(
        num_stages=plan.num_stages,
        parts=tuple(parts),
        layer_names=tuple(u for names in stages for u in names),
        train_micro_batch_size_per_gpu=plan.micro_batch_size,
        gradient_accumulation_steps=plan.num_microbatches,
        train_batch_size=plan.global_batch_size,
        header=tuple(_header(plan)),
        notes=tuple(notes),
    )


# --- accelerate -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccelerateExport:
    """``prepare_pippy`` arguments for the plan (pipeline-parallel inference)."""

    num_processes: int
    split_points: tuple[str, ...]
    num_chunks: int
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """A Python snippet calling ``prepare_pippy``."""
        points = ", ".join(repr(p) for p in self.split_points)
        lines = _comment([*self.header, *self.notes])
        lines += [
            "from accelerate import prepare_pippy",
            "",
            f"SPLIT_POINTS = [{points}]",
            "",
            f"# run with: accelerate launch --num_processes {self.num_processes} your_script.py",
            f"model = prepare_pippy(model, split_points=SPLIT_POINTS, example_args=(example_input,), "
            f"num_chunks={self.num_chunks})",
        ]
        return "\n".join(lines) + "\n"


def _accelerate(plan: Plan, renames: Sequence[tuple[str, str]]) -> AccelerateExport:
    _check_one_stage_per_rank(plan, Trainer.ACCELERATE, "prepare_pippy builds the stage of its process index")
    stages = _renamed_stages(plan, renames)
    notes = [
        "prepare_pippy is for inference: torch's pipeline() split before each point, ScheduleGPipe, forward only;",
        "the split carries over, the plan's training prediction does not",
        f"num_chunks = the plan's {plan.num_microbatches} micro-batches of {plan.micro_batch_size}",
    ]
    return AccelerateExport(
        num_processes=plan.num_ranks,
        split_points=tuple(names[0] for names in stages[1:]),
        num_chunks=plan.num_microbatches,
        header=tuple(_header(plan)),
        notes=tuple(notes),
    )


# --- entry point ------------------------------------------------------------------------------------------


Export = TorchtitanExport | MegatronExport | DeepSpeedExport | AccelerateExport


def export_plan(plan: Plan, trainer: Trainer | str, renames: Sequence[tuple[str, str]] = ()) -> Export:
    """The configuration ``trainer`` takes for ``plan``'s layout; ``.text()`` is what to paste.

    ``renames`` (``OLD``, ``NEW``) map the profiled model's module names onto the trainer's
    (:func:`apply_renames`); Megatron's layout names no modules and takes none.

    Raises:
        ExportError: the trainer cannot express the plan (the message says what and why).
        UsageError: an unknown trainer, or renames that collide.
    """
    trainer = Trainer.parse(trainer)
    _check_schedule(plan, trainer)
    if trainer is Trainer.TORCHTITAN:
        return _torchtitan(plan, renames)
    if trainer is Trainer.MEGATRON:
        if renames:
            raise UsageError("--rename has no effect on Megatron's layout, which names no modules: leave it out")
        return _megatron(plan)
    if trainer is Trainer.DEEPSPEED:
        return _deepspeed(plan, renames)
    return _accelerate(plan, renames)
