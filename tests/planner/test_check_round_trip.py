"""``check --from TRAINER`` of what ``export --to TRAINER`` wrote gives the plan back: its stages, schedule,
micro-batching and mesh, and its prediction to the byte (the configuration is costed as the search costs
its own partition)."""

from __future__ import annotations

import dataclasses

import pytest
from export_plans import random_case

from planner.check import CheckOptions, check_config
from planner.errors import ExportError
from planner.export import export_plan
from planner.plan import Plan
from planner.planning import plan_profile
from planner.request import ClusterOptions, PlanOptions
from planner.schedule.orders import Schedule
from synthetic import make_profile, transformer_profile

LLAMA_RENAMES = (("model.embed_tokens", "tok_embeddings"), ("model.layers", "layers"), ("model.norm", "norm"))

# (trainer, model style, ranks, global batch, devices, tensor parallel, shard)
CASES = [
    ("megatron", "gpt2", 2, 8, None, 1, "none"),
    ("megatron", "gpt2", 4, 16, None, 1, "none"),
    ("megatron", "llama", 4, 8, None, 1, "none"),
    ("megatron", "llama", 2, 16, 8, 1, "optimizer"),
    ("megatron", "llama", 2, 8, 8, 2, "none"),
    ("torchtitan", "llama", 2, 8, None, 1, "none"),
    ("torchtitan", "llama", 4, 16, None, 1, "none"),
    ("torchtitan", "llama", 2, 16, 8, 1, "full"),
    ("torchtitan", "llama", 2, 8, 8, 2, "none"),
    ("deepspeed", "gpt2", 2, 8, None, 1, "none"),
    ("deepspeed", "llama", 4, 16, None, 1, "none"),
    ("deepspeed", "llama", 2, 16, 8, 1, "optimizer"),
]


def _plan(trainer: str, style: str, ranks: int, batch: int, devices: int | None, tp: int, shard: str) -> Plan:
    profile = transformer_profile(style, layers=8, sizes=(1, 2), heads=8)
    search = PlanOptions(ranks=ranks, global_batch=batch, trainer=trainer)
    cluster = ClusterOptions(devices=devices, shard=shard, tensor_parallel=tp, jobs=1) if devices else None
    renames = LLAMA_RENAMES if trainer == "torchtitan" else ()
    return plan_profile(profile, search, cluster, sha256="0" * 64, renames=renames).plan


@pytest.mark.parametrize(("trainer", "style", "ranks", "batch", "devices", "tp", "shard"), CASES)
def test_check_of_an_export_gives_the_plan_back(trainer, style, ranks, batch, devices, tp, shard) -> None:
    plan = _plan(trainer, style, ranks, batch, devices, tp, shard)
    renames = LLAMA_RENAMES if trainer == "torchtitan" else ()
    text = export_plan(plan, trainer, renames).text()
    profile = transformer_profile(style, layers=8, sizes=(1, 2), heads=8)
    # torchtitan's flags say nothing of where ranks go (its launcher rewrites RANK): check is told.
    placement = plan.mesh.placement if plan.mesh and trainer == "torchtitan" else None
    devices = plan.mesh.used_devices if plan.mesh else None
    options = CheckOptions(renames=renames, devices=devices, placement=placement, no_best=True)
    checked = check_config(profile, trainer, text, options, sha256="0" * 64).plan
    assert [s.units for s in checked.stages] == [s.units for s in plan.stages]
    assert [s.rank for s in checked.stages] == [s.rank for s in plan.stages]
    assert (checked.schedule, checked.micro_batch_size, checked.num_microbatches) == (
        plan.schedule,
        plan.micro_batch_size,
        plan.num_microbatches,
    )
    assert checked.mesh == plan.mesh
    assert checked.predicted == plan.predicted
    assert [s.memory_bytes for s in checked.stages] == [s.memory_bytes for s in plan.stages]


RUNS_AS_PLANNED = {
    "megatron": (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B),
    "deepspeed": (Schedule.ONE_F_ONE_B,),
    "torchtitan": tuple(Schedule),
}


@pytest.mark.parametrize("seed", range(12))
def test_check_of_every_export_of_random_plans(seed: int) -> None:
    """The export tests' random plans (tests/planner/test_export.py): each export a trainer accepts comes back
    as the same stages; with the same prediction where the trainer runs the plan's schedule, else under the
    trainer's own schedule (Megatron and DeepSpeed run 1F1B where the plan says GPipe)."""
    names, forward, ranks, schedule = random_case(seed)
    profile = make_profile(forward, sizes=(1, 2))
    profile = dataclasses.replace(
        profile, units=tuple(dataclasses.replace(u, name=n) for u, n in zip(profile.units, names, strict=True))
    )
    search = PlanOptions(ranks=ranks, global_batch=8 * ranks, schedule=schedule.value if schedule else "auto")
    plan = plan_profile(profile, search, sha256="0" * 64).plan
    renames = {"torchtitan": (("transformer", ""), ("model", ""))}
    checked_any = False
    for trainer in ("megatron", "torchtitan", "deepspeed"):
        try:
            text = export_plan(plan, trainer, renames.get(trainer, ())).text()
        except ExportError:
            continue
        options = CheckOptions(renames=renames.get(trainer, ()), no_best=True)
        checked = check_config(profile, trainer, text, options, sha256="0" * 64).plan
        checked_any = True
        assert [s.units for s in checked.stages] == [s.units for s in plan.stages], trainer
        assert (checked.micro_batch_size, checked.num_microbatches) == (plan.micro_batch_size, plan.num_microbatches)
        if plan.schedule in RUNS_AS_PLANNED[trainer]:
            assert checked.schedule is plan.schedule
            assert checked.predicted == plan.predicted, trainer
        else:
            assert checked.schedule is Schedule.ONE_F_ONE_B, trainer
    assert checked_any


@pytest.mark.parametrize(
    ("trainer", "text", "devices"),
    [
        ("megatron", "--pipeline-model-parallel-size 4 --micro-batch-size 1 --global-batch-size 16", None),
        (
            "megatron",
            "--pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --micro-batch-size 1 "
            "--global-batch-size 16",
            8,
        ),
        (
            "torchtitan",
            "--parallelism.pipeline_parallel_degree 2 --training.local_batch_size 8 --training.disable_cuda_graphs",
            None,
        ),
        (
            "deepspeed",
            '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 4, '
            '"partition_method": "uniform"}}',
            None,
        ),
    ],
)
def test_the_best_plan_is_no_slower_than_the_configuration_on_its_devices(trainer, text, devices) -> None:
    """The configuration is one plan the trainer's rules allow, so the exact search under those rules finds one
    at least as fast (less the 1 % within which it prefers evenly used ranks), on the same mesh and batch."""
    profile = transformer_profile("llama", layers=8, sizes=(1, 2), heads=8)
    renames = LLAMA_RENAMES if trainer == "torchtitan" else ()
    result = check_config(profile, trainer, text, CheckOptions(renames=renames, devices=devices), sha256="0" * 64)
    assert result.best is not None, result.best_error
    assert result.speedup is not None and result.speedup >= 0.99
    assert result.best.global_batch_size == result.plan.global_batch_size
    degrees = lambda p: (p.mesh.pp, p.mesh.tp, p.mesh.dp) if p.mesh else (p.num_ranks, 1, 1)  # noqa: E731
    assert degrees(result.best) == degrees(result.plan)
