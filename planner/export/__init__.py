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

from collections.abc import Sequence

from planner.errors import UsageError, shorten
from planner.export.accelerate import AccelerateExport, _accelerate
from planner.export.common import (
    RELEASES,
    Trainer,
    TrainerRelease,
    _check_schedule,
    apply_renames,
    rank_of_device,
    trainer_release,
)
from planner.export.deepspeed import DeepSpeedExport, _deepspeed
from planner.export.megatron import MegatronExport, MegatronLayers, _megatron, megatron_layers
from planner.export.torchtitan import TorchtitanExport, _torchtitan
from planner.plan import Plan

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
    units = [u for s in plan.stages for u in s.units]
    if renames and trainer is not Trainer.MEGATRON and apply_renames(units, renames) == tuple(units):
        raise UsageError(
            f"--rename {', '.join(shorten(old, 30) + '=' for old, _ in renames)}: no unit's name starts with "
            f"{'it' if len(renames) == 1 else 'any of them'} (units: {shorten(', '.join(units), 100)})"
        )
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
