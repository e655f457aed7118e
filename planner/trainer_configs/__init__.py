"""Trainers' configurations read as the trainers read them: Megatron-Core's arguments, torchtitan's
overrides or TOML, DeepSpeed's ds_config and pipeline arguments, each into a :class:`TrainerLayout` of the
profile's units (what ``pipeplan check`` predicts). Pure: text and a profile in, a layout out; no torch.

The rules each reader follows are the trainer's own code at the releases ``export`` writes for
(docs/export.md), and tests/planner/test_trainer_configs.py holds them against that code where it is
installed (the ``trainers`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.check_options import CHECKED_TRAINERS
from planner.errors import UsageError, shorten
from planner.trainer_configs.deepspeed import read_deepspeed
from planner.trainer_configs.layout import TrainerLayout
from planner.trainer_configs.megatron import read_megatron
from planner.trainer_configs.torchtitan import read_torchtitan
from profiles.format import Profile

__all__ = ["CHECKED_TRAINERS", "TrainerLayout", "read_config"]


def read_config(
    trainer: str,
    text: str,
    profile: Profile,
    *,
    renames: Sequence[tuple[str, str]] = (),
    devices: int | None = None,
) -> TrainerLayout:
    """The layout ``trainer`` builds from the configuration ``text`` for ``profile``'s model; ``renames`` map
    the profile's module names onto the trainer's (not Megatron's, whose layout names none); ``devices`` is the
    job's world size where the configuration leaves it open."""
    key = str(trainer).strip().lower()
    names = [u.name for u in profile.units]
    if key == "megatron":
        if renames:
            raise UsageError("--rename has no effect on Megatron's layout, which names no modules: leave it out")
        return read_megatron(text, names, devices=devices)
    if key == "torchtitan":
        return read_torchtitan(text, names, renames=renames, devices=devices)
    if key == "deepspeed":
        return read_deepspeed(text, profile.units, renames=renames, devices=devices)
    raise UsageError(f"check --from {shorten(repr(trainer), 30)}: reads {', '.join(CHECKED_TRAINERS)}")
