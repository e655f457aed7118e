"""A trainer's configuration as pipeplan reads it: which profiled units each stage holds, the schedule, the
batch and the mesh, as the trainer itself would build them (:class:`TrainerLayout`); and the model's parts
in the trainers' terms (:class:`ModelParts`), which the readers place by the trainers' rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import ConfigError, ExportError, shorten
from planner.export import apply_renames, megatron_layers
from planner.schedule.orders import Schedule

__all__ = ["TrainerLayout", "ModelParts", "model_parts", "stages_from_names", "count_stages"]


@dataclass(frozen=True)
class TrainerLayout:
    """What a trainer would run for a configuration, in the profile's units."""

    trainer: str
    stages: tuple[tuple[str, ...], ...]
    """The profile's units each stage holds, in stage order (stage ``s`` on rank ``stage_to_rank``'s)."""
    num_ranks: int
    """The pipeline degree, pp."""
    schedule: Schedule
    micro_batch_size: int
    num_microbatches: int
    """Micro-batches per replica per pipeline step."""
    recompute: tuple[bool, ...]
    """Per stage: whole-stage activation recomputation (full checkpointing)."""
    data_parallel: int = 1
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    """With tensor parallelism: the activations outside the matrices split too (Megatron's flag)."""
    shard: str = "none"
    """What the replicas split: none (DDP), optimizer (ZeRO-1, Megatron's distributed optimizer), full (FSDP)."""
    placement: str = "replicas-in-node"
    """The trainers' default puts a stage's replicas on consecutive ranks; ``pipeline-in-node`` the pipeline's."""
    read: tuple[str, ...] = ()
    """The settings read, as ``name = value`` lines, for the report."""
    notes: tuple[str, ...] = ()
    """What the prediction does not model, or what the trainer does that the user may not expect."""

    @property
    def global_batch_size(self) -> int:
        """Samples per pipeline step over all replicas."""
        return self.micro_batch_size * self.num_microbatches * self.data_parallel

    @property
    def world_size(self) -> int:
        return self.num_ranks * self.tensor_parallel * self.data_parallel

    @property
    def is_mesh(self) -> bool:
        return self.data_parallel > 1 or self.tensor_parallel > 1


@dataclass(frozen=True)
class ModelParts:
    """The profile's units as the transformer trainers see a language model."""

    embedding: tuple[str, ...]
    """What runs before the first decoder layer (Megatron's E, torchtitan's tok_embeddings)."""
    layers: tuple[tuple[str, ...], ...]
    """Each decoder layer's units, in order."""
    loss: tuple[str, ...]
    """What runs after the last decoder layer: final norm and head (Megatron's L, torchtitan's norm, lm_head)."""

    def stages(self, layers_per_stage: Sequence[int], trainer: str) -> tuple[tuple[str, ...], ...]:
        """The units of stages holding the embedding (first), these counts of consecutive layers, and the loss
        (last); raises where a stage would hold nothing."""
        stages: list[tuple[str, ...]] = []
        start = 0
        last = len(layers_per_stage) - 1
        for s, count in enumerate(layers_per_stage):
            units = [u for layer in self.layers[start : start + count] for u in layer]
            start += count
            units = [*(self.embedding if s == 0 else ()), *units, *(self.loss if s == last else ())]
            if not units:
                raise ConfigError(
                    f"{trainer} would build stage {s} of {len(layers_per_stage)} with no layer at all: pipeplan plans "
                    "stages of at least one unit; give that rank layers"
                )
            stages.append(tuple(units))
        return tuple(stages)


def model_parts(units: Sequence[str], trainer: str) -> ModelParts:
    """The embedding, decoder layers and loss of a transformer's units (:func:`~planner.export.megatron_layers`)."""
    try:
        roles = megatron_layers(units)
    except ExportError as exc:
        raise ConfigError(
            f"{trainer} places decoder layers, and the profile's units are not a transformer's: {exc}"
        ) from None
    return ModelParts(roles.embedding, roles.decoder, roles.loss)


def stages_from_names(
    parts: Sequence[Sequence[str]], units: Sequence[str], renames: Sequence[tuple[str, str]], trainer: str, what: str
) -> tuple[tuple[str, ...], ...]:
    """The profile's units of each stage named in the trainer's words (a module and everything under it), after
    ``renames`` (``OLD=NEW``, the profile's names onto the trainer's, as ``export`` takes them).

    Raises where a name matches no unit, a unit is in two stages or in none (the trainer would run it twice or
    not train it), or the stages do not run the units in the model's order."""
    trainer_names = apply_renames(units, renames)
    stage_of: dict[str, int] = {}
    for s, names in enumerate(parts):
        for name in names:
            matched = [u for u, t in zip(units, trainer_names, strict=True) if t == name or t.startswith(name + ".")]
            if not matched:
                raise ConfigError(
                    f"{what} of stage {s} names {shorten(repr(name), 50)}, which is no unit of the profile "
                    f"(units: {shorten(', '.join(trainer_names), 90)}); map the profile's names with --rename OLD=NEW"
                )
            for unit in matched:
                if unit in stage_of and stage_of[unit] != s:
                    raise ConfigError(
                        f"{what} puts {shorten(unit, 50)} on stages {stage_of[unit]} and {s}: {trainer} would build "
                        "and run it twice"
                    )
                stage_of[unit] = s
    missing = [u for u in units if u not in stage_of]
    if missing:
        raise ConfigError(
            f"{trainer} would train {len(units) - len(missing)} of the model's {len(units)} units: "
            f"{shorten(', '.join(missing), 90)} {'is' if len(missing) == 1 else 'are'} on no stage ({what})"
        )
    order = [stage_of[u] for u in units]
    for a, b, before, after in zip(order, order[1:], units, units[1:], strict=False):
        if b < a:
            raise ConfigError(
                f"{what}: stage {b} holds {shorten(after, 50)}, which runs after {shorten(before, 50)} of stage {a}: "
                "a pipeline's stages run the model's units in order"
            )
    stages = [tuple(u for u in units if stage_of[u] == s) for s in range(len(parts))]
    for s, held in enumerate(stages):
        if not held:
            raise ConfigError(f"{what}: stage {s} holds no unit of the profile; pipeplan plans stages of at least one")
    return tuple(stages)


def count_stages(layers_per_stage: Sequence[int]) -> str:
    """``4, 4, 4, 2``: the decoder layers per stage as the report prints them."""
    return ", ".join(str(n) for n in layers_per_stage)
