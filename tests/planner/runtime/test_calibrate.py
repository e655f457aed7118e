"""Calibration fits (exact, synthetic), the refit of tune, and calibrate / tune end to end on gloo."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cli import main
from planner.calibration import shipped_calibration
from planner.cost import default_settings
from planner.request import PlanRequest
from planner.runtime.calibrate import CALIBRATED_SCHEDULES, _link, calibrate, fit_overhead, fit_transfer_cost
from planner.runtime.run_options import TuneOptions
from planner.runtime.tune import format_tune_table, refit_calibration, tune
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, simulate
from planner.search import make_plans, plan_key
from profiles.format import load_profile, save_profile
from synthetic import calibration, make_profile, verify_report


def test_link_fit_recovers_an_exact_alpha_beta_line() -> None:
    sizes = [4096, 65536, 524288, 4194304]
    latency, bandwidth, how = _link([(n, 1e-4 + n / 1e9) for n in sizes], "cpu")
    assert latency == pytest.approx(1e-4) and bandwidth == pytest.approx(1e9) and how.startswith("measured")


def test_one_rank_takes_the_shipped_link_and_says_so() -> None:
    latency, bandwidth, how = _link([], "cpu")
    shipped = shipped_calibration("cpu")
    assert (latency, bandwidth) == (shipped.p2p_latency_s, shipped.p2p_bytes_per_s)
    assert how.startswith("not measured (one rank)")


def test_fit_overhead_inverts_the_simulator() -> None:
    def iteration(o: float) -> float:
        return simulate(Pipeline([1, 1], [2, 2], 4, "1f1b", runtime=RuntimeTerms(action_overhead_s=o))).iteration_s

    assert fit_overhead(iteration(0.125), iteration) == pytest.approx(0.125, rel=1e-9)
    assert fit_overhead(iteration(0.0) * 0.9, iteration) == 0.0  # faster than compute alone: nothing to add


def test_refit_recovers_the_runtime_that_produced_the_measurements() -> None:
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration()
    request = PlanRequest(num_ranks=2, global_batch_size=4, settings=default_settings(profile, calibration=start))
    plans = make_plans(profile, request, sha256="0" * 64, count=3)
    true_overhead, true_scale = 4e-3, 1.25
    true_tail = 2 * plans[0].predicted.runtime.step_tail_s[0]
    runs = []
    for plan in plans:
        truth = plan.simulation(RuntimeTerms(true_overhead, (true_tail,) * plan.num_ranks, true_scale))
        runs.append((plan, verify_report(plan, truth.iteration_s, truth.busy_s, true_tail)))
    refit = refit_calibration(start, runs)
    assert refit.colocation_factor == pytest.approx(true_scale, rel=1e-6)
    for plan in plans:
        assert refit.action_overhead_s[plan.schedule.value] == pytest.approx(true_overhead, rel=1e-6)
    assert refit.optimizer["adam"].per_param_s == pytest.approx(2 * start.optimizer["adam"].per_param_s)
    assert refit.source == "refit"


def _refit_from_a_1f1b_run(start, *, overhead_s: float):
    """``start`` refit from one 1F1B run (P = 2, global batch 4) measured as the simulator predicts it with
    ``overhead_s`` per action."""
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    request = PlanRequest(
        num_ranks=2, global_batch_size=4, schedule="1f1b", settings=default_settings(profile, calibration=start)
    )
    plan = make_plans(profile, request, sha256="0" * 64, count=1)[0]
    tails = plan.predicted.runtime.step_tail_s
    truth = plan.simulation(RuntimeTerms(overhead_s, tails, 1.0))
    return refit_calibration(start, [(plan, verify_report(plan, truth.iteration_s, truth.busy_s, tails[0]))])


def test_refit_shifts_the_schedules_it_did_not_run_by_what_it_learned() -> None:
    # One 1F1B run whose actions each cost 3 ms more than the calibration said: the GPipe and interleaved
    # overheads it never ran rise by the same 3 ms (a per-action cost of the model), not by the 1F1B ratio.
    start = calibration(action_overhead_s={"gpipe": 2e-3, "1f1b": 1e-3, "interleaved-1f1b": 5e-3})
    refit = _refit_from_a_1f1b_run(start, overhead_s=4e-3)
    assert refit.action_overhead_s["1f1b"] == pytest.approx(4e-3, rel=1e-6)
    assert refit.action_overhead_s["gpipe"] == pytest.approx(5e-3, rel=1e-6)
    assert refit.action_overhead_s["interleaved-1f1b"] == pytest.approx(8e-3, rel=1e-6)


def test_refit_shifts_each_count_of_a_schedule_it_did_not_run_and_drops_the_counts_of_one_it_did() -> None:
    start = calibration(
        action_overhead_s={"gpipe": 2e-3, "1f1b": 1e-3},
        action_overhead_by_microbatches_s={"gpipe": {2: 1e-3, 4: 2e-3}, "1f1b": {2: 0.5e-3, 4: 1e-3}},
    )
    refit = _refit_from_a_1f1b_run(start, overhead_s=4e-3)
    assert refit.action_overhead_s["1f1b"] == pytest.approx(4e-3, rel=1e-6)
    assert refit.action_overhead_by_microbatches_s == {"gpipe": pytest.approx({2: 4e-3, 4: 5e-3}, rel=1e-6)}


def test_refit_takes_the_colocation_factor_from_runs_of_one_stage_per_rank() -> None:
    # A multi-stage rank's chunks are small and their per-call cost is timed as compute (tune.py): an
    # interleaved run measuring 50 % more compute must not move the factor the 1F1B run measured (1.0).
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration()
    runs = []
    for schedule, compute in (("1f1b", 1.0), ("interleaved-1f1b", 1.5)):
        request = PlanRequest(2, 4, schedule=schedule, settings=default_settings(profile, calibration=start))
        plan = make_plans(profile, request, sha256="0" * 64, count=1)[0]
        tails = plan.predicted.runtime.step_tail_s
        sim = plan.simulation(RuntimeTerms(1e-3, tails, 1.0))
        busy = tuple(b * compute for b in sim.busy_s)
        runs.append((plan, verify_report(plan, sim.iteration_s, busy, tails[0])))
    assert runs[1][0].virtual_stages == 2
    assert refit_calibration(start, runs).colocation_factor == pytest.approx(1.0, abs=1e-3)
    assert refit_calibration(start, runs[1:]).colocation_factor > 1.3  # alone, it is all there is


def test_refit_keeps_a_multi_stage_overhead_apart_where_the_calibration_has_one() -> None:
    # A calibration that learned zero-bubble with several stages a rank (multi_stage_overhead_s): a tune run of
    # such a plan refits that value, not the single-stage one.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(
        action_overhead_s={"zero-bubble": 1e-3, "1f1b": 1e-3}, multi_stage_overhead_s={"zero-bubble": 2e-3}
    )
    request = PlanRequest(2, 4, schedule="zero-bubble", settings=default_settings(profile, calibration=start))
    plan = next(p for p in make_plans(profile, request, sha256="0" * 64, count=8) if p.virtual_stages > 1)
    assert plan.predicted.runtime.action_overhead_s == 2e-3
    tails = plan.predicted.runtime.step_tail_s
    truth = plan.simulation(RuntimeTerms(5e-3, tails, 1.0))
    refit = refit_calibration(start, [(plan, verify_report(plan, truth.iteration_s, truth.busy_s, tails[0]))])
    assert refit.multi_stage_overhead_s["zero-bubble"] == pytest.approx(5e-3, rel=1e-6)
    assert refit.action_overhead_s["zero-bubble"] == 1e-3 and refit.action_overhead_s["1f1b"] == 1e-3


def test_refit_raises_the_overhead_no_further_than_the_ranks_measured_it() -> None:
    # A 1F1B run 30 % over its prediction while its ranks spent 0.4 ms per action outside compute and waits:
    # the miss is not a per-action cost; the overhead rises to twice what was measured (0.8 ms), no further.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 2e-4, "1f1b": 1e-4, "interleaved-1f1b": 5e-4})
    request = PlanRequest(2, 4, schedule="1f1b", settings=default_settings(profile, calibration=start))
    plan = make_plans(profile, request, sha256="0" * 64, count=1)[0]
    tails = plan.predicted.runtime.step_tail_s
    report = verify_report(plan, plan.predicted.iteration_s * 1.3, plan.predicted.busy_s, tails[0])
    actions = 2 * plan.num_microbatches  # one F and one B per micro-batch on each rank
    measured = replace(report, ranks=tuple(replace(r, measured_overhead_s=4e-4 * actions) for r in report.ranks))
    assert refit_calibration(start, [(plan, report)]).action_overhead_s["1f1b"] > 1e-3  # unmeasured: unbounded
    capped = refit_calibration(start, [(plan, measured)])
    assert capped.action_overhead_s["1f1b"] == pytest.approx(8e-4, rel=1e-9)
    assert capped.action_overhead_s["gpipe"] == pytest.approx(2e-4 + 7e-4, rel=1e-9)  # shifted by the same


def test_refit_from_replay_changes_nothing() -> None:
    profile = make_profile([0.01] * 4)
    start = calibration()
    request = PlanRequest(num_ranks=2, global_batch_size=2, settings=default_settings(profile, calibration=start))
    plan = make_plans(profile, request, sha256="0" * 64, count=1)[0]
    report = replace(verify_report(plan, 1.0, (1.0, 1.0), 0.0), mode="replay", ranks=())
    assert refit_calibration(start, [(plan, report)]) is start


def test_calibrate_on_two_gloo_ranks() -> None:
    cal = calibrate(2, repeats=3, steps=2, min_measure_s=0.0, timeout_s=120)
    assert (cal.device_kind, cal.backend, cal.num_ranks, cal.source) == ("cpu", "gloo", 2, "measured")
    assert set(cal.action_overhead_s) == {s.value for s, _ in CALIBRATED_SCHEDULES}
    assert all(v >= 0 for v in cal.action_overhead_s.values())
    assert cal.p2p_bytes_per_s > 0 and cal.colocation_factor > 0
    samples = cal.notes["samples"]
    assert [s for s, _ in samples["p2p_one_way_s"]] == [4096, 65536, 524288, 4194304]
    assert all(t > 0 for _, t in samples["p2p_one_way_s"])
    assert set(cal.optimizer) == {"adam", "sgd"}
    assert cal.transfer_compute_s_per_byte >= 0 and cal.notes["transfer_compute"].startswith("measured")
    assert {int(k) for k in samples["transfer_step_s"]} == {0, 4 << 20}


def test_tune_keeps_the_fastest_measured_plan(tmp_path, monkeypatch) -> None:
    from planner.runtime import tune as tune_module

    # steps rounds (the fewest) instead of half a minute: what is asserted holds for any measured times
    monkeypatch.setattr(tune_module, "INTERLEAVED_BUDGET_S", 0.0)
    profile_path = tmp_path / "tiny.profile.json"
    args = [
        "profile",
        "gpt2-tiny",
        "--micro-batch-sizes",
        "2,4",
        "--repeats",
        "1",
        "--no-progress",
        "--no-pipeline-run",
        "--min-time",
        "0",
    ]
    assert main([*args, "--out", str(profile_path)]) == 0
    profile = load_profile(profile_path)
    settings = default_settings(profile, calibration=shipped_calibration("cpu"), calibration_label="shipped")
    request = PlanRequest(num_ranks=2, global_batch_size=8, settings=settings)
    result = tune(profile, request, "gpt2-tiny", TuneOptions(candidates=2, steps=1, warmup=1), sha256="0" * 64)
    measured = [c.measured_s for c in result.candidates]
    assert len({plan_key(c.plan) for c in result.candidates}) == len(measured) >= 2
    # Two processes on this machine's cores: the candidates ran interleaved in one launch, ranked by their ratios.
    assert all(c.report.mode == "processes" for c in result.candidates)
    assert result.candidates[0].relative == 1.0 and all(c.relative > 0 for c in result.candidates)
    assert result.best.measured is not None
    fastest = min(result.candidates, key=lambda c: c.relative)
    assert plan_key(result.best) == plan_key(fastest.plan)
    assert result.best.measured.iteration_s == fastest.measured_s
    assert result.best.measured.error_pct == pytest.approx(
        (fastest.measured_s - result.best.predicted.iteration_s) / result.best.predicted.iteration_s * 100
    )
    assert "<- fastest measured" in format_tune_table(result)
    # The refit carries gpt2-tiny's own per-action cost: it says whose, so that plan can warn for another model.
    # It is refit from the two candidates measured first; a re-plan outside them is measured after it (a third).
    assert len(result.candidates) in (2, 3)
    assert result.calibration.learned_model == {
        "name": profile.model.name,
        "fingerprint": profile.model.fingerprint,
        "runs": 2,
    }
    # How fast the machine ran during each candidate (the speed reference), shown and recorded as information.
    for c in result.candidates:
        assert c.report.speed_factor is not None and c.report.speed_factor > 0
        assert f"x{c.report.speed_factor:.2f}" in format_tune_table(result)
    assert result.best.measured.speed_factor == fastest.report.speed_factor


def test_tune_ranks_candidates_by_their_interleaved_ratios_not_their_medians(monkeypatch) -> None:
    # Candidate 1's steps have the lower median over the launch (they ran in its fast minutes), but in every
    # round it ran 1.1x candidate 0: tune keeps candidate 0. The refit model's choice, new, runs in a second
    # launch beside the fastest so far (0.8x it): its place is 0.8x candidate 0's.
    from planner.runtime import tune as tune_module
    from planner.runtime.interleave import InterleavedRun

    profile = make_profile([0.01] * 6, param_counts=[1000] * 6, sizes=(1, 2))
    settings = default_settings(profile, calibration=calibration(), calibration_label="synthetic")
    request = PlanRequest(num_ranks=2, global_batch_size=4, settings=settings)
    launches = []

    def fake_verify_plans(plans, model, *, rounds, **kwargs):
        launches.append([plan_key(p) for p in plans])
        if len(launches) == 1:
            medians, rounds_s = [1.0, 0.9, 1.2], [(1.0, 2.0), (1.1, 2.2), (1.3, 2.6)]
        else:
            medians, rounds_s = [1.0, 0.8], [(1.0, 2.0), (0.8, 1.6)]
        reports = tuple(verify_report(p, m, (m / 2, m / 2), 0.0) for p, m in zip(plans, medians, strict=True))
        return InterleavedRun(reports, tuple(rounds_s[: len(plans)]))

    pool = make_plans(profile, request, sha256="0" * 64, count=4)
    searches = iter([pool[:3], pool[3:]])  # the candidates; then the refit model's choice, one not yet run
    monkeypatch.setattr(tune_module, "make_plans", lambda *args, **kwargs: next(searches))
    monkeypatch.setattr(tune_module, "verify_plans", fake_verify_plans)
    monkeypatch.setattr(tune_module, "pick_mode", lambda mode, plan, device: "processes")
    result = tune(profile, request, "mlp", TuneOptions(candidates=3), sha256="0" * 64)
    keys = [plan_key(p) for p in pool]
    assert launches == [keys[:3], [keys[0], keys[3]]]
    assert [c.relative for c in result.candidates] == pytest.approx([1.0, 1.1, 1.3, 0.8])
    assert plan_key(result.best) == keys[3] and result.best.measured.iteration_s == 0.8
    assert "vs #0" in format_tune_table(result)
    # Without the refit model's choice, candidate 0, though candidate 1's median was lower.
    launches.clear()
    searches = iter([pool[:3], pool[:1]])
    result = tune(profile, request, "mlp", TuneOptions(candidates=3), sha256="0" * 64)
    assert len(launches) == 1 and plan_key(result.best) == keys[0]


def test_tune_refuses_to_start_without_a_calibration(tmp_path, capsys) -> None:
    profile = tmp_path / "p.json"
    save_profile(make_profile([0.01] * 4), profile)
    code = main(["tune", str(profile), "--model", "mlp", "--stages", "2", "--global-batch", "4", "--calibration",
                 "none", "--out", str(tmp_path / "plan.json")])  # fmt: skip
    assert code == 2
    assert "tune refits a calibration" in capsys.readouterr().err
    assert not (tmp_path / "plan.json").exists()


def test_fit_transfer_cost_recovers_the_compute_per_byte_behind_a_slowdown() -> None:
    # Steps the simulator's own model makes: 1F1B, 2 ranks, F = 10 ms, B = 20 ms, a 4 MB tensor each way on a
    # 1 GB/s link with 0.1 ms latency, and 0.5 ns of compute per byte sent or received.
    latency, bandwidth, per_byte, size = 1e-4, 1e9, 0.5e-9, 4_000_000

    def step_s(num_bytes: int, cost: float) -> float:
        link = [latency + num_bytes / bandwidth]
        return simulate(
            Pipeline(
                [0.01, 0.01],
                [0.02, 0.02],
                4,
                "1f1b",
                comm_forward_s=link,
                comm_backward_s=link,
                runtime=RuntimeTerms(transfer_compute_s_per_byte=cost),
                cut_forward_bytes=[num_bytes],
                cut_backward_bytes=[num_bytes],
            ),
        ).iteration_s

    times = {0: [step_s(0, 0.0)] * 3, size: [step_s(size, per_byte)] * 3}
    assert fit_transfer_cost(times, 2, latency, bandwidth) == pytest.approx(per_byte, rel=1e-6)
    no_slower = {0: times[0], size: [step_s(size, 0.0)] * 3}  # the link alone explains it
    assert fit_transfer_cost(no_slower, 2, latency, bandwidth) == pytest.approx(0.0, abs=1e-15)
