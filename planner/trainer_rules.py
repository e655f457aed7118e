"""``plan --for TRAINER``: the plan search narrowed to what a trainer can run, so that ``export --to`` takes it.

Each trainer runs some of torch's schedules and places stages its own way; Megatron-Core also builds the
embedding and the final norm and head as layers of the first and the last stage. Those rules become the
request's schedules and pins; whatever they cannot say (a cut inside a decoder layer, names a trainer cannot
split) is still held by the exporter itself, once the plan is made (:func:`check_trainer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.errors import ExportError, PlanInfeasibleError, UsageError
from planner.export import Trainer, export_plan, megatron_layers
from planner.plan import Plan
from planner.request import PlanRequest
from planner.schedule.orders import Schedule
from profiles.format import Profile

__all__ = ["TRAINER_SCHEDULES", "TRAINER_SHARDING", "TRAINER_COLLECTIVES", "for_trainer", "check_trainer"]

TRAINER_SCHEDULES: dict[Trainer, tuple[Schedule, ...]] = {
    # Megatron-Core runs 1F1B, interleaved when the layout gives a rank several stages (layout stage i on rank
    # i % pp, the looped placement).
    Trainer.MEGATRON: (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B),
    # torchtitan builds every schedule of torch.distributed.pipelining.
    Trainer.TORCHTITAN: tuple(s for s in Schedule if s is not Schedule.NAIVE),
    # DeepSpeed's PipelineEngine runs its own 1F1B-like TrainSchedule, one stage per rank.
    Trainer.DEEPSPEED: (Schedule.ONE_F_ONE_B,),
    # accelerate's prepare_pippy runs torch's GPipe, for inference.
    Trainer.ACCELERATE: (Schedule.GPIPE,),
}

TRAINER_SHARDING: dict[Trainer, tuple[str, ...]] = {
    # Megatron's distributed optimizer shards optimizer state (and gradients), never the weights.
    Trainer.MEGATRON: ("none", "optimizer"),
    # torchtitan shards with FSDP (data_parallel_shard_degree) or not at all: it has no ZeRO-1.
    Trainer.TORCHTITAN: ("none", "full"),
    # DeepSpeed's pipeline engine allows ZeRO stage 1 at most (runtime/pipe/engine.py).
    Trainer.DEEPSPEED: ("none", "optimizer"),
    # accelerate's prepare_pippy runs inference: there is nothing to shard.
    Trainer.ACCELERATE: ("none",),
}
"""What ``--shard auto`` searches for a plan made ``--for`` each trainer: the modes it runs."""

TRAINER_COLLECTIVES: dict[Trainer, dict[str, bool]] = {
    # Megatron-LM reduces the gradients after the step's last backward unless --overlap-grad-reduce (off by
    # default); its FSDP-free distributed optimizer is ZeRO-1's volume.
    Trainer.MEGATRON: {"trainer_collectives": True, "overlap_grad_reduce": False},
    # torchtitan's FSDP2 keeps a pipeline stage gathered all step (reshard_after_forward = not pp_enabled) and
    # reduce-scatters behind the last backward, as DDP's buckets do.
    Trainer.TORCHTITAN: {"trainer_collectives": True, "overlap_grad_reduce": True},
    # DeepSpeed's pipeline engine all-reduces the gradients once the step's backwards are done (_exec_reduce_grads).
    Trainer.DEEPSPEED: {"trainer_collectives": True, "overlap_grad_reduce": False},
    Trainer.ACCELERATE: {"trainer_collectives": False, "overlap_grad_reduce": False},
}
"""How each trainer's replicas run their collectives (:class:`~planner.cluster.MeshSearch`): a plan made ``--for``
it, and ``check --from`` it, are costed so."""


def for_trainer(profile: Profile, request: PlanRequest, trainer: Trainer | str) -> PlanRequest:
    """``request`` with the schedules and pins ``trainer`` needs. Raises UsageError where the request asks for
    what the trainer cannot run, ExportError where the model is not one the trainer builds."""
    trainer = Trainer.parse(trainer)
    allowed = TRAINER_SCHEDULES[trainer]
    if request.schedule is not None and request.schedule not in allowed:
        raise UsageError(
            f"--for {trainer.value} runs {', '.join(s.value for s in allowed)}, not --schedule {request.schedule.value}"
        )
    changes: dict[str, object] = {"auto_schedules": allowed}
    if trainer is Trainer.MEGATRON:
        roles = megatron_layers([u.name for u in profile.units])
        # The embedding ends on the first stage and the final norm and head begin on the last: nothing else cuts
        # them (units before a pin stay at or before its stage, units after it at or after).
        pins = {roles.embedding[-1]: 0, roles.loss[0]: -1}
        changes["pinned"] = tuple({**dict(request.pinned), **pins}.items())
    if trainer is Trainer.ACCELERATE:
        if request.micro_batch_size not in (None, 1):
            raise UsageError("--for accelerate: prepare_pippy runs micro-batches of 1 (for inference): drop it")
        changes["micro_batch_size"] = 1
    if trainer is Trainer.TORCHTITAN and any(u.tied_params for u in profile.units):
        tied = next(u for u in profile.units if u.tied_params)
        raise UsageError(
            f"--for torchtitan: torchtitan refuses weight tying with pipeline parallelism, and {profile.model.name} "
            f"ties {tied.tied_params[0]}: build the model untied (e.g. tie_word_embeddings=False) and profile it again"
        )
    return replace(request, **changes)  # type: ignore[arg-type]


def check_trainer(plan: Plan, trainer: Trainer | str, renames: Sequence[tuple[str, str]] = ()) -> None:
    """Refuse a plan ``trainer``'s exporter does not take (with ``renames`` of its module names), with its reason
    (the rules :func:`for_trainer` could not state as schedules and pins)."""
    trainer = Trainer.parse(trainer)
    try:
        export_plan(plan, trainer, renames)
    except ExportError as exc:
        raise PlanInfeasibleError(f"no plan within {trainer.value}'s rules was found: {exc}") from None
