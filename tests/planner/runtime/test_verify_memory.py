"""The plan's memory is what the run uses: each stage's predicted peak against the one verify measures.

A real profile of gpt2-tiny (its memory figures measured by the same tracker verify uses), plans for 2 ranks
under two schedules, run on 2 gloo processes and replayed in one: every stage within the 10 % tolerance."""

from __future__ import annotations

import warnings

import pytest
import torch

from planner.errors import PipeplanWarning
from planner.plan import Plan
from planner.request import plan_request
from planner.runtime.verify import verify_plan
from planner.runtime.verify_report import MEMORY_TOLERANCE, format_report
from planner.search import make_plan
from profiles.format import Profile
from profiles.models import BUILTIN_MODELS
from profiles.profiler import profile_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gpt2_profile() -> Profile:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PipeplanWarning)  # a busy machine: its times, not its bytes
        return profile_model(
            BUILTIN_MODELS["gpt2-tiny"](), micro_batch_sizes=(2,), repeats=1, warmup=1, min_time_s=0.0, progress=False
        )


def _plan(profile: Profile, schedule: str) -> Plan:
    request = plan_request(profile, stages=2, global_batch=8, schedule=schedule, recompute="off", calibration="none")
    return make_plan(profile, request, sha256="0" * 64)


@pytest.mark.parametrize(("schedule", "mode"), [("1f1b", "processes"), ("zbv", "processes"), ("zbv", "replay")])
def test_each_stage_runs_within_the_tolerance_of_its_predicted_memory(
    gpt2_profile: Profile, schedule: str, mode: str
) -> None:
    request = plan_request(
        gpt2_profile, stages=2, global_batch=8, schedule=schedule, recompute="off", calibration="none"
    )
    plan = make_plan(gpt2_profile, request, sha256="0" * 64)
    report = verify_plan(
        plan, "gpt2-tiny", mode=mode, steps=1, warmup=1, min_warmup_s=0.0, min_time_s=0.0, timeout_s=300
    )
    assert report.memory_tolerance == MEMORY_TOLERANCE == 0.10
    for stage in report.stages:
        assert stage.predicted_memory_bytes == plan.stages[stage.index].memory_bytes.peak
        assert stage.measured_memory is not None and stage.memory_error_pct is not None
        # Weights and optimizer state are exact: the same parameters, Adam's m and v and its step counters.
        assert stage.measured_memory.params == stage.predicted_memory.params
        assert abs(stage.measured_memory.optimizer - stage.predicted_memory.optimizer) <= 64
        assert abs(stage.memory_error_pct) <= 10.0, format_report(report)
    assert report.memory_ok
    data = report.to_dict()
    assert [s["predicted_memory_bytes"] for s in data["stages"]] == [s.memory_bytes.peak for s in plan.stages]
    assert all(s["measured_memory"]["peak"] == s["measured_memory_bytes"] for s in data["stages"])
    assert "memory per stage (predicted / measured" in format_report(report)
    if mode == "processes":
        assert len(report.rank_memory_bytes) == 2


def test_a_stage_over_its_prediction_fails_the_verdict(gpt2_profile: Profile) -> None:
    from dataclasses import replace

    plan = _plan(gpt2_profile, "1f1b")
    report = verify_plan(plan, "gpt2-tiny", mode="replay", steps=1, warmup=1, tolerance=1e9)
    assert report.memory_ok
    shrunk = replace(plan.stages[1].memory_bytes, peak=int(plan.stages[1].memory_bytes.peak * 0.8))
    tight = replace(report, stages=(report.stages[0], replace(report.stages[1], predicted_memory=shrunk)))
    assert not tight.memory_ok and not tight.ok
    assert "memory: stage 1 peaked at" in format_report(tight)
