"""Every split-backward and multi-stage torch schedule, run for real: 2 gloo processes on gpt2-tiny.

One launch runs all the schedules in turn (the launch and imports cost more than the steps), each on
a hand-built plan placed as torch places it (looped, or V for zbv/dualpipev) with global batch 8 in 4
micro-batches; the loss and every gradient must equal one process's (``verify.compare_numerics``).
zbv's stages 1 and 2 recompute (activation checkpointing under torch's split I/W backward), and the tied
embedding / LM head sit on one rank in the V (stages 0 and 3) while the other rank holds no copy.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_plan

from planner.plan import Plan
from planner.runtime.apply import apply_plan, tied_parameter_groups
from planner.runtime.launch import run_ranks
from planner.runtime.verify import _merge_rank_grads, compare_numerics, reference_step
from profiles.models import BUILTIN_MODELS
from profiles.workload import as_tuple, load_workload

_FOUR_STAGES = ["transformer.h.0", "transformer.h.2", "transformer.ln_f"]
_CASES = {
    "zero-bubble": ["transformer.h.2"],  # ZB-H1: one stage per rank
    "looped-bfs": _FOUR_STAGES,
    "zbv": _FOUR_STAGES,
    "dualpipev": _FOUR_STAGES,  # M = 4 = 2P, the fewest it takes
}


def _steps(rank: int, world_size: int, plans: list[Plan]) -> list[dict[str, Any]]:
    out = []
    for plan in plans:
        workload = load_workload("gpt2-tiny")
        inputs, target = workload.make_batch(plan.global_batch_size)
        run = apply_plan(plan, workload.model, inputs, workload.loss_fn, device=torch.device("cpu"))
        loss = run.step(as_tuple(inputs), target)
        grads = {n: p.grad.detach().clone() for n, p in run.named_parameters() if p.grad is not None}
        out.append({"loss": None if loss is None else loss.item(), "grads": grads, "stages": run.stage_indices})
    return out


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[Plan, list[dict[str, Any]]]]:
    model = BUILTIN_MODELS["gpt2-tiny"]()
    recompute = {"zbv": (False, True, True, False)}
    plans = [
        make_plan(model, splits, name, num_microbatches=4, micro_batch_size=2, recompute=recompute.get(name, ()))
        for name, splits in _CASES.items()
    ]
    per_rank = run_ranks(_steps, (plans,), 2, timeout_s=300)
    return {p.schedule.value: (p, [r[k] for r in per_rank]) for k, p in enumerate(plans)}


@pytest.mark.parametrize("schedule", list(_CASES))
def test_numerics_equal_one_process(runs: dict[str, tuple[Plan, list[dict[str, Any]]]], schedule: str) -> None:
    plan, results = runs[schedule]
    assert [r["stages"] for r in results] == [
        tuple(s.index for s in plan.stages_of_rank(rank)) for rank in range(plan.num_ranks)
    ]
    if schedule in ("zbv", "dualpipev"):
        assert results[0]["stages"] == (0, 3) and results[1]["stages"] == (1, 2)  # the V
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    fresh = load_workload("gpt2-tiny")
    grads = _merge_rank_grads([r["grads"] for r in results], tied_parameter_groups(fresh.model))
    report = compare_numerics(*reference_step(fresh, plan), loss, grads)
    assert report.ok, report
