"""`pipeplan calibrate --model`: a model's own per-action cost learned from one 1F1B run of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cli import main
from planner.calibration import load_calibration, shipped_calibration
from planner.errors import UsageError
from planner.runtime.model_cost import default_global_batch, learn_from_run, learning_plan
from planner.schedule.simulate import RuntimeTerms
from profiles.format import load_profile, save_profile
from synthetic import calibration, make_profile, verify_report


def test_the_run_it_learns_from_is_the_planners_1f1b_plan_for_the_calibrations_ranks() -> None:
    profile = make_profile([0.01] * 6, sizes=(1, 2))
    plan = learning_plan(profile, calibration(), default_global_batch(profile, 2), sha256="0" * 64)
    assert (plan.schedule.value, plan.num_ranks) == ("1f1b", 2)
    assert plan.micro_batch_size * plan.num_microbatches == 2 * 2 * 2
    with pytest.raises(UsageError, match="at least 2 ranks"):
        learning_plan(profile, calibration(num_ranks=1), 4, sha256="0" * 64)


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


def test_calibrate_learns_the_models_cost_on_two_gloo_ranks_and_plan_warns_for_another_model(tmp_path, capsys) -> None:
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
                "--no-progress",
                "--out",
                str(mlp),
            ]
        )
        == 0
    )
    out = tmp_path / "mlp.calibration.json"
    code = main(["calibrate", "--ranks", "2", "--start", "auto", "--model", "mlp", "--profile", str(mlp),
                 "--global-batch", "8", "--steps", "1", "--out", str(out)])  # fmt: skip
    assert code == 0
    learned = load_calibration(out)
    note = learned.learned_model
    assert (note["name"], note["schedule"], note["micro_batch_size"] * note["num_microbatches"]) == ("mlp", "1f1b", 8)
    assert note["fingerprint"] == load_profile(mlp).model.fingerprint and note["measured_s"] > 0
    assert learned.source == "refit"
    assert learned.p2p_latency_s == shipped_calibration("cpu").p2p_latency_s  # --start: the machine not re-measured
    printed = capsys.readouterr()
    assert f"pipeplan calibrate --ranks 2 --model mlp --profile {mlp} --out" in printed.out  # profile's next step
    assert "learned from mlp (1f1b" in printed.out
    assert "running mlp under 1f1b on 2 ranks (b=" in printed.err
    # No warning of the run's own (the profile warns of a busy machine, which this test does not control).
    assert [line for line in printed.err.splitlines() if "warning" in line and "load average" not in line] == []

    plan = ["plan", "--stages", "2", "--global-batch", "8", "--calibration", str(out)]
    assert main([plan[0], str(mlp), *plan[1:], "--out", str(tmp_path / "same.plan.json")]) == 0
    assert "warning" not in capsys.readouterr().err
    other = tmp_path / "other.profile.json"
    save_profile(make_profile([0.01] * 4), other)
    assert main([plan[0], str(other), *plan[1:], "--out", str(tmp_path / "other.plan.json")]) == 0
    assert "the calibration learned mlp's per-action cost" in capsys.readouterr().err
