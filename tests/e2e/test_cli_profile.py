"""`pipeplan profile` through the CLI: a real run, and every bad input as one line with exit code 2."""

import json
import os

import pytest
import torch

from cli import main
from cli_checks import PRECIOUS, assert_fails
from planner.formatting import human_seconds
from planner.runtime import model_cost
from profiles.rounds import MIN_TIME_S


@pytest.fixture
def specs(tmp_path):
    (tmp_path / "specs.py").write_text(
        "NOT_CALLABLE = 3\n"
        "def wrong():\n    return 'a string'\n"
        "def broken():\n    raise RuntimeError('no weights here')\n"
    )
    (tmp_path / "bad_import.py").write_text("import does_not_exist_anywhere\n")
    return tmp_path


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("gpt5", "unknown model 'gpt5': built-ins are"),
        ("no/such/file.py:workload", "model file not found"),
        ("no_such_package_xyz.models:workload", "cannot import module"),
    ],
)
def test_unknown_models(capsys, existing, model, message):
    assert_fails(capsys, ["profile", model, "--out", existing], message, existing)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("specs.py:NOT_CALLABLE", "is not callable"),
        ("specs.py:wrong", "returned str: expected a Workload"),
        ("specs.py:broken", "failed: RuntimeError: no weights here"),
        ("specs.py:missing", "has no attribute 'missing'"),
        ("bad_import.py:x", "importing"),
    ],
)
def test_bad_user_specs(capsys, existing, specs, name, message):
    assert_fails(capsys, ["profile", specs / name, "--out", existing], message, existing)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu(capsys, existing):
    assert_fails(capsys, ["profile", "mlp", "--device", "cuda", "--out", existing], "CUDA is not available", existing)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        *[("--micro-batch-sizes", v) for v in ("0", "1,-2", "two", "1.5")],
        *[("--min-time", v) for v in ("-1", "nan", "inf", "two")],
    ],
)
def test_bad_numbers_are_one_line_and_exit_2(capsys, existing, option, value):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mlp", option, value, "--out", str(existing)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and option in err
    assert existing.read_text() == PRECIOUS


def test_output_in_a_missing_folder(capsys, tmp_path):
    assert_fails(capsys, ["profile", "mlp", "--out", tmp_path / "nope" / "p.json"], "output folder does not exist")


def test_profile_then_show_then_plan(capsys, tmp_path, monkeypatch):
    # What profile learns is tested for its values in test_model_cost; here, that it is learned, kept and used:
    # one launch of two rounds instead of the default minute of them in two.
    monkeypatch.setattr(model_cost, "LEARNING_BUDGET_S", 0.0)
    monkeypatch.setattr(model_cost, "LEARNING_ROUNDS", 2)
    monkeypatch.setattr(model_cost, "LEARNING_LAUNCHES", 1)
    torch.set_num_threads(1)
    out = tmp_path / "mlp.profile.json"
    argv = ["profile", "mlp", "--micro-batch-sizes", "1,2", "--repeats", "1", "--warmup", "0", "--no-progress"]
    argv += ["--max-repeats", "2", "--ranks", "2", "--min-time", "0"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "unit sum" in printed and "layers.0" in printed and "(exported as one piece)" in printed
    profile = json.loads(out.read_text())
    assert profile["micro_batch_sizes"] == [1, 2]
    # --ranks 2: the threads each of 2 ranks gets, by the runtime's rule (cores // ranks)
    assert profile["settings"]["threads"] == max(1, (os.cpu_count() or 1) // 2)
    assert all(1 <= r <= 2 for r in profile["settings"]["repeats_used"])
    # What measuring took, part by part, kept and printed.
    settings = profile["settings"]
    assert settings["rounds_s"] > 0 and settings["after_rounds_s"] > 0
    rounds = "{} at b=1, {} at b=2".format(*settings["repeats_used"])
    assert f"measuring took {human_seconds(settings['rounds_s'])} of rounds ({rounds}), " in printed
    assert main(["show", str(out)]) == 0
    assert "layers.0" in capsys.readouterr().out
    plan = tmp_path / "mlp.plan.json"
    assert main(["plan", str(out), "--stages", "2", "--global-batch", "4", "--out", str(plan)]) == 0
    planned = json.loads(plan.read_text())
    assert planned["model"]["fingerprint"] == profile["model"]["fingerprint"]
    # With a core per rank, the profile ran the model as a 2-rank 1F1B pipeline (mlp is short: every schedule's
    # plan too, in the same launch) and kept what it learned; plan takes its runtime terms from there, and says so.
    learned = profile.get("pipeline_calibration")
    if (os.cpu_count() or 1) >= 2:
        assert "learned from mlp on 2 ranks" in printed and "    gpipe " in printed
        assert learned["notes"]["model"]["name"] == "mlp" and learned["num_ranks"] == 2
        assert f"{human_seconds(settings['pipeline_run_s'])} running it as a pipeline" in printed
        assert learned["notes"]["model"]["schedules"][:2] == ["1f1b", "gpipe"]
        assert planned["predicted"]["calibration"] == "learned while profiling"
        # The co-location factor at the plan's micro-batch size (a size's own where one was learned for it).
        by_size = learned.get("colocation_factor_by_micro_batch_size", {})
        at_size = by_size.get(str(planned["micro_batch_size"]), learned["colocation_factor"])
        assert planned["predicted"]["compute_scale"] == at_size
        assert "runtime terms from calibration learned while profiling: " in capsys.readouterr().out
    else:
        assert learned is None and planned["predicted"]["calibration"] == "shipped"


def test_profile_rounds_span_the_default_time_floor(tmp_path):
    out = tmp_path / "mlp.profile.json"
    argv = ["profile", "mlp", "--micro-batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--no-progress"]
    assert main([*argv, "--max-repeats", "1", "--no-pipeline-run", "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    # the default time floor (its --help says 2 s): one round of this MLP takes ~1 ms, so many more than one
    assert settings["min_time_s"] == MIN_TIME_S == 2.0 and settings["repeats_used"][0] > 10


def test_threads_and_ranks_are_exclusive(capsys, existing):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mlp", "--threads", "1", "--ranks", "2", "--out", str(existing)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not allowed with argument" in err
    assert existing.read_text() == PRECIOUS
