"""A training loop that records its steps (planner.apply_plan(..., record=True)) on 2 gloo processes: the same
numerics as without recording, every action of every step in the record, the report verify builds, and the
stages as they were once recording stops."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import make_plan

from planner.runtime.launch import run_ranks
from planner.runtime.recorded_run import apply_plan
from planner.runtime.recording import STAGE_METHODS
from planner.runtime.run_record import load_run_record
from planner.runtime.run_refit import refit_from_runs
from profiles.models import BUILTIN_MODELS
from synthetic import calibration

STEPS = 4


def _train(rank: int, world_size: int, plan, path: str) -> dict:
    """Each rank: one step unrecorded and one recorded from the same weights (their losses), then a recorded
    loop with an optimizer, its record and report, and the stages after recording stops."""
    out: dict = {}
    for record in (False, True):
        workload = BUILTIN_MODELS["gpt2-tiny"]()
        x, y = workload.make_batch(plan.global_batch_size)
        run = apply_plan(plan, workload.model, x, workload.loss_fn, device="cpu", record=record)
        loss = run.step(x, y)
        out[f"loss_{record}"] = None if loss is None else loss.item()
    run.stop_recording()
    originals = [{m: getattr(s, m) for m, _ in STAGE_METHODS} for s in run.stages]
    run.start_recording()
    optimizer = torch.optim.SGD(run.parameters(), lr=1e-3)
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        run.step(x, y)
        optimizer.step()
    record = run.save_record(path)
    report = run.report()
    run.stop_recording()
    out["restored"] = all(
        getattr(s, m) == f for s, methods in zip(run.stages, originals, strict=True) for m, f in methods.items()
    )
    out["is_record"] = record is not None
    out["report"] = None if report is None else report.to_dict()
    return out


def test_a_recorded_loop_writes_its_record_and_reports_as_verify(tmp_path: Path) -> None:
    workload = BUILTIN_MODELS["gpt2-tiny"]()
    plan = make_plan(workload, ["transformer.h.2"], "1f1b")
    path = tmp_path / "run.json"
    results = run_ranks(_train, (plan, str(path)), 2, timeout_s=240)
    # Recording changes no number: the last rank's loss is the same bit for bit.
    assert results[1]["loss_True"] == results[1]["loss_False"] is not None
    assert [r["is_record"] for r in results] == [True, False]
    assert [r["report"] is None for r in results] == [False, True]
    assert all(r["restored"] for r in results)

    record = load_run_record(path)
    assert record.plan_sha256 and record.plan.to_dict() == plan.to_dict()
    assert [r.rank for r in record.ranks] == [0, 1]
    m = plan.num_microbatches
    for rank in record.ranks:
        # The first step after the restart, then STEPS with the optimizer: the first recorded stretch's step too.
        assert len(rank.steps) == STEPS + 1 and all(s.optimizer for s in rank.steps[1:])
        assert {s.segment for s in rank.steps} == {0, 1}
        for step in rank.steps:
            kinds = [kind for kind, _ in step.actions[0]]
            assert kinds.count("F") == m and kinds.count("B") == m
            assert step.own_s >= step.schedule_s > 0 and step.tail_s > 0 and step.busy_s > 0
        assert rank.reference_s and rank.host and rank.threads >= 1

    report = results[0]["report"]
    assert report["mode"] == "processes" and report["steps"] == STEPS - 1
    assert report["measured_iteration_s"] > 0 and all(s["measured_forward_s"] > 0 for s in report["stages"])
    assert [r["measured_compute_s"] > 0 for r in report["ranks"]] == [True, True]

    # The record teaches the plan: refit from it, the same plan is predicted within 10 % of what it measured.
    (check,) = refit_from_runs([record], calibration()).checks
    assert abs(check.after.verdict_error_pct) < 10.0
