"""DeepSpeed: a PipelineModule subclass with the plan's boundaries and the batch settings of its mesh."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import ExportError
from planner.export.common import (
    Trainer,
    _check_one_stage_per_rank,
    _comment,
    _data_parallel_note,
    _header,
    _pipeline_inner,
    _recompute_note,
    _refuse_tensor_parallel,
    _renamed_stages,
)
from planner.plan import Plan
from planner.schedule.orders import Schedule

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
    _refuse_tensor_parallel(
        plan,
        Trainer.DEEPSPEED,
        "its PipelineModule runs the model's own layers whole, and its topology's model-parallel axis needs "
        "Megatron-style split layers and an mpu the model does not have",
    )
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
