"""Issue 14: every hostile input is one line on stderr and exit 2 (or a correct result); no input is replaced."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest

from cli import main
from cli_checks import assert_fails
from planner.errors import PlanFormatError, ProfileError
from planner.limits import MAX_UNITS
from planner.plan import load_plan
from profiles.format import load_profile, save_profile
from synthetic import make_profile


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real profile and the plan pipeplan makes of it (interleaved: several stages per rank)."""
    folder = tmp_path_factory.mktemp("real")
    profile = folder / "p.json"
    save_profile(make_profile([1.0] * 7 + [4.0], sizes=(1, 2)), profile)
    plan = folder / "plan.json"
    # The textbook model (no runtime terms) interleaves here: the plan has several stages per rank.
    args = ["plan", str(profile), "--stages", "2", "--global-batch", "4", "--calibration", "none"]
    assert main([*args, "--out", str(plan)]) == 0
    assert json.loads(plan.read_text())["virtual_stages"] > 1
    return profile, plan


def _edit(source: Path, target: Path, change) -> Path:
    data = json.loads(source.read_text())
    change(data)
    target.write_text(json.dumps(data))
    return target


def _plan_args(profile: Path, out: Path, *extra: str) -> list:
    return ["plan", profile, "--stages", "2", "--global-batch", "4", "--out", out, *extra]


# --- defect 1: outputs never replace an input --------------------------------------------------------------


def test_plan_out_refuses_its_own_profile(files, capsys):
    profile, _ = files
    before = profile.read_bytes()
    assert_fails(capsys, _plan_args(profile, profile), "is this command's input")
    assert profile.read_bytes() == before


def test_simulate_png_refuses_its_own_plan(files, tmp_path, capsys):
    _, plan = files
    link = tmp_path / "link.json"
    link.symlink_to(plan)  # the same file under another name
    before = plan.read_bytes()
    assert_fails(capsys, ["simulate", plan, "--png", link], "is this command's input")
    assert_fails(capsys, ["simulate", plan, "--compare", "1f1b", "--compare-png", plan], "is this command's input")
    assert plan.read_bytes() == before


def test_out_folder_with_slash_or_existing_folder_is_refused(files, tmp_path, capsys):
    profile, _ = files
    assert_fails(capsys, _plan_args(profile, f"{tmp_path}/newdir/"), "ends with '/'")
    assert not (tmp_path / "newdir").exists()
    assert_fails(capsys, _plan_args(profile, tmp_path), "is a folder")


def test_out_symlink_is_written_through_and_mode_kept(files, tmp_path, capsys):
    profile, _ = files
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main([str(a) for a in _plan_args(profile, link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["format"] == "pipeplan.plan"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_long_name_and_unwritable_output_are_one_line(files, tmp_path, capsys, existing):
    profile, _ = files
    assert_fails(capsys, _plan_args(profile, tmp_path / ("x" * 300)), "over the 255 the file system allows")
    existing.chmod(0o444)
    if os.access(existing, os.W_OK):
        pytest.skip("running as a user that may write any file")
    assert_fails(capsys, _plan_args(profile, existing), "not writable", existing)


# --- defect 3: plans and profiles are read for meaning ------------------------------------------------------


def _first_units(d):  # noqa: ANN001 - helpers below edit a parsed plan in place
    return d["stages"][0]["units"]


PLAN_EDITS = {
    "unit in two stages": (lambda d: _first_units(d).append(d["stages"][1]["units"][0]), "in stage 0 and in stage 1"),
    "unit twice in a stage": (lambda d: _first_units(d).append(_first_units(d)[0]), "twice in stage 0"),
    "empty unit name": (lambda d: _first_units(d).insert(0, " "), "empty unit name"),
    "stages out of order": (
        lambda d: d["stages"].__setitem__(slice(0, 2), [d["stages"][1], d["stages"][0]]),
        "stage indices",
    ),
    "all stages on rank 0": (lambda d: [s.update(rank=0) for s in d["stages"]], "places it on rank 1"),
    "virtual_stages wrong": (lambda d: d.update(virtual_stages=d["virtual_stages"] + 1), "virtual_stages is"),
    "bottleneck out of range": (lambda d: d["predicted"].update(bottleneck_stage=99), "bottleneck_stage is 99"),
    "split points disagree": (lambda d: d["split_points"].reverse(), "split_points"),
    "huge stage time": (lambda d: d["stages"][0].update(forward_s=1e308), "over pipeplan's limit of 1e+09 s"),
    "float as a count": (lambda d: d.update(num_microbatches=2.0), "is not of type 'integer'"),
    "capacity not numbers": (lambda d: d["constraints"].update(capacity_bytes="x"), "capacity_bytes"),
}


@pytest.mark.parametrize("name", list(PLAN_EDITS))
def test_inconsistent_plans_are_refused_by_every_reader(files, tmp_path, capsys, name):
    _, plan = files
    change, message = PLAN_EDITS[name]
    bad = _edit(plan, tmp_path / "bad.json", change)
    with pytest.raises(PlanFormatError, match=re.escape(message)):
        load_plan(bad)
    for argv in (["show", bad], ["simulate", bad], ["verify", bad, "--model", "mlp"]):
        assert_fails(capsys, argv, message)


def test_extra_keys_the_schema_allows_are_ignored(files, tmp_path, capsys):
    _, plan = files

    def change(d):
        d["solver"]["future_field"] = 1
        d["baselines"][0]["note"] = "x"

    extra = _edit(plan, tmp_path / "extra.json", change)
    assert load_plan(extra) == load_plan(plan)
    assert main(["show", str(extra)]) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["units"][1].update(name=d["units"][0]["name"]), "both named layers.0"),
        (lambda d: d["tensors"][2].update(consumers=[1]), "produced by unit 1 but consumed by unit 1"),
        (lambda d: d["units"][0].update(flops=[1.5, 3]), "is not of type 'integer'"),
        (lambda d: d["units"][0].update(flops=[2**60, 3]), "beyond pipeplan's limit of 2**53"),
    ],
)
def test_inconsistent_profiles_are_refused(files, tmp_path, capsys, existing, change, message):
    profile, _ = files
    bad = _edit(profile, tmp_path / "bad.json", change)
    with pytest.raises(ProfileError, match=re.escape(message)):
        load_profile(bad)
    assert_fails(capsys, _plan_args(bad, existing), message, existing)
    assert_fails(capsys, ["show", bad], message)


# --- defect 4 and the reader's bounds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "pipeplan.plan", "version": 1, "num_stages": 1e400}', "out of range"),
        ('{"format": "pipeplan.plan", "version": 1, "num_stages": 123456789012345678901234567890}', "2**53"),
        ("[" * 2000 + "]" * 2000, "nested deeper than 32 levels"),
        ('{"format": "\\ud800"}', "lone surrogate"),
        ('{"format": "pipeplan.plan", "version": Infinity}', "numbers must be finite"),
    ],
)
def test_hostile_json_is_one_line(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    for argv in (
        ["show", bad],
        ["simulate", bad],
        ["plan", bad, "--stages", "1", "--global-batch", "1", "--out", tmp_path / "o"],
    ):
        assert_fails(capsys, argv, message)


def test_bad_utf8_and_non_regular_files_are_refused_at_once(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"format": "\xff"}')
    assert_fails(capsys, ["show", bad], "is not UTF-8 text (byte 0xff at offset 12)")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert_fails(capsys, ["show", fifo], "not a regular file")
    assert_fails(
        capsys, ["plan", fifo, "--stages", "1", "--global-batch", "1", "--out", tmp_path / "o"], "not a regular file"
    )
    assert_fails(capsys, ["show", "/dev/zero"], "not a regular file")
    assert time.monotonic() - started < 5


# --- CLI arguments (defects 4, 6, 7) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--micro-batch-size", "0"], "'0' must be an integer in 1..65,536"),
        (["--micro-batch-size", "-1"], "'-1' must be an integer in 1..65,536"),
        (["--micro-batch-size", "abc"], "'abc' is not an integer"),
        (["--micro-batch-size", "4.0"], "'4.0' is not an integer"),
        (["--memory", "9" * 400], "is not a memory size"),
        (["--latency", "nan"], "--latency: 'nan' must be a finite number"),
        (["--latency", "inf"], "--latency: 'inf' must be a finite number"),
        (["--device-speeds", "1e-300,1"], "'1e-300' must be a finite number >= 0.001"),
        (["--device-memory", ""], "--device-memory: '' is not a comma-separated list"),
        (["--memory", "1GiB", "--device-memory", "1GiB,1GiB"], "--memory and --device-memory conflict"),
        (["--pin", "lm_head=0"], "--pin lm_head=0: no unit of that name"),
        (["--pin", "layers.7=0"], "--pin layers.7=0: unit 7 of 0..7 cannot be on stage 0"),
        (["--pin", "layers.1=9"], "cannot be on stage 9: stages are 0..7"),
        (["--pin", "layers.1=0", "--pin", "layers.1=1"], "--pin layers.1 is given twice"),
        (["--pin", "layers.5=0", "--pin", "layers.2=1"], "conflict: layers.5 comes later"),
    ],
)
def test_bad_plan_arguments_get_their_own_message(files, tmp_path, capsys, extra, message):
    profile, _ = files
    code = None
    try:
        code = main([str(a) for a in _plan_args(profile, tmp_path / "o.json", *extra)])
    except SystemExit as exc:  # argparse's own exit, through _Parser.error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert len(err) <= 301 and "no plan fits" not in err
    assert not (tmp_path / "o.json").exists()


def test_device_speeds_in_range_plan(files, tmp_path):
    profile, _ = files
    assert main([str(a) for a in _plan_args(profile, tmp_path / "o.json", "--device-speeds", "1,0.5")]) == 0
    assert load_plan(tmp_path / "o.json").constraints["device_speeds"] == [1.0, 0.5]


def test_error_lines_echo_values_truncated(tmp_path, capsys):
    huge = "y" * 100_000
    assert_fails(capsys, ["show", tmp_path / huge[:200]], "JSON file not found")
    bad = tmp_path / "fmt.json"
    bad.write_text(json.dumps({"format": huge}))
    code = main(["show", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and len(err) <= 301 and err.endswith("...\n"), err


# --- defect 5: bounded work -------------------------------------------------------------------------------


def test_work_past_the_limits_is_refused_at_once(files, tmp_path, capsys):
    profile, _ = files
    started = time.monotonic()
    assert_fails(capsys, ["simulate", "--stages", "4", "--microbatches", "1000000"], "in 1..1,024")
    assert_fails(
        capsys, ["plan", profile, "--stages", "2", "--global-batch", "1000000", "--out", tmp_path / "o"], "in 1..65,536"
    )
    assert_fails(
        capsys,
        ["plan", profile, "--stages", "2", "--global-batch", "4096", "--out", tmp_path / "o"],
        "micro-batches (global batch 4096 / micro-batch size 1) is 4,096, over pipeplan's limit of 1,024",
    )
    assert time.monotonic() - started < 10
    data = make_profile([1.0] * 8, sizes=(1,)).to_dict()
    for units, message in (
        (2 * MAX_UNITS, f"{2 * MAX_UNITS:,} units, over pipeplan's limit of {MAX_UNITS:,}"),
        (60_000, "60,000 units, over pipeplan's limit"),
    ):
        data["units"] = [{**data["units"][0], "name": f"u{i}"} for i in range(units)]
        path = tmp_path / f"big{units}.json"
        path.write_text(json.dumps(data))  # compact: 60,000 units in 17 MB
        started = time.monotonic()
        assert_fails(capsys, ["plan", path, "--stages", "2", "--global-batch", "4", "--out", tmp_path / "o"], message)
        assert time.monotonic() - started < 10


def test_simulate_at_the_microbatch_limit_finishes(capsys):
    started = time.monotonic()
    assert main(["simulate", "--stages", "4", "--microbatches", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_s"] == pytest.approx(2 * (1024 + 3))
    assert time.monotonic() - started < 20
