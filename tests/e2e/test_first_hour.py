"""A new user's first hour: every option explained, acted on or refused, in one vocabulary, and the commands
never contradicting each other."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from cli import build_parser, main
from cli_checks import assert_fails
from planner.export import export_plan
from planner.plan import load_plan
from profiles.format import save_profile
from synthetic import calibration, make_profile


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "model.profile.json"
    save_profile(make_profile([1.0] * 7 + [4.0], sizes=(1, 2), weight_share=0.4), path)
    return path


@pytest.fixture
def plan_file(profile_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", str(profile_file), "--ranks", "2", "--global-batch", "4", "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_option_has_help(command: str) -> None:
    parser = _commands()[command]
    silent = [
        a.option_strings[0] if a.option_strings else a.dest
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()
    ]
    assert silent == [], f"pipeplan {command}: options without help: {silent}"
    text = parser.format_help()
    # Defaults are shown: an option with a non-trivial default says it.
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False) and action.nargs != 0:
            assert "default" in (parser._get_formatter()._get_help_string(action) or ""), action.option_strings
    # tune's help no longer mentions an option it lacks; plan and check take the devices
    assert "--devices" not in text or command in ("plan", "check")


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("pipeplan ")


def test_a_top_level_error_names_the_tool_once(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--bogus"])
    err = capsys.readouterr().err
    assert err.startswith("pipeplan: error:") and "pipeplan pipeplan" not in err


@pytest.mark.parametrize("schedule", ["1f1b", "zero-bubble", "gpipe"])
def test_compare_reproduces_the_plans_prediction(profile_file, tmp_path, capsys, schedule: str) -> None:
    out = tmp_path / "plan.json"
    argv = ["plan", str(profile_file), "--ranks", "2", "--global-batch", "4", "--schedule", schedule]
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    plan = load_plan(out)
    assert plan.predicted.runtime.action_overhead_s > 0  # the shipped calibration's terms are in the prediction
    from planner.compare import compare_plan
    from planner.schedule.orders import Schedule

    results = compare_plan(plan, [Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE, Schedule.ZBV])
    own = next(r for r in results if r.schedule is plan.schedule)
    assert own.iteration_s == plan.predicted.iteration_s
    # The others carry the same runtime terms: each pays its calibrated per-action overhead on every action.
    assert all(sum(r.overhead_s) > 0 for r in results)
    assert main(["simulate", str(out), "--compare", "gpipe,1f1b,zero-bubble,zbv"]) == 0
    printed = capsys.readouterr().out
    assert "the plan's runtime terms" in printed


def test_compare_ranks_the_schedules_as_plan_did_with_the_profiles_own_calibration(tmp_path, capsys) -> None:
    # What `pipeplan profile` learned (per-schedule overheads far apart) is in no file: the plan records each
    # schedule's overhead, and --compare gives every schedule what `plan --schedule` predicts for the same stages
    # (two units: one cut), zero-bubble's with the measured split of the backward that the GPipe plan records.
    overheads = {"gpipe": 1e-3, "1f1b": 5e-3, "zero-bubble": 9e-3}
    learned = calibration(action_overhead_s=overheads).to_dict()
    path = tmp_path / "learned.profile.json"
    profile = make_profile([1.0, 1.0], sizes=(1,), weight_share=0.4)
    save_profile(dataclasses.replace(profile, pipeline_calibration=learned), path)
    planned = {}
    for schedule in overheads:
        out = tmp_path / f"{schedule}.plan.json"
        argv = ["plan", str(path), "--ranks", "2", "--global-batch", "4", "--schedule", schedule, "--out", str(out)]
        assert main(argv) == 0
        planned[schedule] = load_plan(out)
    capsys.readouterr()
    from planner.compare import compare_plan
    from planner.schedule.orders import Schedule

    gpipe = planned["gpipe"]
    assert gpipe.predicted.calibration == "learned while profiling"
    assert gpipe.predicted.schedule_overhead_s["1f1b"] == (5e-3, 5e-3)
    assert [s.input_s is not None for s in gpipe.stages] == [True, True]
    results = compare_plan(gpipe, [Schedule(s) for s in overheads])
    assert [r.iteration_s for r in results] == pytest.approx([p.predicted.iteration_s for p in planned.values()])
    # At the GPipe plan's own overhead (1 ms an action) 1F1B would come out 4 ms too fast on each action of its
    # critical path (at least a forward and a backward of each of the 4 micro-batches).
    from planner.schedule.what_if import compare_schedules

    at_own = compare_schedules(gpipe.pipeline(), [Schedule.ONE_F_ONE_B])[0]
    assert results[1].iteration_s >= at_own.iteration_s + 4e-3 * 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--schedule", "gpipe"], "--schedule: what-if options"),
        (["--ranks", "8"], "--ranks: what-if options"),
        (["--stages", "8"], "--ranks: what-if options"),
        (["--out", "tl.jpg"], "a chart is written as .png, .svg, .pdf"),
        (["--compare-out", "c.png"], "--compare-out draws the schedules of --compare"),
    ],
)
def test_simulate_refuses_options_that_would_do_nothing(plan_file, capsys, extra, message) -> None:
    assert_fails(capsys, ["simulate", plan_file, *extra], message)


def test_what_if_options_are_checked(capsys) -> None:
    argv = ["simulate", "--ranks", "2", "--micro-batches", "4", "--schedule", "1f1b", "--virtual-stages", "3"]
    assert_fails(capsys, argv, "runs one stage per rank")


def test_charts_are_written_in_the_format_their_name_says(plan_file, tmp_path, capsys) -> None:
    svg = tmp_path / "timeline.svg"
    assert main(["simulate", str(plan_file), "--out", str(svg)]) == 0
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()


def test_plan_refuses_cluster_options_without_devices(profile_file, existing, capsys) -> None:
    argv = ["plan", profile_file, "--ranks", "2", "--global-batch", "4", "--devices-per-node", "8"]
    assert_fails(capsys, [*argv, "--out", existing], "--devices-per-node: options of a cluster plan", existing)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--memory", "10"], "bytes is not a device's memory: give a unit, e.g. 10GiB"),
        (["--memory", "-1GiB"], "must be a positive memory size"),
        (["--bandwidth", "10"], "is not a bandwidth"),
        (["--bandwidth", "-5GB/s"], "must be a positive bandwidth"),
    ],
)
def test_units_are_read_as_units(profile_file, existing, capsys, extra, message) -> None:
    argv = ["plan", profile_file, "--ranks", "2", "--global-batch", "4", *extra, "--out", existing]
    assert_fails(capsys, argv, message, existing)


def test_bit_rates_and_byte_rates(profile_file, tmp_path, capsys) -> None:
    written = {}
    for rate in ("10Gbps", "1.25GB/s"):
        out = tmp_path / f"{rate.replace('/', '_')}.json"
        argv = ["plan", str(profile_file), "--ranks", "2", "--global-batch", "4", "--bandwidth", rate]
        assert main([*argv, "--calibration", "none", "--out", str(out)]) == 0
        written[rate] = json.loads(out.read_text())["constraints"]["link_bytes_per_s"]
    assert written == {"10Gbps": 1.25e9, "1.25GB/s": 1.25e9}


def test_ranks_and_stages_name_the_same_option(profile_file, tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["plan", str(profile_file), "--ranks", "2", "--global-batch", "4", "--out", str(a)]) == 0
    assert main(["plan", str(profile_file), "--stages", "2", "--global-batch", "4", "--out", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_cpu_ranks_share_the_machines_memory(profile_file, tmp_path) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", str(profile_file), "--ranks", "4", "--global-batch", "8", "--out", str(out)]) == 0
    constraints = json.loads(out.read_text())["constraints"]
    assert constraints["device_memory_bytes"] == [64 * 1024**3 // 4]


def test_plan_says_what_a_short_pipeline_costs_and_what_comes_next(profile_file, tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    argv = ["plan", str(profile_file), "--ranks", "4", "--global-batch", "2", "--schedule", "gpipe"]
    assert main([*argv, "--micro-batch-size", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: 2 micro-batches for 4 ranks" in printed and "a --global-batch of 4 or more" in printed
    assert f"next: pipeplan simulate {out}" in printed and f"pipeplan verify {out}" in printed


def test_a_plan_for_megatron_is_one_megatron_takes(tmp_path, capsys) -> None:
    base = make_profile([0.5] + [1.0] * 6 + [0.2, 2.0], sizes=(1, 2))
    names = ["embed", *(f"decoder.layers.{i}" for i in range(6)), "final_norm", "output"]
    units = tuple(dataclasses.replace(u, name=n) for u, n in zip(base.units, names, strict=True))
    profile = dataclasses.replace(base, units=units)
    path = tmp_path / "t.profile.json"
    save_profile(profile, path)
    free, megatron = tmp_path / "free.json", tmp_path / "megatron.json"
    argv = ["plan", str(path), "--ranks", "3", "--global-batch", "6"]
    assert main([*argv, "--out", str(free)]) == 0
    assert main([*argv, "--for", "megatron", "--out", str(megatron)]) == 0
    plan = load_plan(megatron)
    # The head is heavy: unconstrained, the planner gives it a stage of its own, without the final norm.
    assert load_plan(free).stages[-1].units == ("output",)
    assert plan.stages[-1].units[-2:] == ("final_norm", "output")
    assert plan.schedule.value in ("1f1b", "interleaved-1f1b")
    assert "--pipeline-model-parallel-layout" in export_plan(plan, "megatron").text()
    assert f"pipeplan export {megatron} --to megatron" in capsys.readouterr().out


def test_show_picks_a_profiles_micro_batch_size(profile_file, capsys) -> None:
    assert main(["show", str(profile_file), "--micro-batch-size", "all"]) == 0
    printed = capsys.readouterr().out
    assert "micro-batch size 1:" in printed and "micro-batch size 2:" in printed
    assert main(["show", str(profile_file)]) == 0
    assert "micro-batch size 1 (also profiled: 2; show --micro-batch-size N|all):" in capsys.readouterr().out
    assert_fails(capsys, ["show", profile_file, "--micro-batch-size", "8"], "micro-batch size 8 was not profiled")


def test_a_rename_that_matches_nothing_is_refused(plan_file, capsys) -> None:
    assert_fails(capsys, ["export", plan_file, "--to", "deepspeed", "--rename", "nothere=x"], "no unit's name starts")
