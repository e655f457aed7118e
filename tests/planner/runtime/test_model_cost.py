"""`pipeplan calibrate --model`: a model's own per-action cost learned from runs of it (1F1B's, or every schedule's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cli import main
from planner.assemble import profiled_device
from planner.calibration import calibration_from_dict, load_calibration, shipped_calibration
from planner.cost import default_settings
from planner.errors import UsageError
from planner.plan import load_plan
from planner.prediction import repredicted_plan
from planner.runtime.model_cost import (
    EVERY_SCHEDULE_BELOW_S,
    default_global_batch,
    learn_from_run,
    learn_from_runs,
    learning_plan,
    learning_plans,
)
from planner.schedule.orders import Schedule
from planner.schedule.simulate import RuntimeTerms
from profiles.format import load_profile, save_profile
from synthetic import calibration, make_profile, verify_report


def test_the_run_it_learns_from_is_the_planners_1f1b_plan_for_the_calibrations_ranks() -> None:
    profile = make_profile([0.01] * 6, sizes=(1, 2))
    plan = learning_plan(profile, calibration(), default_global_batch(profile, 2), sha256="0" * 64)
    assert (plan.schedule.value, plan.num_ranks) == ("1f1b", 2)
    assert plan.micro_batch_size * plan.num_microbatches == 2 * 2 * 2
    pinned = learning_plan(profile, calibration(), 8, sha256="0" * 64, micro_batch_size=1)
    assert (pinned.micro_batch_size, pinned.num_microbatches) == (1, 8)
    with pytest.raises(UsageError, match="at least 2 ranks"):
        learning_plan(profile, calibration(num_ranks=1), 4, sha256="0" * 64)


def test_a_short_model_learns_every_schedule_at_the_largest_size_that_fits() -> None:
    # Sizes scale the compute exactly, so the planner's 1F1B plan takes b = 1 (its bubble is smallest there);
    # 16 MiB saved per sample and unit: b = 4 holds more than 200 MiB on a stage, b = 2 less.
    heavy = make_profile([0.001] * 6, sizes=(1, 2, 4), saved_bytes=[16 << 20] * 6, memory_bytes=200 << 20)
    assert learning_plan(heavy, calibration(), 16, sha256="0" * 64).micro_batch_size == 1
    plans = learning_plans(heavy, calibration(), 16, sha256="0" * 64, every_schedule=True)
    assert (plans[0].schedule, plans[0].micro_batch_size, plans[0].num_microbatches) == (Schedule.ONE_F_ONE_B, 2, 8)
    assert {p.micro_batch_size for p in plans if p.schedule is not Schedule.ONE_F_ONE_B} == {2}
    # A long one learns from the planner's own 1F1B plan, then 1F1B's at the other sizes that fit, at the same
    # global batch.
    long = learning_plans(heavy, calibration(), 16, sha256="0" * 64, every_schedule=False)
    assert long[0] == learning_plan(heavy, calibration(), 16, sha256="0" * 64)
    assert [(p.schedule, p.micro_batch_size, p.num_microbatches) for p in long[1:]] == [(Schedule.ONE_F_ONE_B, 2, 8)]
    # At a smaller batch where asked (calibrate's default for a long model: as many of the largest size as ranks),
    # which a short model's runs ignore.
    halved = learning_plans(heavy, calibration(), 16, sha256="0" * 64, every_schedule=False, long_global_batch=8)
    assert [(p.micro_batch_size, p.num_microbatches) for p in halved] == [(1, 8), (2, 4)]
    again = learning_plans(heavy, calibration(), 16, sha256="0" * 64, every_schedule=True, long_global_batch=8)
    assert again == plans


def test_learning_from_a_run_shifts_every_schedule_and_names_the_model() -> None:
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 2e-3, "1f1b": 1e-3, "interleaved-1f1b": 5e-3})
    plan = learning_plan(profile, start, 4, sha256="0" * 64)
    tails = plan.predicted.runtime.step_tail_s
    truth = plan.simulation(RuntimeTerms(3e-3, tails, 1.0))  # each action costs 2 ms more than calibrated
    learned = learn_from_run(start, profile, plan, verify_report(plan, truth.iteration_s, truth.busy_s, tails[0]))
    assert learned.action_overhead_s == pytest.approx({"gpipe": 4e-3, "1f1b": 3e-3, "interleaved-1f1b": 7e-3})
    note = learned.learned_model
    assert (note["name"], note["fingerprint"]) == (profile.model.name, profile.model.fingerprint)
    assert note["measured_s"] == truth.iteration_s and note["predicted_s"] == plan.predicted.iteration_s
    assert learned.source == "refit"
    replayed = replace(verify_report(plan, 1.0, (1.0, 1.0), 0.0), mode="replay", ranks=())
    with pytest.raises(UsageError, match="real processes"):
        learn_from_run(start, profile, plan, replayed)


def test_a_short_model_learns_from_every_schedules_plan_and_a_long_one_from_1f1b_alone() -> None:
    short = make_profile([0.001] * 6, sizes=(1, 2))
    plans = learning_plans(short, calibration(), 8, sha256="0" * 64)
    assert plans[0].schedule is Schedule.ONE_F_ONE_B and plans[0].predicted.iteration_s < EVERY_SCHEDULE_BELOW_S
    # Every schedule at the global batch asked for, then again at the same micro-batch size with as many
    # micro-batches as ranks (the fewest that keep 1F1B's ranks busy), 1F1B first in each; last, 1F1B at the
    # other profiled size with as many micro-batches as the first plan.
    b, m = plans[0].micro_batch_size, plans[0].num_microbatches
    at_8 = [p for p in plans if p.global_batch_size == 8 and p.micro_batch_size == b]
    at_fewest = [p for p in plans if p.global_batch_size == 2 * b and p.micro_batch_size == b]
    other_size = [p for p in plans if p.micro_batch_size != b]
    assert plans == at_8 + at_fewest + other_size and at_fewest[0].schedule is Schedule.ONE_F_ONE_B
    assert all(p.num_microbatches == 2 for p in at_fewest)
    assert [(p.schedule, p.micro_batch_size, p.num_microbatches) for p in other_size] == [
        (Schedule.ONE_F_ONE_B, 3 - b, m)  # sizes (1, 2)
    ]
    for group in (at_8, at_fewest):
        schedules = {p.schedule for p in group}
        assert {Schedule.GPIPE, Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE, Schedule.ZBV} <= schedules
        assert Schedule.NAIVE not in schedules
        # zero-bubble runs with one stage per rank and with several, the others once each
        assert sorted(p.virtual_stages > 1 for p in group if p.schedule is Schedule.ZERO_BUBBLE) == [False, True]
        assert len(group) == len(schedules) + 1
    assert all(p.num_ranks == 2 for p in plans)
    one_schedule = learning_plans(short, calibration(), 8, sha256="0" * 64, every_schedule=False)
    assert [(p.schedule, p.global_batch_size) for p in one_schedule] == [(Schedule.ONE_F_ONE_B, 8)] * 2
    long = make_profile([0.2] * 6, sizes=(1, 2))
    plans = learning_plans(long, calibration(), 8, sha256="0" * 64)
    assert plans[0].predicted.iteration_s >= EVERY_SCHEDULE_BELOW_S
    assert [(p.schedule, p.micro_batch_size, p.num_microbatches) for p in plans] == [
        (Schedule.ONE_F_ONE_B, plans[0].micro_batch_size, 8 // plans[0].micro_batch_size),
        (Schedule.ONE_F_ONE_B, 3 - plans[0].micro_batch_size, 8 // (3 - plans[0].micro_batch_size)),
    ]


def _first_of_each(plans):
    """Each schedule's plan at the global batch asked for (not at the fewest micro-batches), one stage a rank
    where it has one."""
    first = {}
    for p in plans:
        if p.global_batch_size != plans[0].global_batch_size:
            continue
        if p.schedule not in first or p.virtual_stages < first[p.schedule].virtual_stages:
            first[p.schedule] = p
    return first


def _measured(plan, overhead_s: float, *, speed: float = 1.0, compute_scale: float = 1.0):
    """``plan`` measured as the model predicts it with ``overhead_s`` per action and compute ``compute_scale`` x
    the profile's, all ``speed`` times as long."""
    tails = plan.predicted.runtime.step_tail_s
    sim = plan.simulation(RuntimeTerms(overhead_s, tails, compute_scale))
    return plan, verify_report(plan, sim.iteration_s * speed, tuple(b * speed for b in sim.busy_s), tails[0] * speed)


def test_each_schedule_that_ran_keeps_its_own_overhead_and_the_others_shift_with_1f1b() -> None:
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3, "interleaved-1f1b": 1e-3})
    plans = _first_of_each(learning_plans(profile, start, 4, sha256="0" * 64, every_schedule=True))
    runs = [_measured(plans[Schedule.ONE_F_ONE_B], 3e-3), _measured(plans[Schedule.ZERO_BUBBLE], 6e-3)]
    learned = learn_from_runs(start, profile, runs)
    assert learned.action_overhead_s["1f1b"] == pytest.approx(3e-3)
    assert learned.action_overhead_s["zero-bubble"] == pytest.approx(6e-3)
    assert learned.action_overhead_s["gpipe"] == pytest.approx(3e-3)  # did not run: shifted by 1F1B's +2 ms
    assert learned.colocation_factor == pytest.approx(1.0, abs=1e-3)
    assert learned.learned_model["schedules"] == ["1f1b", "zero-bubble"]


def test_the_other_schedules_learn_from_their_ratio_to_1f1b_when_the_runs_beat_the_model() -> None:
    # Every run measured 20 % under what the model can predict (no overhead, no slowdown): 1F1B's fit stops at
    # zero, and an absolute fit of zero-bubble's would too. Its ratio to 1F1B still says 4 ms per action.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"zero-bubble": 1e-3, "1f1b": 1e-3})
    plans = _first_of_each(learning_plans(profile, start, 4, sha256="0" * 64, every_schedule=True))
    one = _measured(plans[Schedule.ONE_F_ONE_B], 0.0, speed=0.8)
    other = _measured(plans[Schedule.ZERO_BUBBLE], 4e-3, speed=0.8)
    learned = learn_from_runs(start, profile, [one, other])
    assert learned.action_overhead_s["1f1b"] == 0.0 and learned.colocation_factor == 1.0
    assert learned.action_overhead_s["zero-bubble"] == pytest.approx(4e-3, rel=1e-3)
    # Ratios given (an interleaved launch's per-round medians) are used in place of the reports' medians.
    given = learn_from_runs(start, profile, [one, other], [1.0, 1.0])
    assert given.action_overhead_s["zero-bubble"] < 2e-3  # the ratio of 1 asked for less


def test_copies_of_the_1f1b_plan_in_the_launch_refit_it_together() -> None:
    # Two copies of one plan measured 3 and 5 ms per action: the anchor is learned from both, not from either.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    plan = learning_plan(profile, start, 4, sha256="0" * 64)
    alone = learn_from_runs(start, profile, [_measured(plan, 3e-3)])
    both = learn_from_runs(start, profile, [_measured(plan, 3e-3)], first_copies=[_measured(plan, 5e-3)[1]])
    assert alone.action_overhead_s["1f1b"] == pytest.approx(3e-3, rel=1e-3)
    assert both.action_overhead_s["1f1b"] == pytest.approx(4e-3, rel=1e-3)
    assert both.action_overhead_s["gpipe"] == pytest.approx(4e-3, rel=1e-3)  # shifted by as much


def test_the_1f1b_runs_units_together_over_alone_is_learned_beside_the_co_location_factor() -> None:
    # The units' sums as the ranks timed them: 2.2 and 2.6 ms together against 2.0 ms alone, at any speed (the
    # run is brought to profiling speed before the refit: the ratio must survive it).
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    plan = learning_plan(profile, start, 4, sha256="0" * 64)
    device = {**plan.device, "unit_sum_s": 1e-3, "capture": "export"}
    plan = replace(plan, device=device)

    def timed(together_s: float | None, alone_s: float = 2e-3):
        run, report = _measured(plan, 3e-3, speed=2.0)
        return run, replace(
            report, reference="units", reference_s=alone_s, profile_reference_s=1e-3, reference_together_s=together_s
        )

    assert start.units_together_ratio is None
    one = learn_from_runs(start, profile, [timed(2.2e-3)])
    assert one.units_together_ratio == pytest.approx(1.1)
    copies = learn_from_runs(start, profile, [timed(2.2e-3)], first_copies=[timed(2.6e-3)[1], timed(None)[1]])
    assert copies.units_together_ratio == pytest.approx(1.2)  # the median of those that timed it
    assert learn_from_runs(start, profile, [timed(None)]).units_together_ratio is None
    # A plan made with the learned calibration carries the ratio for verify.
    settings = default_settings(profile, calibration=one, calibration_label="learned")
    assert repredicted_plan(profile, plan, settings).learned_together_ratio is None  # reprediction keeps device
    assert profiled_device(profile, 1, one)["units_together_ratio"] == pytest.approx(1.1)
    assert "units_together_ratio" not in profiled_device(profile, 1, start)
    assert calibration_from_dict(one.to_dict()).units_together_ratio == pytest.approx(1.1)


def test_plans_at_two_micro_batch_counts_learn_an_overhead_for_each_count() -> None:
    # GPipe's actions cost 1 ms at 2 micro-batches and 3 ms at 4; 1F1B's 1 ms at both.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    plans = learning_plans(profile, start, 8, sha256="0" * 64, every_schedule=True)  # b = 2: 4, then 2
    b = plans[0].micro_batch_size
    pick = {(p.schedule, p.num_microbatches): p for p in plans if p.virtual_stages == 1 and p.micro_batch_size == b}
    truth = {(Schedule.ONE_F_ONE_B, 4): 1e-3, (Schedule.GPIPE, 4): 3e-3, (Schedule.ONE_F_ONE_B, 2): 1e-3}
    truth[Schedule.GPIPE, 2] = 1e-3
    runs = [_measured(pick[key], overhead) for key, overhead in truth.items()]
    learned = learn_from_runs(start, profile, runs)
    by_count = learned.action_overhead_by_microbatches_s
    assert by_count["gpipe"] == pytest.approx({4: 3e-3, 2: 1e-3}, rel=1e-3)
    assert by_count["1f1b"] == pytest.approx({4: 1e-3, 2: 1e-3}, rel=1e-3)
    assert learned.action_overhead_s["gpipe"] == pytest.approx(3e-3, rel=1e-3)  # at the anchor's count
    assert learned.overhead_for(Schedule.GPIPE, 1, 3) == pytest.approx(2e-3, rel=1e-3)  # between the two
    assert learned.overhead_for(Schedule.GPIPE, 1, 16) == pytest.approx(3e-3, rel=1e-3)  # the nearest beyond
    assert learned.learned_model["schedules"] == ["1f1b", "gpipe", "1f1b x2", "gpipe x2"]
    assert calibration_from_dict(learned.to_dict()).action_overhead_by_microbatches_s == by_count
    # The planner predicts each plan with the overhead at its own count.
    settings = default_settings(profile, calibration=learned)
    for key, overhead in truth.items():
        again = repredicted_plan(profile, pick[key], settings)
        assert again.predicted.runtime.action_overhead_s == pytest.approx(overhead, rel=1e-3)


def test_a_1f1b_run_at_another_micro_batch_size_learns_that_sizes_co_location_factor() -> None:
    # At the first plan's size (b = 2) compute ran as profiled, at b = 1 20 % slower; the whole launch ran 10 %
    # slow (speed), which a ratio within the launch does not see.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    plans = learning_plans(profile, start, 8, sha256="0" * 64, every_schedule=True)
    first, other = plans[0], plans[-1]
    assert (first.micro_batch_size, other.micro_batch_size, other.schedule) == (2, 1, Schedule.ONE_F_ONE_B)
    runs = [_measured(first, 1e-3, speed=1.1), _measured(other, 1e-3, speed=1.1, compute_scale=1.2)]
    learned = learn_from_runs(start, profile, runs)
    assert learned.colocation_factor_by_micro_batch_size == pytest.approx(
        {2: learned.colocation_factor, 1: 1.2 * learned.colocation_factor}, rel=1e-6
    )
    assert learned.learned_model["schedules"] == ["1f1b", "1f1b b=1"]
    # The planner predicts a plan at b = 1 with its own factor.
    again = repredicted_plan(profile, other, default_settings(profile, calibration=learned))
    assert again.predicted.runtime.compute_scale == pytest.approx(1.2 * learned.colocation_factor, rel=1e-6)


def test_a_short_models_run_at_another_size_sets_its_factor_to_the_measured_ratio() -> None:
    # With other schedules at the first plan's size (a short model's launch), the 1F1B run at b = 1 sets that
    # size's factor so that the calibration predicts its measured ratio to the first run: its compute ran as
    # profiled, but each of its actions cost 3 ms beyond it where the first's cost 1 ms.
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    plans = learning_plans(profile, start, 8, sha256="0" * 64, every_schedule=True)
    first, other = plans[0], plans[-1]
    gpipe = next(p for p in plans if p.schedule is Schedule.GPIPE and p.num_microbatches == first.num_microbatches)
    assert (first.micro_batch_size, other.micro_batch_size, other.schedule) == (2, 1, Schedule.ONE_F_ONE_B)
    runs = [_measured(first, 1e-3), _measured(gpipe, 1e-3), _measured(other, 3e-3)]
    learned = learn_from_runs(start, profile, runs)
    settings = default_settings(profile, calibration=learned)
    first_s, other_s = (repredicted_plan(profile, p, settings).predicted.iteration_s for p in (first, other))
    measured = runs[2][1].measured_iteration_s / runs[0][1].measured_iteration_s
    assert other_s / first_s == pytest.approx(measured, rel=1e-6)
    assert learned.colocation_for(1) > 1.05 * learned.colocation_factor
    # A long model's launch (1F1B alone at each size): the factor from compute, which ran as profiled.
    alone = learn_from_runs(start, profile, [runs[0], runs[2]])
    assert alone.colocation_for(1) == pytest.approx(alone.colocation_factor, rel=1e-6)


def test_zero_bubble_with_several_stages_a_rank_keeps_its_own_overhead() -> None:
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"zero-bubble": 1e-3, "1f1b": 1e-3})
    plans = learning_plans(profile, start, 4, sha256="0" * 64, every_schedule=True)
    single = next(p for p in plans if p.schedule is Schedule.ZERO_BUBBLE and p.virtual_stages == 1)
    several = next(p for p in plans if p.schedule is Schedule.ZERO_BUBBLE and p.virtual_stages > 1)
    one = next(p for p in plans if p.schedule is Schedule.ONE_F_ONE_B)
    runs = [_measured(one, 1e-3), _measured(single, 2e-3), _measured(several, 5e-3)]
    learned = learn_from_runs(start, profile, runs)
    assert learned.overhead_for(Schedule.ZERO_BUBBLE) == pytest.approx(2e-3, rel=1e-3)
    assert learned.overhead_for(Schedule.ZERO_BUBBLE, several.virtual_stages) == pytest.approx(5e-3, rel=1e-3)
    assert learned.overhead_for(Schedule.ONE_F_ONE_B, 2) == learned.overhead_for(Schedule.ONE_F_ONE_B)
    assert calibration_from_dict(learned.to_dict()).multi_stage_overhead_s == learned.multi_stage_overhead_s
    # The planner predicts a plan with several stages a rank with it.
    again = repredicted_plan(profile, several, default_settings(profile, calibration=learned))
    assert again.predicted.runtime.action_overhead_s == pytest.approx(5e-3, rel=1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "mlp"], "--model and --profile go together"),
        (["--start", "auto"], "--start only makes sense with --model"),
    ],
)
def test_calibrate_refuses_half_a_model_request(tmp_path, capsys, args, message) -> None:
    out = tmp_path / "c.json"
    assert main(["calibrate", "--ranks", "2", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_calibrate_learns_the_models_cost_on_two_gloo_ranks_and_plan_warns_for_another_model(
    tmp_path, capsys, monkeypatch
) -> None:
    from planner.runtime import model_cost

    monkeypatch.setattr(model_cost, "LEARNING_BUDGET_S", 0.0)  # the fewest rounds: what was kept is asserted
    mlp = tmp_path / "mlp.profile.json"
    assert (
        main(
            [
                "profile",
                "mlp",
                "--no-pipeline-run",
                "--ranks",
                "2",
                "--micro-batch-sizes",
                "2,4",
                "--repeats",
                "1",
                "--min-time",
                "0",
                "--no-progress",
                "--out",
                str(mlp),
            ]
        )
        == 0
    )
    out = tmp_path / "mlp.calibration.json"
    code = main(["calibrate", "--ranks", "2", "--start", "auto", "--model", "mlp", "--profile", str(mlp),
                 "--global-batch", "8", "--steps", "1", "--learn", "1f1b", "--out", str(out)])  # fmt: skip
    assert code == 0
    learned = load_calibration(out)
    note = learned.learned_model
    assert (note["name"], note["schedule"], note["micro_batch_size"] * note["num_microbatches"]) == ("mlp", "1f1b", 8)
    assert note["fingerprint"] == load_profile(mlp).model.fingerprint and note["measured_s"] > 0
    assert learned.source == "refit"
    assert learned.p2p_latency_s == shipped_calibration("cpu").p2p_latency_s  # --start: the machine not re-measured
    printed = capsys.readouterr()
    assert f"pipeplan calibrate --ranks 2 --model mlp --profile {mlp} --out" in printed.out  # profile's next step
    assert "learned from mlp on 2 ranks" in printed.out and "(the other schedules: shifted by as much)" in printed.out
    # 1F1B at the other profiled size too, at the same global batch: its co-location factor.
    b = note["micro_batch_size"]
    assert f"running mlp on 2 ranks (1f1b, 1f1b x{8 // (6 - b)} b={6 - b}, b={b} x {8 // b})" in printed.err
    assert sorted(learned.colocation_factor_by_micro_batch_size) == [2, 4]
    # Its units timed together and alone in the ranks, 2 processes on 2 cores: about as fast or slower together,
    # never 3x. The suite's other worker shares the cores and can slow an alone timing as much as a together one.
    assert learned.units_together_ratio is not None and 0.5 < learned.units_together_ratio < 3.0
    assert "units timed with every rank at once:" in printed.out
    assert f"1f1b x{8 // (6 - b)} b={6 - b}" in printed.out and "co-location" in printed.out
    # No warning of the run's own (the profile warns of a busy machine, which this test does not control).
    assert [line for line in printed.err.splitlines() if "warning" in line and "load average" not in line] == []

    plan = ["plan", "--stages", "2", "--global-batch", "8", "--calibration", str(out)]
    assert main([plan[0], str(mlp), *plan[1:], "--out", str(tmp_path / "same.plan.json")]) == 0
    planned = capsys.readouterr()
    assert "warning" not in planned.err and "slower together than alone)" in planned.out
    same = load_plan(tmp_path / "same.plan.json")
    assert same.learned_together_ratio == pytest.approx(learned.units_together_ratio)
    other = tmp_path / "other.profile.json"
    save_profile(make_profile([0.01] * 4), other)
    assert main([plan[0], str(other), *plan[1:], "--out", str(tmp_path / "other.plan.json")]) == 0
    assert "the calibration learned mlp's per-action cost" in capsys.readouterr().err


def test_each_plans_ratio_is_the_geometric_mean_of_the_learning_launches(monkeypatch) -> None:
    # Two launches put GPipe at 1.0x and 1.44x 1F1B: its overhead is fitted to 1.2x.
    from planner.runtime import model_cost
    from planner.runtime.interleave import InterleavedRun

    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1,))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    plans = _first_of_each(learning_plans(profile, start, 4, sha256="0" * 64, every_schedule=True))
    one, gpipe = plans[Schedule.ONE_F_ONE_B], plans[Schedule.GPIPE]
    reports = tuple(r for _, r in (_measured(one, 1e-3), _measured(gpipe, 1e-3), _measured(one, 1e-3)))
    launches = iter(
        [
            InterleavedRun(reports, ((1.0,) * 7, (1.0,) * 7, (1.0,) * 7)),
            InterleavedRun(reports, ((1.0,) * 7, (1.44,) * 7, (1.0,) * 7)),
        ]
    )
    monkeypatch.setattr(model_cost, "verify_plans", lambda *args, **kwargs: next(launches))
    run = model_cost.learn_model_cost(start, profile, "mlp", [one, gpipe])
    assert run.calibration.learned_model["ratios_to_first"] == pytest.approx([1.0, 1.2])
    assert next(launches, None) is None  # both ran


def test_several_plans_learn_in_one_interleaved_launch_on_two_gloo_ranks(tmp_path, monkeypatch) -> None:
    from planner.runtime import model_cost
    from planner.runtime.model_cost import learn_model_cost

    # the fewest rounds (what is asserted is which plans ran and what was kept, not their values)
    monkeypatch.setattr(model_cost, "LEARNING_BUDGET_S", 0.0)
    monkeypatch.setattr(model_cost, "LEARNING_ROUNDS", 3)

    out = tmp_path / "mlp.profile.json"
    argv = ["profile", "mlp", "--no-pipeline-run", "--ranks", "2", "--micro-batch-sizes", "2,4", "--repeats", "1"]
    assert main([*argv, "--min-time", "0", "--no-progress", "--out", str(out)]) == 0
    profile = load_profile(out)
    start = shipped_calibration("cpu")
    plans = learning_plans(profile, start, 8, sha256="0" * 64, every_schedule=True)
    chosen = [p for p in plans if p.schedule in (Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED_1F1B)]
    run = learn_model_cost(start, profile, "mlp", chosen, timeout_s=300)
    # The 1F1B plan ran as two copies (the ratios' anchor); each plan is reported once. Global batch 8 at b = 4
    # is already as many micro-batches as ranks (no second count); 1F1B at the other size, b = 2, comes last.
    b = chosen[0].micro_batch_size
    assert [(p.schedule, p.micro_batch_size) for p, _ in run.runs] == [
        (Schedule.ONE_F_ONE_B, b),
        (Schedule.GPIPE, b),
        (Schedule.INTERLEAVED_1F1B, b),
        (Schedule.ONE_F_ONE_B, 6 - b),
    ]
    assert all(r.mode == "processes" and r.steps >= model_cost.LEARNING_ROUNDS for _, r in run.runs)
    # Only the 1F1B plan's speed is read: its ranks time its units; the others take the fixed layer.
    assert [r.reference for _, r in run.runs] == ["units", "layer", "layer", "layer"]
    note = run.calibration.learned_model
    assert note["schedules"] == ["1f1b", "gpipe", "interleaved-1f1b v=2", f"1f1b b={6 - b}"]
    assert note["ratios_to_first"][0] == 1.0 and all(r > 0 for r in note["ratios_to_first"])
    assert run.calibration.source == "refit"
    assert all(v >= 0 for v in run.calibration.action_overhead_s.values())
    by_size = run.calibration.colocation_factor_by_micro_batch_size
    assert sorted(by_size) == [2, 4] and by_size[b] == run.calibration.colocation_factor
    assert all(0 < k < 10 for k in by_size.values())


def test_a_long_models_launch_runs_each_plan_once_and_a_short_models_its_anchor_twice(monkeypatch) -> None:
    # A long model's 1F1B plans at two sizes learn from their compute: one launch, each plan once, the first's
    # units its speed reference. A short model's schedules learn from their ratios to 1F1B: two launches, 1F1B
    # at both ends of each.
    from planner.runtime import model_cost
    from planner.runtime.interleave import InterleavedRun

    launched = []

    def fake_verify_plans(launch, model, **kwargs):
        launched.append(([(p.schedule, p.micro_batch_size) for p in launch], kwargs["unit_references"]))
        reports = tuple(_measured(p, 1e-3)[1] for p in launch)
        return InterleavedRun(reports, tuple((1.0,) * kwargs["rounds"] for _ in launch))

    monkeypatch.setattr(model_cost, "verify_plans", fake_verify_plans)
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4, sizes=(1, 2))
    start = calibration(action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3})
    long = learning_plans(profile, start, 4, sha256="0" * 64, every_schedule=False)
    assert [(p.schedule, p.micro_batch_size) for p in long] == [(Schedule.ONE_F_ONE_B, 1), (Schedule.ONE_F_ONE_B, 2)]
    run = model_cost.learn_model_cost(start, profile, "mlp", long)
    assert launched == [([(Schedule.ONE_F_ONE_B, 1), (Schedule.ONE_F_ONE_B, 2)], [True, False])]
    assert [p.micro_batch_size for p, _ in run.runs] == [1, 2]  # each reported once

    launched.clear()
    plans = _first_of_each(learning_plans(profile, start, 4, sha256="0" * 64, every_schedule=True))
    one, gpipe = plans[Schedule.ONE_F_ONE_B], plans[Schedule.GPIPE]
    model_cost.learn_model_cost(start, profile, "mlp", [one, gpipe])
    b = one.micro_batch_size
    twice = ([(Schedule.ONE_F_ONE_B, b), (Schedule.GPIPE, b), (Schedule.ONE_F_ONE_B, b)], [True, False, True])
    assert launched == [twice, twice]
