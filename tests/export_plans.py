"""Plans written by hand for the export tests (tests/planner/test_export*.py), each passed through the plan
reader, so that every one is a plan a user can have; and the cluster meshes pipeplan places them on."""

from __future__ import annotations

import dataclasses
import json
import random
import shlex
from collections.abc import Sequence
from typing import NamedTuple

from planner.cost import MemoryBreakdown
from planner.plan import Mesh, Plan, Prediction, SolverInfo, StagePlan, plan_from_dict
from planner.schedule.orders import Schedule, stage_to_rank

__all__ = ["GPT2_TINY", "LLAMA_SMALL", "RandomCase", "random_case", "hand_plan", "on_mesh", "shell_words"]

# The units the built-in models are profiled as (README, "The model-spec protocol";
# tests/profiles/models/test_builtin_models.py).
GPT2_TINY = [
    "transformer.wte",
    "transformer.wpe",
    *(f"transformer.h.{i}" for i in range(4)),
    "transformer.ln_f",
    "lm_head",
]
LLAMA_SMALL = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(8)), "model.norm", "lm_head"]


class RandomCase(NamedTuple):
    """A seeded planning case of the export tests: unit names, forward times, ranks and schedule (None: auto)."""

    names: list[str]
    forward_s: list[float]
    ranks: int
    schedule: Schedule | None


def random_case(seed: int) -> RandomCase:
    """Random costs, ranks and schedules over the built-in models' units (an interleaved schedule only where the
    units make two stages per rank)."""
    rng = random.Random(seed)
    names = rng.choice([GPT2_TINY, LLAMA_SMALL])
    forward = [rng.uniform(0.05, 2.0) for _ in names]
    ranks = rng.choice([2, 3, 4])
    schedule = rng.choice([None, Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED_1F1B])
    if schedule is Schedule.INTERLEAVED_1F1B and 2 * ranks > len(names):
        schedule = None
    return RandomCase(names, forward, ranks, schedule)


def hand_plan(
    stages: Sequence[Sequence[str]],
    *,
    ranks: int | None = None,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    recompute: Sequence[int] = (),
    micro_batch_size: int = 1,
    num_microbatches: int = 8,
) -> Plan:
    """A plan cutting the units as ``stages`` lists them, placed as torch places ``schedule``'s stages."""
    n = len(stages)
    ranks = ranks or n
    memory = MemoryBreakdown(params=0, grads=0, optimizer=0, activations=0, transient=0, peak=0)
    placement = stage_to_rank(schedule, n, ranks)
    plan = Plan(
        model_name="hand",
        model_fingerprint="ab" * 32,
        profile_sha256="0" * 64,
        num_stages=n,
        num_ranks=ranks,
        schedule=schedule,
        virtual_stages=n // ranks,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        global_batch_size=micro_batch_size * num_microbatches,
        stages=tuple(
            StagePlan(s, placement[s], tuple(units), s in recompute, 1e-3, 2e-3, 0, 1, memory)
            for s, units in enumerate(stages)
        ),
        split_points=tuple(units[0] for units in stages[1:]),
        predicted=Prediction(
            iteration_s=1.0, formula_iteration_s=1.0, bubble_fraction=0.0, samples_per_s=8.0, bottleneck_stage=0
        ),
        solver=SolverInfo(name="hand", objective="none", optimal=False),
    )
    return plan_from_dict(json.loads(json.dumps(plan.to_dict())))


def on_mesh(
    plan: Plan,
    dp: int,
    *,
    placement: str = "pipeline-in-node",
    shard: str = "none",
    tp: int = 1,
    sequence_parallel: bool = True,
    vocab_parallel: bool = True,
) -> Plan:
    """``plan`` as one replica of a cluster plan of ``dp`` replicas (each position a group of ``tp`` devices),
    placed as pipeplan's cluster search places them (planner/cluster.py, ``Layout.device``), through the plan
    reader; with ``tp`` > 1, modelled with Megatron's layout unless the switches say otherwise."""
    pp = plan.num_ranks
    if placement == "pipeline-in-node":
        devices = tuple(tuple((r * pp + s) * tp for s in range(pp)) for r in range(dp))
    else:
        devices = tuple(tuple((s * dp + r) * tp for s in range(pp)) for r in range(dp))
    if tp > 1:  # as plan_cluster records them
        constraints = {
            **plan.constraints,
            "tensor_parallel": tp,
            "sequence_parallel": sequence_parallel,
            "vocab_parallel": vocab_parallel,
        }
        plan = dataclasses.replace(plan, constraints=constraints)
    mesh = Mesh(
        pp=pp,
        dp=dp,
        placement=placement,
        shard=shard,
        num_devices=pp * dp * tp,
        devices_per_node=pp * dp * tp,
        global_batch_size=dp * plan.global_batch_size,
        devices=devices,
        hop_bytes_per_s=1e9,
        hop_latency_s=1e-4,
        ring_bytes_per_s=1e9,
        ring_latency_s=1e-4,
        tp=tp,
    )
    return plan_from_dict(json.loads(json.dumps(dataclasses.replace(plan, mesh=mesh).to_dict())))


def shell_words(text: str) -> list[str]:
    """The words a POSIX shell makes of an export pasted after a command: comment lines dropped,
    backslash-newline continuations joined, quotes removed."""
    return shlex.split(text.replace("\\\n", " "), comments=True)
