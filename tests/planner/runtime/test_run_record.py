"""Run records (docs/run-record.md) and ``calibrate --from-run``, without processes: records made from a
simulated run whose true runtime terms are known, so the refit must find them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cli import main
from planner.calibration import load_calibration
from planner.errors import PlanFormatError, UsageError
from planner.plan import Plan
from planner.runtime.model_cost import learning_plan
from planner.runtime.recording import StepSample, _merged_loss
from planner.runtime.run_record import (
    RankRecord,
    RunRecord,
    load_run_record,
    plan_sha256,
    rank_results,
    record_from_dict,
    record_report,
    save_run_record,
)
from planner.runtime.run_refit import refit_from_runs
from synthetic import calibration, make_profile

START = calibration(colocation_factor=1.0, action_overhead_s={"1f1b": 1e-3, "gpipe": 1e-3})


def _plan() -> Plan:
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    return learning_plan(profile, START, 8, sha256="0" * 64, micro_batch_size=2)


def _record(plan: Plan, *, scale: float, overhead_s: float, steps: int = 5, tail: float = 1.0) -> RunRecord:
    """What ranks running ``plan`` would record if its compute ran ``scale`` x the profile, each action cost
    ``overhead_s`` and the tails ``tail`` x the plan's."""
    terms = plan.predicted.runtime
    truth = plan.simulation(
        replace(
            terms,
            compute_scale=scale,
            action_overhead_s=overhead_s,
            step_tail_s=tuple(t * tail for t in terms.step_tail_s),
        )
    )
    ranks = []
    for r in range(plan.num_ranks):
        mine = [s.index for s in plan.stages_of_rank(r)]
        actions = [
            [(a.kind, a.duration_s - a.overhead_s) for a in truth.actions if a.stage == s and a.kind != "S"]
            for s in mine
        ]
        busy = sum(d for stage in actions for _, d in stage)
        samples = tuple(
            StepSample(
                start_s=k * truth.iteration_s,
                schedule_s=truth.iteration_s - truth.step_tail_s[r],
                own_s=truth.iteration_s,
                tail_s=truth.step_tail_s[r],
                wait_s=max(0.0, truth.iteration_s - busy - truth.step_tail_s[r] - truth.overhead_s[r]),
                optimizer=True,
                actions=actions,
            )
            for k in range(steps)
        )
        ranks.append(RankRecord(r, "host", r, r, 0, 0, tuple(mine), 1, (), samples))
    return RunRecord(plan, plan_sha256(plan), tuple(ranks), {"hosts": ["host"]}, "2026-01-01T00:00:00+00:00")


def test_a_record_round_trips_through_its_json(tmp_path: Path) -> None:
    plan = _plan()
    record = _record(plan, scale=1.2, overhead_s=2e-3)
    path = tmp_path / "run.json"
    save_run_record(record, path)
    again = load_run_record(path)
    assert again.to_dict() == record.to_dict()
    assert again.plan_sha256 == plan_sha256(again.plan)


def test_an_edited_record_is_refused_in_one_line(tmp_path: Path) -> None:
    data = json.loads(json.dumps(_record(_plan(), scale=1.0, overhead_s=1e-3).to_dict()))
    data["plan"]["model"]["name"] = "another"
    with pytest.raises(PlanFormatError, match="plan_sha256"):
        record_from_dict(data)
    with pytest.raises(PlanFormatError, match="format"):
        record_from_dict({**data, "format": "pipeplan.plan"})
    bad = json.loads(json.dumps(_record(_plan(), scale=1.0, overhead_s=1e-3).to_dict()))
    bad["ranks"][0]["steps"][0]["actions"][0][0][0] = "X"
    with pytest.raises(PlanFormatError, match="invalid run record"):
        record_from_dict(bad)


def test_a_steps_time_runs_to_the_next_steps_start_within_one_stretch() -> None:
    plan = _plan()
    record = _record(plan, scale=1.0, overhead_s=1e-3, steps=6)
    rank = record.ranks[0]
    # A stop and a start between steps 3 and 4: that gap is no step's period.
    steps = tuple(
        replace(s, start_s=s.start_s + (100.0 if k >= 4 else 0.0), segment=int(k >= 4))
        for k, s in enumerate(rank.steps)
    )
    record = replace(record, ranks=(replace(rank, steps=steps), *record.ranks[1:]))
    (first, *_) = rank_results(record, warmup=1)
    assert first.timed_steps == 3  # steps 1-2, 2-3, 4-5
    assert first.iteration_s == pytest.approx([rank.steps[1].start_s - rank.steps[0].start_s] * 3)
    with pytest.raises(UsageError, match="needs 2 more"):
        rank_results(record, warmup=5)


def test_the_report_of_a_record_is_verifys_and_a_true_record_matches_its_plan() -> None:
    plan = _plan()
    terms = plan.predicted.runtime
    report = record_report(_record(plan, scale=terms.compute_scale, overhead_s=terms.action_overhead_s))
    assert report.mode == "processes"
    assert report.measured_iteration_s == pytest.approx(plan.predicted.iteration_s, rel=1e-9)
    assert abs(report.verdict_error_pct) < 1e-6
    assert [s.measured_forward_s for s in report.stages] == pytest.approx([s.forward_s for s in plan.stages], rel=1e-6)


def test_the_refit_finds_the_runs_terms_and_says_which_moved() -> None:
    plan = _plan()
    record = _record(plan, scale=1.4, overhead_s=1.5e-3, tail=1.2)
    result = refit_from_runs([record], START, tolerance=0.05)
    cal = result.calibration
    assert cal.colocation_factor == pytest.approx(1.4, rel=0.02)
    assert cal.overhead_for(plan.schedule) == pytest.approx(1.5e-3, rel=0.1)
    assert cal.learned_model is not None and cal.learned_model["name"] == plan.model_name
    (check,) = result.checks
    assert abs(check.before.verdict_error_pct) > 5.0
    assert abs(check.after.verdict_error_pct) < 2.0
    assert check.most_moved.name == "co-location"


def test_merged_loss_counts_the_loss_in_the_forward_before_it() -> None:
    assert _merged_loss([[("F", 1.0), ("L", 0.5), ("B", 2.0), ("L", 0.25)]]) == [[("F", 1.5), ("B", 2.0), ("L", 0.25)]]


def test_calibrate_from_run_writes_a_calibration_and_says_what_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan()
    run = tmp_path / "run.json"
    save_run_record(_record(plan, scale=1.5, overhead_s=1e-3), run)
    start = tmp_path / "start.json"
    start.write_text(json.dumps(START.to_dict()))
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--from-run", str(run), "--start", str(start), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the term that moved most: co-location" in text
    assert load_calibration(out).colocation_factor == pytest.approx(1.5, rel=0.02)
    # The plan names no calibration file here: the start must be given.
    assert main(["calibrate", "--from-run", str(run), "--out", str(out)]) == 2
    assert "--start" in capsys.readouterr().err
    run.write_text("{}")
    assert main(["calibrate", "--from-run", str(run), "--start", str(start), "--out", str(out)]) == 2
    assert "not a pipeplan run record" in capsys.readouterr().err


def test_a_record_of_too_few_steps_says_how_many_it_needs() -> None:
    with pytest.raises(UsageError, match="recorded 2 steps: a report skips 1 and needs 2 more"):
        record_report(_record(_plan(), scale=1.0, overhead_s=1e-3, steps=2))
