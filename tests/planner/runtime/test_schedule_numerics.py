"""Every split-backward and multi-stage torch schedule, run for real: 2 gloo processes on gpt2-tiny.

One launch runs all the schedules in turn (the launch and imports cost more than the steps), each on
a hand-built plan placed as torch places it (looped, or V for zbv/dualpipev) with global batch 8 in 4
micro-batches; the loss and every gradient must equal one process's (``verify.compare_numerics``).
zbv's stages 1 and 2 recompute (activation checkpointing under torch's split I/W backward), and the tied
embedding / LM head sit on one rank in the V (stages 0 and 3) while the other rank holds no copy. A UNet
under zbv relays skip connections through the middle stages (outputs that need a gradient and were
views, which torch's ``stage_backward_input`` cannot detach in place).
"""

from __future__ import annotations

from dataclasses import replace
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
_UNET = "tests/model_zoo.py:unet"
_UNET_UNITS = ("enc.0", "enc.1", "enc.2", "mid", "dec.0", "dec.1", "dec.2", "head")
_CASES = {  # name: (model spec, split points, schedule)
    "zero-bubble": ("gpt2-tiny", ["transformer.h.2"], "zero-bubble"),  # ZB-H1: one stage per rank
    "looped-bfs": ("gpt2-tiny", _FOUR_STAGES, "looped-bfs"),
    "zbv": ("gpt2-tiny", _FOUR_STAGES, "zbv"),
    "dualpipev": ("gpt2-tiny", _FOUR_STAGES, "dualpipev"),  # M = 4 = 2P, the fewest it takes
    "zbv-unet": (_UNET, ["enc.2", "dec.0", "dec.1"], "zbv"),
}


def _steps(rank: int, world_size: int, jobs: list[tuple[str, Plan]]) -> list[dict[str, Any]]:
    out = []
    for spec, plan in jobs:
        workload = load_workload(spec)
        inputs, target = workload.make_batch(plan.global_batch_size)
        run = apply_plan(plan, workload.model, inputs, workload.loss_fn, device=torch.device("cpu"))
        loss = run.step(as_tuple(inputs), target)
        grads = {n: p.grad.detach().clone() for n, p in run.named_parameters() if p.grad is not None}
        out.append({"loss": None if loss is None else loss.item(), "grads": grads, "stages": run.stage_indices})
    return out


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[str, Plan, list[dict[str, Any]]]]:
    recompute = {"zbv": (False, True, True, False)}
    jobs = []
    for name, (spec, splits, schedule) in _CASES.items():
        if spec in BUILTIN_MODELS:
            workload = BUILTIN_MODELS[spec]()
        else:  # the zoo's UNet: its default units, named for the hand-built plan
            workload = replace(load_workload(spec), units=_UNET_UNITS)
        plan = make_plan(
            workload, splits, schedule, num_microbatches=4, micro_batch_size=2, recompute=recompute.get(name, ())
        )
        jobs.append((spec, plan))
    per_rank = run_ranks(_steps, (jobs,), 2, timeout_s=300)
    return {
        name: (spec, plan, [r[k] for r in per_rank])
        for k, (name, (spec, plan)) in enumerate(zip(_CASES, jobs, strict=True))
    }


@pytest.mark.parametrize("schedule", list(_CASES))
def test_numerics_equal_one_process(runs: dict[str, tuple[str, Plan, list[dict[str, Any]]]], schedule: str) -> None:
    spec, plan, results = runs[schedule]
    assert [r["stages"] for r in results] == [
        tuple(s.index for s in plan.stages_of_rank(rank)) for rank in range(plan.num_ranks)
    ]
    if plan.schedule.v_shape:
        assert results[0]["stages"] == (0, 3) and results[1]["stages"] == (1, 2)  # the V
    loss = next(r["loss"] for r in results if r["loss"] is not None)
    fresh = load_workload(spec)
    grads = _merge_rank_grads([r["grads"] for r in results], tied_parameter_groups(fresh.model))
    report = compare_numerics(*reference_step(fresh, plan), loss, grads)
    assert report.ok, report
