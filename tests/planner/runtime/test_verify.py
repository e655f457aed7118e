"""verify_plan end to end (processes and replay) and the report's arithmetic."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import make_plan
from torch import nn

from planner.errors import PipeplanWarning, UsageError
from planner.runtime import verify
from planner.runtime.rank_timing import _StageTimer
from planner.runtime.run_options import VerifyOptions
from planner.runtime.verify import compare_numerics, format_report, reference_step, verify_plan
from planner.runtime.verify_report import (
    NumericsReport,
    RankTime,
    StageReport,
    VerifyReport,
    contention_change,
    mismatch_reason,
)
from profiles.models import BUILTIN_MODELS
from profiles.workload import Workload

torch.set_num_threads(1)


def dropout_mlp() -> Workload:
    """A model whose every run differs (dropout on): the numerics check must catch it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(n)
        return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)

    return Workload(model, make_batch, nn.functional.mse_loss, "dropout-mlp", ("0", "1", "2"))


def _assert_measured(report: VerifyReport, plan) -> None:
    assert len(report.stages) == plan.num_stages
    for s in report.stages:
        for value in (s.measured_forward_s, s.measured_backward_s):
            assert math.isfinite(value) and value > 0
        assert s.measured_memory is not None and s.measured_memory.peak > 0
        assert s.measured_memory.params > 0 and s.measured_memory.grads > 0 and s.measured_memory.optimizer > 0
        assert math.isfinite(s.error_pct)
    assert math.isfinite(report.measured_iteration_s) and report.measured_iteration_s > 0
    assert len(report.busy_s) == plan.num_ranks and all(b > 0 for b in report.busy_s)
    # An iteration runs every stage's work, so it cannot be shorter than the busiest rank.
    assert report.measured_iteration_s >= max(report.busy_s) * 0.999
    json.dumps(report.to_dict())
    assert "iteration: predicted" in format_report(report)


def test_processes_mode_gpt2_1f1b_with_numerics() -> None:
    plan = make_plan(BUILTIN_MODELS["gpt2-tiny"](), ["transformer.h.2"], "1f1b")
    report = verify_plan(
        plan,
        "gpt2-tiny",
        VerifyOptions(mode="processes", steps=2, warmup=1, check_numerics=True, timeout_s=180, tolerance=0.25),
    )
    assert report.mode == "processes" and report.memory_kind == "live-tensors"
    _assert_measured(report, plan)
    assert report.numerics is not None and report.numerics.ok
    assert report.numerics.max_grad_abs_diff < 1e-6
    # Where the time went: the optimizer step is inside the timed iteration, on every rank, and the
    # parts measured apart never add up to more than the iteration they were measured in.
    assert report.optimizer == "adam" and [r.rank for r in report.ranks] == [0, 1]
    for r in report.ranks:
        assert r.measured_tail_s > 0 and r.measured_wait_s >= 0 and r.measured_overhead_s >= 0
        assert r.measured_compute_s == report.busy_s[r.rank]
        assert r.measured_compute_s + r.measured_wait_s + r.measured_tail_s <= report.measured_iteration_s * 1.001
    assert "step tail = gradient scaling + tied-gradient sum + adam step" in format_report(report)
    # The plan holds no speed reference (made without a profile): the run times one, nothing to compare to.
    assert report.reference_s is not None and report.reference_s > 0 and report.speed_factor is None


def test_stage_timer_puts_the_gradient_scaling_apart_from_the_stage_times() -> None:
    # torch's schedules scale the gradients at the end of step (perform_reduce_grad); the cost model counts
    # that in the step tail, so verify records it as its own kind and the stage's times leave it out.
    class FakeStage:
        def forward_one_chunk(self) -> None:
            time.sleep(0.01)

        def backward_one_chunk(self) -> None:
            time.sleep(0.02)

        def backward_weight_one_chunk(self) -> None:
            pass

        def perform_reduce_grad(self, factor: int) -> None:
            time.sleep(0.05)

    stage = FakeStage()
    timer = _StageTimer(stage, torch.device("cpu"))
    stage.forward_one_chunk()
    stage.backward_one_chunk()
    stage.perform_reduce_grad(2)
    kinds = [kind for kind, _ in timer.records]
    assert kinds == ["F", "B", "R"]
    assert timer.records[2][1] >= 0.05
    # The stage's times are its own F and B records, the scaling's R left out.
    assert verify._stage_times(timer.records) == (timer.records[0][1], timer.records[1][1])


def test_processes_mode_warms_up_and_times_for_the_time_floors_then_as_asked() -> None:
    # mlp's step takes milliseconds: a floor needs many steps beyond the one asked for; with no floor,
    # exactly the steps asked for. Every rank runs as many (rank 0 decides), or the barriers would hang.
    # The warm-up's floor is the longer: a fresh rank's first step alone took over 0.5 s on a busy machine.
    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "1f1b")
    floored = verify_plan(
        plan,
        "mlp",
        VerifyOptions(
            mode="processes", steps=1, warmup=1, min_warmup_s=1.5, min_time_s=0.5, timeout_s=180, tolerance=0.25
        ),
    )
    assert floored.warmup > 2 and f"after {floored.warmup} warm-up" in format_report(floored)
    assert floored.steps > 2 and f"{floored.steps} timed steps" in format_report(floored)
    exact = verify_plan(
        plan,
        "mlp",
        VerifyOptions(
            mode="processes", steps=2, warmup=3, min_warmup_s=0.0, min_time_s=0.0, tolerance=0.25, timeout_s=300.0
        ),
    )
    assert (exact.warmup, exact.steps) == (3, 2)


@pytest.mark.parametrize(
    ("model", "splits", "schedule"),
    [
        ("gpt2-tiny", ["transformer.h.1", "transformer.h.2", "transformer.h.3"], "interleaved-1f1b"),
        ("unet-small", ["mid"], "gpipe"),
    ],
)
def test_replay_mode_measures_every_stage(model: str, splits: list[str], schedule: str) -> None:
    plan = make_plan(BUILTIN_MODELS[model](), splits, schedule)
    report = verify_plan(
        plan,
        model,
        VerifyOptions(mode="replay", steps=2, warmup=1, check_numerics=True, tolerance=0.25, timeout_s=300.0),
    )
    assert report.mode == "replay" and report.memory_kind == "live-tensors"
    _assert_measured(report, plan)
    assert report.numerics is not None and report.numerics.ok
    assert "simulated from measured stage times" in format_report(report)


def test_replay_times_the_speed_reference_and_scales_the_stages_by_it() -> None:
    plan = make_plan(BUILTIN_MODELS["unet-small"](), ["mid"], "gpipe")
    plan = replace(plan, device={**plan.device, "reference_s": 1e-3})
    report = verify_plan(
        plan, "unet-small", VerifyOptions(mode="replay", steps=2, warmup=1, tolerance=0.25, timeout_s=300.0)
    )
    assert report.profile_reference_s == 1e-3 and report.reference_s is not None and report.reference_s > 0
    factor = report.reference_s / 1e-3
    assert report.speed_factor == pytest.approx(factor)
    # Replay keeps the plan's runtime terms: only the stage times scale.
    assert report.speed_adjusted_iteration_s == pytest.approx(plan.simulation(speed=factor).iteration_s)
    assert "machine speed: the speed reference ran" in format_report(report)


def test_ranks_time_their_units_alone_and_together_and_the_prediction_takes_the_change_of_co_location() -> None:
    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "1f1b")
    device = {**plan.device, "reference_s": 1e-3, "unit_sum_s": 2e-3, "capture": "export"}
    learned = replace(plan, device={**device, "units_together_ratio": 1.25})
    report = verify_plan(
        learned,
        "mlp",
        VerifyOptions(
            mode="processes", steps=2, warmup=1, min_warmup_s=0.0, min_time_s=0.0, tolerance=0.25, timeout_s=300.0
        ),
    )
    assert report.reference == "units" and report.learned_together_ratio == 1.25
    assert report.reference_s and report.reference_together_s and report.reference_together_s > 0
    ratio = report.reference_together_s / report.reference_s
    assert report.units_together_ratio == pytest.approx(ratio)
    change = max(ratio, 1.0) / 1.25  # together faster than alone is noise: 1
    assert report.colocation_change == pytest.approx(change)
    # Every compute time at the machine's speed and at the ranks' contention now against then.
    speed = report.reference_s / 2e-3 * change
    terms = learned.predicted.runtime.at_speed(speed)
    assert report.speed_adjusted_iteration_s == pytest.approx(learned.simulation(terms, speed=speed).iteration_s)
    assert f"({1.25:.2f}x when the co-location factor was learned)" in format_report(report)
    assert report.to_dict()["colocation_change"] == pytest.approx(change)
    # A plan whose co-location factor was not learned with the ratio: measured and shown, not applied.
    unlearned = replace(report, learned_together_ratio=None)
    assert unlearned.colocation_change is None and unlearned.units_together_ratio == pytest.approx(ratio)
    assert "not learned with it: not applied" in format_report(unlearned)


@pytest.mark.parametrize(
    ("now", "then", "change"),
    [
        (1.33, 1.02, 1.33 / 1.02),  # a spell of contention the profile did not see: the prediction slows
        (1.03, 1.15, 1.03 / 1.15),  # less contention than while learning: it speeds up
        (0.92, 1.04, 1.0 / 1.04),  # together faster than alone is noise: 1
        (0.98, 0.95, 1.0),
    ],
)
def test_the_change_of_contention_counts_a_together_over_alone_ratio_below_1_as_1(
    now: float, then: float, change: float
) -> None:
    assert contention_change(now, then) == pytest.approx(change)


@pytest.mark.parametrize("capture", ["export", "hooks"])
def test_replay_times_the_units_where_the_plan_recorded_their_profiled_sum(capture: str) -> None:
    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "1f1b")
    plan = replace(plan, device={**plan.device, "reference_s": 1e-3, "unit_sum_s": 2e-3, "capture": capture})
    report = verify_plan(
        plan,
        "mlp",
        VerifyOptions(mode="replay", steps=3, warmup=1, check_numerics=True, tolerance=0.25, timeout_s=300.0),
    )
    assert report.reference == "units" and report.profile_reference_s == 2e-3
    assert report.reference_s is not None and report.reference_s > 0
    assert report.speed_factor == pytest.approx(report.reference_s / 2e-3)
    assert report.speed_adjusted_iteration_s == pytest.approx(plan.simulation(speed=report.speed_factor).iteration_s)
    assert report.verdict_basis == "at the machine's speed"
    # The units captured before the split into stages leave the stages computing as before.
    assert report.numerics is not None and report.numerics.ok
    assert "machine speed: the model's units (one micro-batch forward+backward each, added up) ran" in (
        format_report(report)
    )
    # Without the profile's capture the plan names no way to build the same piece: the layer stands in.
    layer = verify_plan(
        replace(plan, device={**plan.device, "capture": None}),
        "mlp",
        VerifyOptions(mode="replay", steps=1, warmup=2, tolerance=0.25, timeout_s=300.0),
    )
    assert layer.reference == "layer" and layer.profile_reference_s == 1e-3


def test_processes_ranks_time_their_own_units_and_their_sum_is_the_speed_reference() -> None:
    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "1f1b")
    plan = replace(plan, device={**plan.device, "reference_s": 1e-3, "unit_sum_s": 2e-3, "capture": "hooks"})
    report = verify_plan(
        plan,
        "mlp",
        VerifyOptions(mode="processes", steps=2, warmup=1, check_numerics=True, timeout_s=180, tolerance=0.25),
    )
    assert report.reference == "units" and report.profile_reference_s == 2e-3
    assert report.reference_s is not None and report.reference_s > 0
    assert report.speed_factor == pytest.approx(report.reference_s / 2e-3)
    assert report.verdict_basis == "at the machine's speed"
    # The reference's backward ran on the stages' own weights between steps: the step's gradients stay exact.
    assert report.numerics is not None and report.numerics.ok
    assert "machine speed: the model's units" in format_report(report)


def test_a_rank_times_the_units_of_its_own_stages_with_the_loss_where_it_holds_the_last() -> None:
    from planner.runtime.rank_timing import own_unit_reference
    from profiles.model_reference import unit_pieces

    workload = BUILTIN_MODELS["mlp"]()
    # zbv: 4 stages in a V on 2 ranks, rank 0 holds stages 0 and 3 (the model's first and last units).
    plan = make_plan(workload, ["layers.1", "layers.2", "layers.3"], "zbv")
    inputs, target = workload.make_batch(plan.micro_batch_size)
    pieces = unit_pieces(workload.model, (inputs,), "hooks", list(workload.units or ()))
    cpu = torch.device("cpu")
    first = own_unit_reference(plan, pieces, target, (0, 3), workload.loss_fn, cpu)
    second = own_unit_reference(plan, pieces, target, (1, 2), workload.loss_fn, cpu)
    assert [p.name for p in first.pieces] == ["layers.0", "layers.3", "head"] and first.loss_fn is workload.loss_fn
    assert [p.name for p in second.pieces] == ["layers.1", "layers.2"] and second.loss_fn is None
    assert first.time_once() > 0 and second.time_once() > 0


def test_the_run_sums_the_ranks_units_and_takes_the_median_of_their_layers() -> None:
    from planner.runtime.rank_timing import RankResult
    from planner.runtime.verify import _speed_reference

    def rank(reference_s: float | None, reference: str) -> RankResult:
        one = (1.0,)
        return RankResult((0,), 0, 1, 1, ((),), one, one, (0.0,), (0.0,), one, reference_s, reference=reference)

    units = [rank(2.0, "units"), rank(3.0, "units")]
    assert _speed_reference(units, units) == (5.0, "units")
    layers = [rank(2.0, "layer"), rank(4.0, "layer"), rank(9.0, "layer")]
    assert _speed_reference(layers, layers) == (4.0, "layer")
    # One rank without its units (none timed): the sum would be of part of the model, so no units at all.
    assert _speed_reference([rank(2.0, "units"), rank(None, "units")], []) == (None, "layer")


def test_numerics_check_catches_a_model_that_differs() -> None:
    workload = dropout_mlp()
    plan = make_plan(workload, ["2"], "gpipe")
    report = verify_plan(
        plan,
        workload,
        VerifyOptions(mode="replay", steps=1, warmup=0, check_numerics=True, tolerance=1e9, timeout_s=300.0),
    )
    assert report.numerics is not None and not report.numerics.ok
    assert not report.ok  # timing is within the huge tolerance: numerics alone fail it
    assert "numerics: MISMATCH" in format_report(report)


def test_compare_numerics_flags_one_perturbed_gradient() -> None:
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"])
    loss, grads = reference_step(workload, plan)
    assert compare_numerics(loss, grads, loss, dict(grads)).ok
    bad = dict(grads)
    bad["head.bias"] = grads["head.bias"] + 1e-3
    result = compare_numerics(loss, grads, loss, bad)
    assert not result.ok and result.worst_parameter == "head.bias"
    assert result.max_grad_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert not compare_numerics(loss, grads, loss + 1e-3, grads).ok
    missing = {k: v for k, v in grads.items() if k != "head.weight"}
    assert not compare_numerics(loss, grads, loss, missing).ok


def _report(measured_iteration_s: float, stage_times: list[tuple[float, float]]) -> VerifyReport:
    stages = tuple(StageReport(i, i, 1.0, 2.0, f, b) for i, (f, b) in enumerate(stage_times))
    return VerifyReport(
        "processes", "gpipe", 2, 4, 3, 1, 0.25, 10.0, measured_iteration_s, (1.0, 1.0), stages, "live-tensors"
    )


def test_report_error_and_worst_stage() -> None:
    report = _report(12.0, [(1.0, 2.0), (1.5, 3.0)])
    assert report.iteration_error_pct == pytest.approx(20.0)
    assert report.ok
    assert report.stages[1].error_pct == pytest.approx(50.0)
    assert report.worst_stage == 1
    assert not _report(13.0, [(1.0, 2.0), (0.5, 1.0)]).ok  # +30 % > 25 %
    assert _report(8.0, [(1.0, 2.0), (0.5, 1.0)]).worst_stage == 1  # -50 % beats 0 %
    failed = VerifyReport(**{**report.__dict__, "numerics": NumericsReport(False, 0.0, 1.0, "w")})
    assert not failed.ok
    assert report.to_dict()["worst_stage"] == 1


def _documented_fields(table: str) -> set[str]:
    """The backticked names in the first column of a markdown table (``a``, ``b`` both count)."""
    fields: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            fields.update(re.findall(r"`([a-z_]+)`", line.split(" | ")[0]))
    return fields


def test_docs_verify_format_lists_every_field_the_report_writes() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "verify-format.md").read_text()
    top, rest = doc.split("## `stages[]`")
    stages, ranks = rest.split("## `ranks[]`")
    ranks = ranks.split("## Under `torchrun`")[0]  # the job's sections: tests/planner/runtime/test_torchrun.py
    rank = RankTime(0, 1.0, 0.5, 0.1, 0.0, 1.1, 0.4, 0.1, 0.05)
    report = replace(_report(12.0, [(1.0, 2.0)]), ranks=(rank,), numerics=NumericsReport(True, 0.0, 0.0, "w"))
    data = report.to_dict()
    assert _documented_fields(top) == set(data)
    assert _documented_fields(stages) == set(data["stages"][0])
    assert _documented_fields(ranks) == set(data["ranks"][0])
    assert set(re.findall(r"`([a-z_]+)`", top)) >= set(data["numerics"])
    assert json.loads(json.dumps(data))["verdict_basis"] == "as timed"


def test_a_mismatch_says_which_side_of_the_model_is_off() -> None:
    # Predicted stages: 1.0 + 2.0 s each; iteration predicted 10 s, tolerance 25 %.
    assert mismatch_reason(_report(12.0, [(1.5, 3.0), (1.5, 3.0)])) is None  # within tolerance: nothing to say
    slow = _report(13.0, [(1.5, 3.0), (1.6, 3.2)])
    assert mismatch_reason(slow).startswith("every stage computed 50-60 % slower than profiled")
    assert "why: every stage computed" in format_report(slow)
    assert slow.to_dict()["mismatch_reason"] == mismatch_reason(slow)
    assert "outside compute" in mismatch_reason(_report(13.0, [(1.0, 2.0), (1.1, 2.0)]))
    assert mismatch_reason(_report(7.0, [(1.0, 2.0), (2.0, 4.0)])).startswith("stage 1 is off most (+100.0 %)")
    assert mismatch_reason(_report(7.0, [(0.5, 1.0), (0.5, 1.0)])).startswith("every stage computed 50 % faster")


def test_the_verdict_takes_the_error_the_machines_speed_explains_and_prints_both() -> None:
    # The plan predicts 10 s; the run measured 13 s (+30 %, over 25 %) while the speed reference ran 1.2x
    # slower than while profiling, where the plan with its compute at that speed predicts 12 s (+8.3 %).
    slow = _report(13.0, [(1.5, 3.0), (1.6, 3.2)])
    adjusted = replace(slow, reference_s=0.006, profile_reference_s=0.005, speed_adjusted_iteration_s=12.0)
    assert slow.speed_factor is None and slow.speed_adjusted_error_pct is None
    assert adjusted.speed_factor == pytest.approx(1.2)
    assert adjusted.speed_adjusted_error_pct == pytest.approx(100 / 12)
    # +30 % as timed, +8.3 % at the machine's speed: the reference explains the rest, and the verdict says so.
    assert adjusted.iteration_error_pct == pytest.approx(30.0) and not slow.ok
    assert adjusted.ok and adjusted.verdict_basis == "at the machine's speed"
    assert adjusted.verdict_error_pct == pytest.approx(100 / 12) and mismatch_reason(adjusted) is None
    text = format_report(adjusted)
    assert "the speed reference ran 1.20x slower than while profiling (6.00 ms vs 5.00 ms)" in text
    assert "the plan with its compute at that speed: 12000.000 ms (+8.3%)" in text
    assert "verdict: the error at the machine's speed, +8.3%, within 25% (as timed +30.0%)" in text
    assert adjusted.to_dict()["speed_factor"] == pytest.approx(1.2)
    assert adjusted.to_dict()["verdict_basis"] == "at the machine's speed"
    assert "this machine runs at another speed" in mismatch_reason(slow)
    assert "verdict: the error as timed, +30.0% (no speed reference" in format_report(slow)
    # The reference says 1.25x faster: at that speed the run is further off (+62.5 %); as timed decides, and
    # fails: an error the reference does not explain is never hidden.
    faster = replace(adjusted, reference_s=0.004, speed_adjusted_iteration_s=8.0)
    assert faster.verdict_basis == "as timed" and not faster.ok
    assert "the machine runs 1.25x faster than when the profile was made" in mismatch_reason(faster)
    assert "verdict: neither error is within 25% (as timed +30.0%, at the machine's speed +62.5%)" in format_report(
        faster
    )
    # Within as timed while the reference moved: the error as timed decides (the smaller).
    calm = replace(
        _report(10.2, [(1.0, 2.0), (1.0, 2.0)]),
        reference_s=0.006,
        profile_reference_s=0.005,
        speed_adjusted_iteration_s=12.0,
    )
    assert calm.ok and calm.verdict_basis == "as timed" and calm.verdict_error_pct == pytest.approx(2.0)


def test_with_the_models_units_as_reference_the_error_at_their_speed_decides_alone() -> None:
    # A replay timed the model's units 1.2x slower than its profile (7.2 vs 6.0 s): at that speed the plan
    # predicts 12 s. Measured 10.2 s is +2.0 % as timed but -15.0 % at the units' speed: the smaller error
    # would pass it, and the units' own speed says the stages ran faster than they add up to, so it fails.
    calm = replace(
        _report(10.2, [(1.0, 2.0), (1.0, 2.0)]),
        reference_s=7.2,
        profile_reference_s=6.0,
        speed_adjusted_iteration_s=12.0,
        reference="units",
        tolerance=0.10,
    )
    assert calm.verdict_basis == "at the machine's speed" and calm.verdict_error_pct == pytest.approx(-15.0)
    assert not calm.ok
    text = format_report(calm)
    assert "machine speed: the model's units (one micro-batch forward+backward each, added up) ran 1.20x slower" in text
    assert "(7.200 s vs 6.000 s)" in text
    assert "verdict: the error at the machine's speed, -15.0%, outside 10% (as timed +2.0%)" in text
    # At 13 s, +30 % as timed and +8.3 % at the model's speed: within.
    slow = replace(calm, measured_iteration_s=13.0, tolerance=0.25)
    assert slow.ok and "verdict: the error at the machine's speed, +8.3%, within 25% (as timed +30.0%)" in (
        format_report(slow)
    )
    assert slow.to_dict()["reference"] == "units"


def test_a_report_at_the_profiles_speed_divides_every_measured_time_by_the_speed_factor() -> None:
    plain = _report(13.0, [(1.2, 2.4), (1.5, 3.0)])
    assert plain.at_profile_speed() is plain  # no speed measured: nothing to divide by
    rank = verify.RankTime(0, 1.0, 2.0, 3.0, 4.0, 2.0, 4.0, 6.0, 8.0)
    slow = replace(plain, reference_s=0.006, profile_reference_s=0.004, speed_adjusted_iteration_s=15.0, ranks=(rank,))
    at = slow.at_profile_speed()
    assert at.measured_iteration_s == pytest.approx(13.0 / 1.5) and at.busy_s == pytest.approx((1 / 1.5, 1 / 1.5))
    stage_times = [t for s in at.stages for t in (s.measured_forward_s, s.measured_backward_s)]
    assert stage_times == pytest.approx([0.8, 1.6, 1.0, 2.0])
    r = at.ranks[0]
    assert (r.measured_compute_s, r.measured_wait_s, r.measured_tail_s, r.measured_overhead_s) == pytest.approx(
        (2 / 1.5, 4 / 1.5, 6 / 1.5, 8 / 1.5)
    )
    assert (r.predicted_compute_s, at.predicted_iteration_s) == (1.0, 10.0)  # predictions stay
    assert at.speed_factor == 1.0 and at.speed_adjusted_error_pct == pytest.approx(at.iteration_error_pct)


def test_auto_mode_falls_back_to_replay_with_few_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"])
    monkeypatch.setattr(verify.os, "cpu_count", lambda: 1)
    assert verify.pick_mode("auto", plan, "cpu") == "replay"
    monkeypatch.setattr(verify.os, "cpu_count", lambda: 2)
    assert verify.pick_mode("auto", plan, "cpu") == "processes"


def test_replay_runs_with_the_profilers_allocator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The profiler keeps freed memory (profiles/allocator.py); a replay that did not measured GPT-2's LM head
    # backward 1.5x its profiled time at micro-batch 4 (README, "What the main job prints").
    import profiles.allocator

    calls: list[bool] = []
    monkeypatch.setattr(profiles.allocator, "keep_freed_memory", lambda: calls.append(True) or True)
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"], "gpipe")
    verify_plan(plan, workload, VerifyOptions(mode="replay", steps=1, warmup=0, tolerance=1e9, timeout_s=300.0))
    assert calls == [True]


def test_replay_runs_with_the_threads_of_the_plans_profile() -> None:
    # A profile made with --ranks 2 on 2 cores times every unit on 1 thread; replayed on 2, gpt2-small's
    # stages ran 43-45 % under their prediction. The replay takes the plan's recorded threads, then restores.
    workload = BUILTIN_MODELS["mlp"]()
    seen: list[int] = []
    loss_fn = workload.loss_fn

    def counting_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return loss_fn(output, target)

    workload = replace(workload, loss_fn=counting_loss)
    plan = make_plan(workload, ["layers.2"], "gpipe")
    before = torch.get_num_threads()
    threads = 2 if before == 1 else 1
    plan = replace(plan, device={"kind": "cpu", "name": "test", "dtype": "float32", "threads": threads})
    verify_plan(plan, workload, VerifyOptions(mode="replay", steps=1, warmup=0, tolerance=1e9, timeout_s=300.0))
    assert seen and set(seen) == {threads}
    assert torch.get_num_threads() == before


def test_ranks_get_the_threads_the_plan_was_timed_with_or_the_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 ranks on 4 cores: a plan timed on 1 thread per rank runs on 1 each (not the launcher's 2), one timed
    # on 2 on 2; one timed on 4 would need 8 cores: refused, not run at other threads than predicted.
    monkeypatch.setattr(verify.os, "cpu_count", lambda: 4)
    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"])
    one = replace(plan, device={"kind": "cpu", "name": "test", "dtype": "float32", "threads": 1})
    assert verify.rank_thread_count(one, "auto", "cpu") == 1
    assert verify.rank_thread_count(replace(one, device={**one.device, "threads": 2}), "auto", "cpu") == 2
    four = replace(one, device={**one.device, "threads": 4})
    with pytest.raises(UsageError, match=r"2 ranks x 4 threads need 8 cores and this machine has 4"):
        verify.rank_thread_count(four, "processes", "cpu")
    assert verify.rank_thread_count(four, "replay", "cpu") is None  # replay takes the profile's threads
    # 8 ranks timed on 1 thread each on 4 cores: nothing to correct; they run, sharing the cores, with a warning.
    eight = replace(one, num_ranks=8)
    with pytest.warns(PipeplanWarning, match="8 ranks share 4 cores"):
        assert verify.rank_thread_count(eight, "processes", "cpu") == 1
    assert verify.rank_thread_count(plan, "auto", "cpu") is None  # an older plan does not say: cores // ranks


@pytest.mark.parametrize("mode", ["replay", "processes"])
def test_the_loss_counts_in_the_last_stages_forward(mode: str) -> None:
    # The profile times the loss with the last unit; torch computes it right after the last stage's
    # forward, outside forward_one_chunk. verify must count it there too, not as overhead.
    from pathlib import Path

    import sleepy_loss

    spec = f"{Path(sleepy_loss.__file__)}:workload"
    plan = make_plan(sleepy_loss.workload(), ["2"], "1f1b")
    report = verify_plan(plan, spec, VerifyOptions(mode=mode, steps=1, warmup=1, tolerance=1e9, timeout_s=180))
    first, last = report.stages
    assert last.measured_forward_s >= sleepy_loss.LOSS_SLEEP_S
    assert first.measured_forward_s < sleepy_loss.LOSS_SLEEP_S / 3
    if mode == "processes":
        rank = report.ranks[1]  # the last stage's rank runs M losses a step, all inside its compute
        assert rank.measured_compute_s >= plan.num_microbatches * sleepy_loss.LOSS_SLEEP_S
        assert rank.measured_overhead_s < sleepy_loss.LOSS_SLEEP_S


def test_predicted_tails_include_the_wait_for_a_tied_partner() -> None:
    # GPipe over two stages: rank 1's last backward ends before rank 0's, so with a tied pair its predicted
    # tail (as verify measures one: last action to end of optimizer step) holds the wait in the all-reduce.
    from dataclasses import replace

    from planner.schedule.simulate import RuntimeTerms

    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "gpipe", num_microbatches=1, micro_batch_size=8)
    alone = replace(plan.predicted, runtime=RuntimeTerms(step_tail_s=(0.004, 0.004)))
    assert verify.predicted_tails(replace(plan, predicted=alone)) == (0.004, 0.004)
    tied = replace(alone, runtime=RuntimeTerms(step_tail_s=(0.004, 0.004), tail_groups=((0, 1),)))
    tails = verify.predicted_tails(replace(plan, predicted=tied))
    # Rank 0 finishes last (its backward follows rank 1's): rank 1 waits for rank 0's backward, 2 ms here.
    assert tails[0] == pytest.approx(0.004)
    assert tails[1] == pytest.approx(0.004 + 0.002)


def test_a_report_reads_back_from_its_json_and_show_prints_it(tmp_path: Path, capsys) -> None:
    from cli import main
    from cli_checks import assert_fails
    from planner.cost import MemoryBreakdown
    from planner.runtime.verify_report import report_from_dict

    memory = MemoryBreakdown(100, 100, 200, 300, 50, 750, buffers=0)
    rank = RankTime(0, 1.0, 0.5, 0.1, 0.0, 1.1, 0.4, 0.1, 0.05)
    base = _report(12.0, [(1.0, 2.0), (1.5, 2.5)])
    stages = tuple(replace(s, predicted_memory=memory, measured_memory=memory, capacity_bytes=1e3) for s in base.stages)
    report = replace(base, stages=stages, ranks=(rank,), numerics=NumericsReport(True, 0.0, 0.0, "w"), reference_s=0.01)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["format"] == "pipeplan.verify-report"
    assert report_from_dict(data) == report
    older = {k: v for k, v in data.items() if k != "format"}
    assert report_from_dict(older) == report
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out.strip() == format_report(report).strip()
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**data, "stages": [{"index": 0}]}))
    assert_fails(capsys, ["show", broken], "not a verify report")
