"""torchtitan 0.3: the command-line overrides its ConfigManager reads for the plan's stages."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import ExportError, shorten
from planner.export.common import (
    Trainer,
    _data_parallel_note,
    _flag_text,
    _header,
    _launch_rank,
    _recompute_note,
    _renamed_stages,
    rank_of_device,
    tensor_parallel_of,
    whole_vocabulary_note,
)
from planner.plan import Plan
from planner.schedule.orders import TORCH_SCHEDULE_CLASS

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
    tensor_parallel_degree: int = 1
    """The plan's ``tp`` (written only above 1: an export without tensor parallelism carries no trace of it)."""
    enable_sequence_parallel: bool = True
    """torchtitan's default; off only when the plan's tensor parallelism is without it."""
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def flags(self) -> tuple[str, ...]:
        """The overrides, each with its value; the subcommand last, as torchtitan's parser (tyro) requires."""
        parts = " ".join(",".join(part) for part in self.module_fqns_per_model_part)
        tensor = [f"--parallelism.tensor_parallel_degree {self.tensor_parallel_degree}"]
        tensor += [] if self.enable_sequence_parallel else ["--parallelism.no_enable_sequence_parallel"]
        return (
            *(tensor if self.tensor_parallel_degree > 1 else []),
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
    _check_part_names(stages)
    dp = plan.mesh.dp if plan.mesh is not None else 1
    sharded = plan.mesh is not None and plan.mesh.shard != "none"
    recompute = [s.recompute for s in plan.stages]
    ranks = rank_of_device(plan)
    schedule = TORCH_SCHEDULE_CLASS[plan.schedule].removeprefix("Schedule")
    tp, sequence = tensor_parallel_of(plan)
    notes = _torchtitan_notes(plan, stages, ranks)
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
        tensor_parallel_degree=tp,
        enable_sequence_parallel=sequence or tp == 1,
        header=_header(plan, Trainer.TORCHTITAN, version),
        notes=tuple(notes),
    )


def _check_part_names(stages: Sequence[Sequence[str]]) -> None:
    """Raise where a stage names a module torchtitan cannot split the model at, or cannot read in a part."""
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


def _torchtitan_notes(plan: Plan, stages: Sequence[Sequence[str]], ranks: tuple[int, ...]) -> list[str]:
    """What a user of the export should know: how to launch it, the names, weight tying, data and tensor
    parallelism, the rank order, and recomputation."""
    recompute = [s.recompute for s in plan.stages]
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
    tp, sequence = tensor_parallel_of(plan)
    notes += whole_vocabulary_note(plan, Trainer.TORCHTITAN)
    if tp > 1:
        notes.append(
            f"tensor parallelism {tp} (innermost in torchtitan's mesh, as in the plan's): the model's parallelize "
            "function splits attention, MLP, embedding and output"
            + ("" if sequence else "; the plan has no sequence parallelism")
        )
    if ranks:
        mesh = plan.mesh
        assert mesh is not None  # rank_of_device is empty without one
        order = f"pipeline rank x {mesh.dp} + replica"
        order = order if mesh.tp == 1 else f"({order}) x {mesh.tp} + tp rank"
        notes.append(
            f"torchtitan's mesh is pp-major (rank = {order}) and the plan puts each "
            f"pipeline on consecutive devices: set each process's RANK before torchtitan starts, e.g. torchrun ... "
            f"--no-python bash -c '{_launch_rank(ranks, mesh.pp, mesh.dp, mesh.tp)}; exec python -m torchtitan.train "
            '"$@"\' bash --module ... (examples/torchtitan)'
        )
    if any(recompute) and not all(recompute):
        notes += _recompute_note(
            plan, "torchtitan checkpoints every stage alike; activation-checkpoint:full keeps each within its memory"
        )
    return notes
