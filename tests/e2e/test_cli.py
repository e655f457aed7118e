"""Every bad input: one line on stderr, exit code 2, nothing on disk touched."""

import json
from pathlib import Path

import pytest

from cli import main
from cli_checks import assert_fails
from profiles.format import save_profile
from synthetic import make_profile


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "model.profile.json"
    save_profile(make_profile([1.0] * 7 + [4.0], sizes=(1, 2)), path)
    return path


def _fails_argparse(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and message in err, err


def test_plan_writes_a_plan_and_prints_the_table(profile_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", str(profile_file), "--stages", "4", "--global-batch", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "bottleneck" in printed and "pipeplan speed-up" in printed
    assert json.loads(out.read_text())["format"] == "pipeplan.plan"
    assert main(["show", str(out)]) == 0
    assert "layers.7" in capsys.readouterr().out


def test_plan_is_byte_identical_across_runs(profile_file, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        assert main(["plan", str(profile_file), "--stages", "2", "--global-batch", "4", "--out", str(out)]) == 0
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--stages", "9", "--global-batch", "8"], "cannot cut 8 units into 9 stages"),
        (["--stages", "2", "--global-batch", "7", "--micro-batch-size", "2"], "not divisible by micro-batch size 2"),
        (["--stages", "2", "--global-batch", "4", "--micro-batch-size", "3"], "micro-batch size 3 was not profiled"),
        (["--stages", "2", "--global-batch", "8", "--memory", "1KiB"], "no plan fits"),
        (["--stages", "4", "--global-batch", "2", "--schedule", "1f1b"], "needs at least as many micro-batches"),
    ],
)
def test_plan_bad_requests(profile_file, existing, capsys, extra, message):
    assert_fails(capsys, ["plan", profile_file, *extra, "--out", existing], message, existing)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bandwidth", "0"], "--bandwidth"),
        (["--memory", "-1GiB"], "--memory"),
        (["--stages", "0"], "--stages"),
        (["--micro-batch-sizes", "x"], "unrecognized"),
    ],
)
def test_plan_bad_numbers(profile_file, tmp_path, capsys, extra, message):
    argv = ["plan", profile_file, "--stages", "2", "--global-batch", "4", "--out", tmp_path / "p.json", *extra]
    _fails_argparse(capsys, argv, message)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"format": "pipeplan.profile", "version": 1, "mod', "not valid JSON"),
        ("[1, 2]", "not a pipeplan profile"),
        ('{"format": "other", "version": 1}', "not a pipeplan profile: format is 'other'"),
        ('{"format": "pipeplan.profile", "version": 7}', "unsupported profile version 7"),
    ],
)
def test_plan_rejects_bad_profiles(tmp_path, existing, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert_fails(capsys, ["plan", bad, "--stages", "2", "--global-batch", "4", "--out", existing], message, existing)


def test_plan_rejects_negative_and_nan_numbers(profile_file, tmp_path, existing, capsys):
    data = json.loads(profile_file.read_text())
    data["units"][0]["forward_s"][0] = -1.0
    bad = tmp_path / "negative.json"
    bad.write_text(json.dumps(data))
    assert_fails(
        capsys, ["plan", bad, "--stages", "2", "--global-batch", "4", "--out", existing], "invalid profile", existing
    )
    nan = tmp_path / "nan.json"
    nan.write_text(profile_file.read_text().replace('"forward_s": [\n        1.0', '"forward_s": [\n        NaN', 1))
    assert_fails(capsys, ["plan", nan, "--stages", "2", "--global-batch", "4", "--out", existing], "NaN", existing)


def test_output_folder_must_exist(profile_file, tmp_path, capsys):
    out = tmp_path / "missing" / "plan.json"
    assert_fails(capsys, ["plan", profile_file, "--stages", "2", "--global-batch", "4", "--out", out], "does not exist")


def test_simulate_what_if_prints_a_timeline(capsys):
    assert main(["simulate", "--stages", "4", "--microbatches", "8", "--schedule", "gpipe", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration_s"] == pytest.approx(22.0)
    assert result["bubble_fraction"] == pytest.approx(3 / 11)


def test_simulate_plan_matches_the_plan_prediction(profile_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    main(["plan", str(profile_file), "--stages", "2", "--global-batch", "4", "--out", str(out)])
    capsys.readouterr()
    png = tmp_path / "t.png"
    assert main(["simulate", str(out), "--json", "--png", str(png)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration_s"] == pytest.approx(json.loads(out.read_text())["predicted"]["iteration_s"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stages", "4", "--microbatches", "2", "--schedule", "1f1b"], "needs at least as many micro-batches"),
        (["--stages", "2", "--microbatches", "2", "--stage-times", "1,1,1"], "3 values for 2 stages"),
    ],
)
def test_simulate_bad_input(capsys, argv, message):
    assert_fails(capsys, ["simulate", *argv], message)


def test_simulate_rejects_non_positive_times(capsys):
    _fails_argparse(capsys, ["simulate", "--stages", "2", "--microbatches", "2", "--stage-times", "1,0"], "positive")


def test_simulate_rejects_a_profile_given_as_plan(profile_file, capsys):
    assert_fails(capsys, ["simulate", profile_file], "not a pipeplan plan")


def test_show_rejects_other_json(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text('{"format": "x"}')
    assert_fails(capsys, ["show", other], "neither a pipeplan profile, a plan, a verify report nor a device model")


def test_show_prints_a_device_models_constants(tmp_path, capsys):
    # A built-in by name, a device file by path: what `profile --device-model` assumes, NVLink at NCCL's rate.
    assert main(["show", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "989.4 TFLOP/s dense 16-bit, fp8 2x" in out and "450 GB/s each way, 371 GB/s as NCCL's rings get it" in out
    assert main(["show", "v100-16gb"]) == 0
    out = capsys.readouterr().out
    assert "no flash kernels" in out and "a ring of 2    17% of the NVLink (no switch)" in out
    device_file = Path(__file__).resolve().parents[2] / "benchmarks" / "device_models" / "h100-96gb.json"
    assert main(["show", str(device_file)]) == 0
    assert f"device model h100-96gb ({device_file};" in capsys.readouterr().out
    assert_fails(capsys, ["show", "tpu"], "JSON file not found: tpu, nor is it a built-in device model (v100-16gb,")
    assert_fails(capsys, ["show", "h100-80gb", "--micro-batch-size", "2"], "a device model has none")
    assert_fails(capsys, ["show", "y" * 300], "JSON file not found: yyy")  # a name longer than a file's may be


def _compared(out: str) -> dict[str, str]:
    """The comparison table's iteration per schedule: rows ``NAME  22.0 s  ...`` after its header."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("schedule  "))
    rows = [line.split() for line in lines[start + 2 :] if line.strip()]
    return {row[0]: " ".join(row[1:3]) for row in rows if len(row) >= 3 and row[2] in ("s", "ms", "us")}


def test_simulate_compare_interleaves_each_rank_into_chunks(tmp_path, capsys):
    png = tmp_path / "cmp.png"
    argv = ["simulate", "--ranks", "4", "--micro-batches", "8", "--compare", "1f1b,interleaved-1f1b"]
    assert main([*argv, "--compare-out", str(png)]) == 0
    # f = b = 1 per rank: 1F1B 2(M + P - 1) = 22; interleaved v=2 halves the fill: 2(M + (P - 1)/v) = 19.
    assert _compared(capsys.readouterr().out) == {"1f1b": "22.0 s", "interleaved-1f1b": "19.0 s"}
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [("1f1b", 33.0), ("zero-bubble", 27.0), ("looped-bfs", 57.0), ("zbv", 51.0), ("dualpipev", 54.0)],
)
def test_simulate_what_if_with_weight_times(capsys, schedule, expected):
    # The what-if: F = B = W = 1 per stage (B the input gradient, so the full backward is 2);
    # looped-bfs, zbv and dualpipev run 2 stages per rank, twice the work per rank; dualpipev's paired forwards
    # send after their backward (torch's lowering), a forward and a backward of a stage more than zbv.
    argv = ["simulate", "--stages", "4", "--microbatches", "8", "--schedule", schedule, "--json"]
    assert main([*argv, "--stage-times", "1", "--backward-times", "1", "--weight-times", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_s"] == pytest.approx(expected)


def test_simulate_compare_splits_each_rank_into_a_v(capsys, tmp_path):
    argv = ["simulate", "--stages", "4", "--microbatches", "8", "--stage-times", "1", "--backward-times", "1"]
    argv += ["--weight-times", "1", "--compare", "1f1b,zero-bubble,zbv,dualpipev"]
    argv += ["--compare-out", str(tmp_path / "c.png")]
    assert main(argv) == 0
    compared = _compared(capsys.readouterr().out)
    # The same per-rank work: ZB-H1 27 (bubble (P - 1)(F + B - W) = 3), ZB-V 25.5, DualPipeV 27 (its paired
    # forwards send after their backward).
    assert {k: compared[k] for k in ("zero-bubble", "zbv", "dualpipev")} == {
        "zero-bubble": "27.0 s",
        "zbv": "25.5 s",
        "dualpipev": "27.0 s",
    }


def test_simulate_v_schedule_takes_two_stages_per_rank(capsys):
    argv = ["simulate", "--stages", "2", "--microbatches", "4", "--schedule", "zbv", "--virtual-stages", "3"]
    assert_fails(capsys, argv, "runs exactly 2 stages per rank")


def test_simulate_reproduces_a_split_backward_plan(tmp_path, capsys):
    profile = tmp_path / "p.json"
    save_profile(make_profile([1.0, 2.0, 1.0, 3.0], weight_share=0.4), profile)
    out = tmp_path / "plan.json"
    argv = ["plan", str(profile), "--stages", "2", "--global-batch", "4", "--schedule", "zbv", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    stages = json.loads(out.read_text())["stages"]
    assert [s["rank"] for s in stages] == [0, 1, 1, 0] and all("weight_s" in s for s in stages)
    assert main(["simulate", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration_s"] == pytest.approx(json.loads(out.read_text())["predicted"]["iteration_s"])
    assert {a["kind"] for a in result["actions"]} >= {"F", "I", "W"}
