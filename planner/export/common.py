"""What every export shares: the trainers and their releases, renaming, the checks, the notes and the rank
order a trainer gives a cluster plan's devices."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from planner.errors import ExportError, UsageError, shorten
from planner.plan import Plan
from planner.schedule.orders import Schedule
from planner.tensor_parallel import planned_switches


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


def tensor_parallel_of(plan: Plan) -> tuple[int, bool]:
    """The plan's tensor-parallel degree (1 without a mesh) and whether it planned sequence parallelism."""
    tp = plan.mesh.tp if plan.mesh is not None else 1
    return tp, tp > 1 and planned_switches(plan.constraints)[0]


def whole_vocabulary_note(plan: Plan, trainer: Trainer) -> list[str]:
    """A note for a tensor-parallel plan modelled with the embedding and head whole (pipeplan's runtime layout),
    which the trainer splits by vocabulary: the structure carries over, the predicted memory does not."""
    tp = plan.mesh.tp if plan.mesh is not None else 1
    if tp == 1 or planned_switches(plan.constraints)[1]:
        return []
    return [
        f"the plan models pipeplan's tensor-parallel layout (embedding and head whole on every device); "
        f"{trainer.value} splits them by vocabulary, so its memory per device is lower than the plan's: for "
        "the trainer's own numbers, plan with --tp-layout megatron"
    ]


def _refuse_tensor_parallel(plan: Plan, trainer: Trainer, why: str) -> None:
    """A trainer whose export has no tensor parallelism: a plan with it is refused, saying what it lacks."""
    tp, _ = tensor_parallel_of(plan)
    if tp > 1:
        raise ExportError(
            f"{trainer.value} cannot run the plan's tensor parallelism (tp {tp}): {why}; plan with --tensor-parallel 1"
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
    degrees = f"pp {m.pp} x dp {m.dp}" if m.tp == 1 else f"pp {m.pp} x tp {m.tp} x dp {m.dp}"
    return (
        f"cluster plan: {degrees} = {m.used_devices} processes (world size); shard {m.shard}; "
        f"{m.global_batch_size} samples per step, {plan.global_batch_size} per replica"
    )


# --- rank order -------------------------------------------------------------------------------------------


def rank_of_device(plan: Plan) -> tuple[int, ...]:
    """For each device of a cluster plan (the ``RANK`` torchrun gives it), the rank a trainer that puts the
    pipeline outermost must be given to run there what the plan put there.

    torchtitan, DeepSpeed's default topology and Megatron's default order run replica ``r``'s pipeline rank
    ``s`` on rank ``s * dp + r`` (times ``tp``, plus the device's place in its tensor-parallel group: tp is
    innermost in torchtitan's mesh and Megatron's orders). Empty when that is each device's own rank: one
    pipeline, or the plan's ``replicas-in-node`` placement.
    """
    if plan.mesh is None or plan.mesh.dp == 1:
        return ()
    mesh = plan.mesh
    ranks = [0] * mesh.used_devices
    for replica, row in enumerate(mesh.devices):
        for stage_rank, device in enumerate(row):
            # Tensor parallelism is innermost in the trainers' orders as in the plan's mesh.
            for member in range(mesh.tp):
                ranks[device + member] = (stage_rank * mesh.dp + replica) * mesh.tp + member
    return () if ranks == list(range(mesh.used_devices)) else tuple(ranks)


def _pipeline_inner(plan: Plan) -> bool:
    """True when each replica's pipeline ranks are consecutive devices: ``devices[r][s] == r * pp + s``."""
    if not rank_of_device(plan):
        return False
    mesh = plan.mesh
    assert mesh is not None  # rank_of_device is empty without one
    if any(device != (r * mesh.pp + s) * mesh.tp for r, row in enumerate(mesh.devices) for s, device in enumerate(row)):
        raise ExportError(
            f"the plan's mesh puts its {mesh.pp} x {mesh.dp} ranks on devices {shorten(str(mesh.devices), 60)}: "
            "neither pipeline ranks nor replicas on consecutive devices, the two orders the trainers have"
        )
    return True


def _launch_rank(ranks: Sequence[int], pp: int, dp: int, tp: int = 1) -> str:
    """A shell assignment that turns torchrun's ``RANK`` (the device) into ``ranks[RANK]``."""
    if tp == 1 and all(rank == (d % pp) * dp + d // pp for d, rank in enumerate(ranks)):
        return f"export RANK=$(( (RANK % {pp}) * {dp} + RANK / {pp} ))"
    if tp > 1 and all(rank == ((d // tp % pp) * dp + d // tp // pp) * tp + d % tp for d, rank in enumerate(ranks)):
        return f"export RANK=$(( ((RANK / {tp} % {pp}) * {dp} + RANK / {tp} / {pp}) * {tp} + RANK % {tp} ))"
    return f"PLAN_RANKS=({' '.join(map(str, ranks))}); export RANK=${{PLAN_RANKS[$RANK]}}"
