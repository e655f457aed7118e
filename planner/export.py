"""A plan in the words of the trainers that run pipelines at scale: torchtitan, Megatron-Core, DeepSpeed, accelerate.

Each of them takes the same decision -- which modules each pipeline stage holds -- in its own form, and each
export is written for named releases (:data:`RELEASES`; another release is refused, since the forms change):

- **torchtitan 0.3** reads no TOML: ``ConfigManager`` (``torchtitan/config/manager.py``) takes ``--module``,
  ``--config`` and ``--section.key`` overrides, so the export is those overrides:
  ``--parallelism.module_fqns_per_model_part`` (one comma-joined value per model part), the degree, schedule
  (torch's class name without ``Schedule``), micro-batch size, the data-parallel degrees and batch sizes, and
  ``--training.disable_cuda_graphs``, without which a pipeline is refused (``trainer.py``,
  ``_validate_cuda_graphs``). ``distributed/pipeline_parallel.py:_split_module`` keeps, in each part, the
  top-level modules named and the items ``NAME.KEY`` of top-level ``ModuleList``/``ModuleDict`` containers, and
  sets every other top-level module to None -- a name the model lacks is dropped without a word; stage ``s`` runs
  on pipeline rank ``s % pp`` (a V for ZBVZeroBubble/DualPipeV). Activation checkpointing is a subcommand
  (``activation-checkpoint:none|full``) that must come last. Weight tying with pipeline parallelism is refused
  (``models/common/decoder.py``).
- **Megatron-Core 0.16-0.19**, ``--pipeline-model-parallel-layout``: stages separated by ``|``, ``E`` the
  embedding, ``t`` a decoder layer, ``L`` the loss (output layer; the final norm is built with it on the last
  stage), ``x*n`` repeats ``x`` (``megatron/core/transformer/pipeline_parallel_layer_layout.py``, the same file
  in 0.16.1 and 0.19.2). The stage count must be a multiple of ``--pipeline-model-parallel-size``; the quotient
  is the virtual pipeline size, stage ``i`` on rank ``i % pp`` -- and ``--num-virtual-stages-per-pipeline-rank``
  must then not be given (``megatron/training/arguments.py`` asserts at most one of the two). The interleaved
  schedule runs micro-batches in groups of ``pp`` (``core/pipeline_parallel/schedules.py``).
- **DeepSpeed 0.19**, ``PipelineModule(layers, topology=..., partition_method=...)``: no explicit partition
  argument (``parameters``, ``uniform`` or ``type:REGEX``). ``__init__`` calls ``_partition_layers``, which sets
  ``self.parts`` and ``_set_bounds`` of this rank's stage, so a subclass overriding it takes the plan's
  boundaries. One stage per rank, DeepSpeed's own schedule; ``train_batch_size`` must equal micro-batch x
  gradient-accumulation steps x data-parallel size, and ZeRO above stage 1 is refused
  (``deepspeed/runtime/pipe/engine.py``).
- **accelerate 1.x**, ``prepare_pippy(model, split_points=[...], example_args=..., num_chunks=M)``
  (``accelerate/inference.py``): torch's ``pipeline()`` split before each point, one stage per process,
  ``ScheduleGPipe``, forward only -- inference. It traces ``example_args`` as one chunk and pads a batch that is
  not ``num_chunks`` samples, which then splits unevenly: each call takes exactly ``num_chunks`` samples,
  micro-batch 1.

Rank order: the three trainers put the pipeline dimension outermost (torchtitan's mesh is ``["pp", "dp_replicate",
...]``, DeepSpeed's ``PipeDataParallelTopology`` is ``pipe`` x ``data``, Megatron's default order
``tp-cp-ep-dp-pp``), so consecutive ranks are replicas of one stage. A cluster plan that puts each pipeline on
consecutive devices (``pipeline-in-node``) gets what makes the trainer place ranks that way: Megatron's
``--use-tp-pp-dp-mapping``, a DeepSpeed topology with ``pipe`` innermost, torchtitan a ``RANK`` that its
launcher rewrites.

How the plan's units map to Megatron's notion (the names carry it; the plan records no module types): the decoder
layers are the units named ``PREFIX.N`` (or ``PREFIX.N.sub``) of the prefix with the most distinct ``N``; what
runs before the first of them is the embedding ``E``, what runs after the last is ``L`` (final norm and head).

Pure: plans in, text out; no torch. Each export is checked against the trainer's own code in
``tests/planner/test_export_trainers.py`` (docs/export.md, "How it is tested").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from planner.errors import ExportError, UsageError, shorten
from planner.plan import Plan
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule

__all__ = [
    "Trainer",
    "TrainerRelease",
    "RELEASES",
    "trainer_release",
    "rank_of_device",
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


# --- releases ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerRelease:
    """The releases of a trainer an export is written for."""

    package: str
    """The distribution's name on PyPI (``megatron-core``)."""
    series: tuple[str, ...]
    """Release series the export is for: ``"0.3"`` takes 0.3.0, 0.3.1, ...; ``"1"`` takes every 1.x."""
    current: str
    """The release each export was run against (the default of ``--trainer-version``)."""
    why: str
    """What changes outside the series, said when another release is refused."""

    @property
    def series_text(self) -> str:
        """``0.3.x``, ``0.16.x to 0.19.x``: the series as people write them."""
        first, last = self.series[0], self.series[-1]
        return f"{first}.x" if first == last else f"{first}.x to {last}.x"

    def accepts(self, version: tuple[int, ...]) -> bool:
        return any(version[: len(s)] == s for s in (tuple(int(p) for p in text.split(".")) for text in self.series))


RELEASES: Mapping[Trainer, TrainerRelease] = {
    Trainer.TORCHTITAN: TrainerRelease(
        "torchtitan",
        ("0.3",),
        "0.3.0",
        "torchtitan 0.2 and earlier read a TOML job config (--job.config_file); 0.3 takes --module, --config "
        "and --section.key overrides",
    ),
    Trainer.MEGATRON: TrainerRelease(
        "megatron-core",
        ("0.16", "0.17", "0.18", "0.19"),
        "0.19.2",
        "--pipeline-model-parallel-layout and its grammar are the same in megatron-core 0.16.1 and 0.19.2; "
        "earlier releases may not have it",
    ),
    Trainer.DEEPSPEED: TrainerRelease(
        "deepspeed",
        ("0.19",),
        "0.19.8",
        "the export overrides PipelineModule._partition_layers, a private method, as deepspeed 0.19.8 has it",
    ),
    Trainer.ACCELERATE: TrainerRelease(
        "accelerate",
        ("1",),
        "1.15.0",
        "prepare_pippy(model, split_points, example_args, num_chunks) is accelerate 1.x's",
    ),
}
"""What each export targets: ``pipeplan export --help`` and docs/export.md say the same."""

_VERSION = re.compile(r"^v?(?P<release>\d+(?:\.\d+)*)(?:[.+-]?[0-9A-Za-z][0-9A-Za-z.+-]*)?$")


def trainer_release(trainer: Trainer | str, version: str | None = None) -> str:
    """The release of ``trainer`` to write for: ``version`` if the export is for it, the current one if None.

    Raises:
        UsageError: ``version`` is not a version, or not one of the series the export is for.

    >>> trainer_release("torchtitan"), trainer_release("deepspeed", "0.19.9")
    ('0.3.0', '0.19.9')
    """
    release = RELEASES[Trainer.parse(trainer)]
    if version is None:
        return release.current
    text = str(version).strip()
    match = _VERSION.match(text)
    if match is None:
        raise UsageError(f"--trainer-version {shorten(repr(version), 40)} is not a version (e.g. {release.current})")
    if not release.accepts(tuple(int(p) for p in match["release"].split("."))):
        raise UsageError(
            f"{release.package} {shorten(text, 30)} is not a release this export is for ({release.series_text}; run "
            f"against {release.current}): {release.why}"
        )
    return text.removeprefix("v")


# --- names ------------------------------------------------------------------------------------------------


def apply_renames(names: Sequence[str], renames: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Each name with its longest matching ``OLD`` prefix (on a dot boundary) replaced by ``NEW``.

    The plan names the modules of the profiled model (``model.layers.3`` in transformers' Llama); the trainer
    may build the same model under other names (``layers.3`` in torchtitan's). ``NEW`` empty strips the prefix.

    >>> apply_renames(["model.embed_tokens", "model.layers.0", "lm_head"], [("model.embed_tokens", "tok_embeddings"),
    ...                                                                     ("model", "")])
    ('tok_embeddings', 'layers.0', 'lm_head')
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


def _header(plan: Plan, trainer: Trainer, version: str) -> tuple[str, ...]:
    release = RELEASES[trainer]
    return (
        f"pipeplan plan of {plan.model_name}: {plan.num_ranks} ranks, {plan.num_stages} stages, schedule "
        f"{plan.schedule.value}, micro-batch {plan.micro_batch_size} x {plan.num_microbatches} = "
        f"{plan.global_batch_size}, predicted iteration {plan.predicted.iteration_s:.4g} s",
        f"for {release.package} {version} (this export is for {release.series_text}; docs/export.md)",
    )


def _recompute_note(plan: Plan, how: str) -> list[str]:
    stages = [s.index for s in plan.stages if s.recompute]
    if not stages:
        return []
    which = "every stage" if len(stages) == plan.num_stages else f"stages {', '.join(map(str, stages))} only"
    return [f"the plan recomputes activations on {which}: {how}"]


def _comment(lines: Sequence[str], mark: str = "#") -> list[str]:
    return [f"{mark} {line}" if line else mark for line in lines]


def _flag_text(comments: Sequence[str], flags: Sequence[str]) -> str:
    """Flags one per line with shell continuations, under comments: pasted after a command, or read with
    ``grep -v '^#' FILE | sed 's/ \\\\$//'``."""
    body = [f"{flag} \\" for flag in flags[:-1]] + [flags[-1]]
    return "\n".join([*_comment(comments), *body]) + "\n"


def _data_parallel_note(plan: Plan) -> str:
    if plan.mesh is None:
        return f"one pipeline: launch {plan.num_ranks} processes (data-parallel degree 1)"
    m = plan.mesh
    return (
        f"cluster plan: pp {m.pp} x dp {m.dp} = {m.used_devices} processes (world size); shard {m.shard}; "
        f"{m.global_batch_size} samples per step, {plan.global_batch_size} per replica"
    )


# --- rank order -------------------------------------------------------------------------------------------


def rank_of_device(plan: Plan) -> tuple[int, ...]:
    """For each device of a cluster plan (the ``RANK`` torchrun gives it), the rank a trainer that puts the
    pipeline outermost must be given to run there what the plan put there.

    torchtitan, DeepSpeed's default topology and Megatron's default order run replica ``r``'s pipeline rank
    ``s`` on rank ``s * dp + r``. Empty when that is each device's own rank: one pipeline, or the plan's
    ``replicas-in-node`` placement.
    """
    if plan.mesh is None or plan.mesh.dp == 1:
        return ()
    mesh = plan.mesh
    ranks = [0] * mesh.used_devices
    for replica, row in enumerate(mesh.devices):
        for stage_rank, device in enumerate(row):
            ranks[device] = stage_rank * mesh.dp + replica
    return () if ranks == list(range(mesh.used_devices)) else tuple(ranks)


def _pipeline_inner(plan: Plan) -> bool:
    """True when each replica's pipeline ranks are consecutive devices: ``devices[r][s] == r * pp + s``."""
    if not rank_of_device(plan):
        return False
    mesh = plan.mesh
    assert mesh is not None  # rank_of_device is empty without one
    if any(device != r * mesh.pp + s for r, row in enumerate(mesh.devices) for s, device in enumerate(row)):
        raise ExportError(
            f"the plan's mesh puts its {mesh.pp} x {mesh.dp} ranks on devices {shorten(str(mesh.devices), 60)}: "
            "neither pipeline ranks nor replicas on consecutive devices, the two orders the trainers have"
        )
    return True


def _launch_rank(ranks: Sequence[int], pp: int, dp: int) -> str:
    """A shell assignment that turns torchrun's ``RANK`` (the device) into ``ranks[RANK]``."""
    if all(rank == (d % pp) * dp + d // pp for d, rank in enumerate(ranks)):
        return f"export RANK=$(( (RANK % {pp}) * {dp} + RANK / {pp} ))"
    return f"PLAN_RANKS=({' '.join(map(str, ranks))}); export RANK=${{PLAN_RANKS[$RANK]}}"


# --- torchtitan -------------------------------------------------------------------------------------------

# How torchtitan 0.3's decoders (llama3, qwen3, deepseek_v3, ...) name their top-level parts.
_TORCHTITAN_DECODER = re.compile(r"^(?:tok_embeddings|layers\.\d+|norm|lm_head)$")


@dataclass(frozen=True)
class TorchtitanExport:
    """torchtitan 0.3's command-line overrides for the plan (``--parallelism.*``, ``--training.*`` and the
    activation-checkpoint subcommand), appended to ``-m torchtitan.train --module M --config C``."""

    trainer_version: str
    pipeline_parallel_degree: int
    pipeline_parallel_schedule: str
    """torch's schedule class name without ``Schedule`` (torch's ``get_schedule_class`` takes it)."""
    pipeline_parallel_microbatch_size: int
    local_batch_size: int
    """Samples per data-parallel rank per step: ``microbatch_size x micro-batches``."""
    global_batch_size: int
    """Samples per step over all replicas (one gradient-accumulation step)."""
    module_fqns_per_model_part: tuple[tuple[str, ...], ...]
    activation_checkpoint: str
    """The subcommand's choice: ``none`` or ``full`` (torchtitan checkpoints every stage alike)."""
    data_parallel_replicate_degree: int = 1
    """DDP replicas (a cluster plan's ``dp`` with ``--shard none``)."""
    data_parallel_shard_degree: int = 1
    """FSDP shards (a cluster plan's ``dp`` with ``--shard full`` or ``optimizer``)."""
    rank_of_device: tuple[int, ...] = ()
    """The ``RANK`` torchtitan must be given on each device (:func:`rank_of_device`); empty: its own."""
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def flags(self) -> tuple[str, ...]:
        """The overrides, each with its value; the subcommand last, as torchtitan's parser (tyro) requires."""
        parts = " ".join(",".join(part) for part in self.module_fqns_per_model_part)
        return (
            f"--parallelism.pipeline_parallel_degree {self.pipeline_parallel_degree}",
            f"--parallelism.pipeline_parallel_schedule {self.pipeline_parallel_schedule}",
            f"--parallelism.pipeline_parallel_microbatch_size {self.pipeline_parallel_microbatch_size}",
            f"--parallelism.module_fqns_per_model_part {parts}",
            f"--parallelism.data_parallel_replicate_degree {self.data_parallel_replicate_degree}",
            f"--parallelism.data_parallel_shard_degree {self.data_parallel_shard_degree}",
            f"--training.local_batch_size {self.local_batch_size}",
            f"--training.global_batch_size {self.global_batch_size}",
            "--training.disable_cuda_graphs",
            f"activation-checkpoint:{self.activation_checkpoint}",
        )

    def text(self) -> str:
        """The flags, one per line with shell continuations, under comments."""
        return _flag_text([*self.header, *self.notes], self.flags())


def _torchtitan(plan: Plan, renames: Sequence[tuple[str, str]], version: str) -> TorchtitanExport:
    stages = _renamed_stages(plan, renames)
    for index, names in enumerate(stages):
        for name in names:
            if name.count(".") > 1 or name.startswith(".") or name.endswith("."):
                raise ExportError(
                    f"torchtitan splits only top-level modules and items NAME.KEY of top-level ModuleList/ModuleDict "
                    f"(_split_module), and stage {index} holds {shorten(name, 60)}: map the names onto "
                    "torchtitan's model with --rename OLD=NEW (e.g. --rename model.layers=layers)"
                )
            if "," in name or any(c.isspace() for c in name):
                raise ExportError(
                    f"torchtitan reads a model part as comma-joined names, and stage {index} holds "
                    f"{shorten(repr(name), 60)}: rename it with --rename OLD=NEW"
                )
    dp = plan.mesh.dp if plan.mesh is not None else 1
    sharded = plan.mesh is not None and plan.mesh.shard != "none"
    recompute = [s.recompute for s in plan.stages]
    ranks = rank_of_device(plan)
    schedule = TORCH_SCHEDULE_CLASS[plan.schedule].removeprefix("Schedule")
    notes = [
        "append to: torchrun ... -m torchtitan.train --module MODULE --config CONFIG (torchtitan 0.3 reads no "
        "TOML); activation-checkpoint:... stays last: no --section.key may follow it",
        "each part lists FQNs of the model torchtitan builds: _split_module sets every top-level module a part "
        "does not name to None, and drops a name the model lacks without an error",
    ]
    if not all(_TORCHTITAN_DECODER.match(name) for names in stages for name in names):
        notes.append(
            "these names are not those of torchtitan's decoders (tok_embeddings, layers.N, norm, lm_head): if "
            "the model is one of them, map the names with --rename OLD=NEW"
        )
    notes += [
        "torchtitan 0.3 refuses weight tying with pipeline parallelism (models/common/decoder.py): build a tied "
        "model (GPT-2, Llama 3.2 1B/3B) with enable_weight_tying=False, which trains the head apart",
        _data_parallel_note(plan),
    ]
    if plan.mesh is not None and plan.mesh.shard == "optimizer":
        notes.append(
            "torchtitan has no ZeRO-1: the plan's optimizer-state sharding becomes FSDP "
            "(data_parallel_shard_degree), which also shards weights and gradients"
        )
    if ranks:
        mesh = plan.mesh
        assert mesh is not None  # rank_of_device is empty without one
        notes.append(
            f"torchtitan's mesh is pp-major (rank = pipeline rank x {mesh.dp} + replica) and the plan puts each "
            f"pipeline on consecutive devices: set each process's RANK before torchtitan starts, e.g. torchrun ... "
            f"--no-python bash -c '{_launch_rank(ranks, mesh.pp, mesh.dp)}; exec python -m torchtitan.train "
            '"$@"\' bash --module ... (examples/torchtitan)'
        )
    if any(recompute) and not all(recompute):
        notes += _recompute_note(
            plan, "torchtitan checkpoints every stage alike; activation-checkpoint:full keeps each within its memory"
        )
    return TorchtitanExport(
        trainer_version=version,
        pipeline_parallel_degree=plan.num_ranks,
        pipeline_parallel_schedule=schedule,
        pipeline_parallel_microbatch_size=plan.micro_batch_size,
        local_batch_size=plan.global_batch_size,
        global_batch_size=plan.mesh.global_batch_size if plan.mesh is not None else plan.global_batch_size,
        module_fqns_per_model_part=stages,
        activation_checkpoint="full" if any(recompute) else "none",
        data_parallel_replicate_degree=1 if sharded else dp,
        data_parallel_shard_degree=dp if sharded else 1,
        rank_of_device=ranks,
        header=_header(plan, Trainer.TORCHTITAN, version),
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
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def flags(self) -> tuple[str, ...]:
        return (
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
    units = [u for s in plan.stages for u in s.units]
    stage_of = {u: s.index for s in plan.stages for u in s.units}
    roles = megatron_layers(units)
    last = plan.num_stages - 1
    pp, v, m = plan.num_ranks, plan.num_stages // plan.num_ranks, plan.num_microbatches
    if v > 1 and m % pp != 0:
        raise ExportError(
            f"Megatron's interleaved schedule runs micro-batches in groups of pp (core/pipeline_parallel/"
            f"schedules.py), and the plan has {m} micro-batches on pp {pp}: plan with --global-batch and "
            f"--micro-batch giving a multiple of {pp}"
        )

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
    pipeline_inner = _pipeline_inner(plan)
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
    if pipeline_inner:
        notes.append(
            "the plan puts each pipeline on consecutive devices: --use-tp-pp-dp-mapping makes Megatron's rank "
            "order tp-cp-ep-pp-dp (its default, tp-cp-ep-dp-pp, puts replicas of a stage on consecutive ranks)"
        )
    megatron_schedule = "interleaved 1F1B" if v > 1 else "1F1B"
    if plan.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
        notes.append(
            f"Megatron runs {megatron_schedule} with this layout, not the plan's {plan.schedule.value}: the partition "
            "carries over, the predicted iteration does not"
        )
    notes += _recompute_note(plan, "Megatron's --recompute-* flags apply to every stage alike; set them by hand")
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
        header=_header(plan, Trainer.MEGATRON, version),
        notes=tuple(notes),
    )


# --- DeepSpeed --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepSpeedExport:
    """A ``PipelineModule`` subclass cut at the plan's boundaries, its topology, and the ds_config settings."""

    trainer_version: str
    num_stages: int
    parts: tuple[int, ...]
    """Layer boundaries: stage ``s`` holds ``layers[parts[s]:parts[s + 1]]``; ``parts[-1]`` is the layer count."""
    layer_names: tuple[str, ...]
    """What ``layers[i]`` must compute: the plan's unit ``i``."""
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    train_batch_size: int
    """Samples per step over all replicas: micro-batch x steps x data-parallel size, as the engine checks."""
    data_parallel_size: int = 1
    zero_stage: int = 0
    """0 (``--shard none``) or 1 (``--shard optimizer``): the pipeline engine refuses stages 2 and 3."""
    pipe_inner: bool = False
    """The topology puts ``pipe`` innermost (each pipeline on consecutive ranks) instead of DeepSpeed's default."""
    activation_checkpoint_interval: int = 0
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def ds_config(self) -> dict[str, object]:
        """The ds_config entries the plan decides (merged over the user's own)."""
        return {
            "train_batch_size": self.train_batch_size,
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {"stage": self.zero_stage},
        }

    def topology(self) -> str:
        """The Python expression of the plan's topology."""
        pp, dp = self.num_stages, self.data_parallel_size
        if self.pipe_inner:
            return f'ProcessTopology(axes=["data", "pipe"], dims=[{dp}, {pp}])'
        return f"PipeDataParallelTopology(num_pp={pp}, num_dp={dp})"

    def text(self) -> str:
        """A Python snippet: the plan's numbers, the subclass, and how to build it."""
        names = "".join(f"    {name!r},\n" for name in self.layer_names)
        order = "pipe innermost: each pipeline on consecutive ranks" if self.pipe_inner else "pipe outermost"
        lines = _comment([*self.header, *self.notes])
        lines += [
            "from deepspeed.pipe import PipelineModule",
            "from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, ProcessTopology",
            "",
            f"# layers[i] must compute PLAN_UNITS[i]: {len(self.layer_names)} layers, in this order.",
            f"PLAN_UNITS = [\n{names}]",
            "# Stage s holds layers[PLAN_PARTS[s]:PLAN_PARTS[s + 1]].",
            f"PLAN_PARTS = {list(self.parts)}",
            f"# {self.num_stages} pipeline stage(s) x {self.data_parallel_size} data-parallel replica(s), {order}.",
            f"PLAN_TOPOLOGY = {self.topology()}",
            "# ds_config entries: DeepSpeed checks train_batch_size = micro-batch x steps x data-parallel size.",
            f"PLAN_DS_CONFIG = {json.dumps(self.ds_config())}",
            f"PLAN_ACTIVATION_CHECKPOINT_INTERVAL = {self.activation_checkpoint_interval}",
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
            "# model = PlannedPipelineModule(layers=layers, topology=PLAN_TOPOLOGY, loss_fn=loss_fn,",
            "#                               activation_checkpoint_interval=PLAN_ACTIVATION_CHECKPOINT_INTERVAL)",
            "# engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,",
            "#                                   config={**ds_config, **PLAN_DS_CONFIG})",
        ]
        return "\n".join(lines) + "\n"


def _deepspeed(plan: Plan, renames: Sequence[tuple[str, str]], version: str) -> DeepSpeedExport:
    _check_one_stage_per_rank(plan, Trainer.DEEPSPEED, "PipelineModule's num_stages is the pipe dimension")
    if plan.mesh is not None and plan.mesh.shard == "full":
        raise ExportError(
            "DeepSpeed's pipeline engine allows ZeRO stage 1 at most (runtime/pipe/engine.py), and the plan shards "
            "weights and gradients over its replicas (--shard full): plan with --shard optimizer (ZeRO-1) or none"
        )
    stages = _renamed_stages(plan, renames)
    parts = [0]
    for names in stages:
        parts.append(parts[-1] + len(names))
    recompute = [s.recompute for s in plan.stages]
    notes = [
        "PipelineModule takes no explicit parts (partition_method: parameters | uniform | type:REGEX), so",
        "the subclass below overrides _partition_layers to set self.parts to the plan's boundaries",
        _data_parallel_note(plan),
    ]
    pipe_inner = _pipeline_inner(plan)
    if pipe_inner:
        notes.append(
            "the plan puts each pipeline on consecutive devices: PLAN_TOPOLOGY puts pipe innermost (DeepSpeed's "
            "default PipeDataParallelTopology puts replicas of a stage on consecutive ranks)"
        )
    if plan.schedule is not Schedule.ONE_F_ONE_B:
        notes.append(
            f"DeepSpeed runs its own 1F1B-like TrainSchedule, not the plan's {plan.schedule.value}: the partition "
            "carries over, the predicted iteration does not"
        )
    if any(recompute) and not all(recompute):
        notes += _recompute_note(
            plan, "activation_checkpoint_interval applies to every stage alike; 1 keeps each within its memory"
        )
    return DeepSpeedExport(
        trainer_version=version,
        num_stages=plan.num_stages,
        parts=tuple(parts),
        layer_names=tuple(u for names in stages for u in names),
        train_micro_batch_size_per_gpu=plan.micro_batch_size,
        gradient_accumulation_steps=plan.num_microbatches,
        train_batch_size=plan.mesh.global_batch_size if plan.mesh is not None else plan.global_batch_size,
        data_parallel_size=plan.mesh.dp if plan.mesh is not None else 1,
        zero_stage=1 if plan.mesh is not None and plan.mesh.shard == "optimizer" else 0,
        pipe_inner=pipe_inner,
        activation_checkpoint_interval=1 if any(recompute) else 0,
        header=_header(plan, Trainer.DEEPSPEED, version),
        notes=tuple(notes),
    )


# --- accelerate -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccelerateExport:
    """``prepare_pippy`` arguments for the plan's split: pipeline-parallel inference at micro-batch 1."""

    trainer_version: str
    num_processes: int
    split_points: tuple[str, ...]
    num_chunks: int
    """Chunks of one sample: each call of the prepared model takes exactly this many samples."""
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """A Python snippet calling ``prepare_pippy`` on ``model`` with ``example_input`` (one sample)."""
        points = ", ".join(repr(p) for p in self.split_points)
        lines = _comment([*self.header, *self.notes])
        lines += [
            "from accelerate import prepare_pippy",
            "",
            f"SPLIT_POINTS = [{points}]",
            f"NUM_CHUNKS = {self.num_chunks}",
            "",
            f"# run with: torchrun --nproc-per-node {self.num_processes} your_script.py (or accelerate launch);",
            "# on CPU, create accelerate.PartialState(cpu=True) first. example_input is ONE sample (batch 1):",
            "# each call of the prepared model takes exactly NUM_CHUNKS samples; the last process gets the output.",
            "model = prepare_pippy(model, split_points=SPLIT_POINTS, example_args=(example_input,), "
            "num_chunks=NUM_CHUNKS)",
        ]
        return "\n".join(lines) + "\n"


def _accelerate(plan: Plan, renames: Sequence[tuple[str, str]], version: str) -> AccelerateExport:
    _check_one_stage_per_rank(plan, Trainer.ACCELERATE, "prepare_pippy builds the stage of its process index")
    stages = _renamed_stages(plan, renames)
    notes = [
        "accelerate's pipelining is inference only: torch's pipeline() split before each point, ScheduleGPipe,",
        "forward only; the split carries over, the plan's training schedule and prediction do not",
        "micro-batch 1: prepare_pippy traces example_args as one chunk and pads a call of other than NUM_CHUNKS "
        "samples, which then splits unevenly (accelerate/inference.py); NUM_CHUNKS = the plan's "
        f"{plan.num_microbatches} micro-batches",
    ]
    if plan.micro_batch_size > 1:
        notes.append(
            f"the plan's micro-batch of {plan.micro_batch_size} does not carry over: a call takes 1 x "
            f"{plan.num_microbatches} samples, not {plan.micro_batch_size} x {plan.num_microbatches}"
        )
    if plan.mesh is not None and plan.mesh.dp > 1:
        notes.append(
            f"prepare_pippy makes one pipeline of all its processes: the plan's {plan.mesh.dp} replicas are "
            f"{plan.mesh.dp} launches of {plan.num_ranks} processes"
        )
    return AccelerateExport(
        trainer_version=version,
        num_processes=plan.num_ranks,
        split_points=tuple(names[0] for names in stages[1:]),
        num_chunks=plan.num_microbatches,
        header=_header(plan, Trainer.ACCELERATE, version),
        notes=tuple(notes),
    )


# --- entry point ------------------------------------------------------------------------------------------


Export = TorchtitanExport | MegatronExport | DeepSpeedExport | AccelerateExport


def export_plan(
    plan: Plan,
    trainer: Trainer | str,
    renames: Sequence[tuple[str, str]] = (),
    trainer_version: str | None = None,
) -> Export:
    """The configuration ``trainer`` takes for ``plan``'s layout; ``.text()`` is what to paste.

    ``renames`` (``OLD``, ``NEW``) map the profiled model's module names onto the trainer's
    (:func:`apply_renames`); Megatron's layout names no modules and takes none. ``trainer_version`` is the
    trainer's release (:data:`RELEASES`; None: the current one).

    Raises:
        ExportError: the trainer cannot express the plan (the message says what and why).
        UsageError: an unknown trainer or release, or renames that collide.
    """
    trainer = Trainer.parse(trainer)
    version = trainer_release(trainer, trainer_version)
    _check_schedule(plan, trainer)
    if trainer is Trainer.TORCHTITAN:
        return _torchtitan(plan, renames, version)
    if trainer is Trainer.MEGATRON:
        if renames:
            raise UsageError("--rename has no effect on Megatron's layout, which names no modules: leave it out")
        return _megatron(plan, version)
    if trainer is Trainer.DEEPSPEED:
        return _deepspeed(plan, renames, version)
    return _accelerate(plan, renames, version)
