"""``import planner``: the front door a training script uses, lazily imported (planner/__init__.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from cli import main
from planner.errors import PlanInfeasibleError
from synthetic import make_profile, transformer_profile

ROOT = Path(__file__).resolve().parents[1]


def test_importing_the_front_door_imports_no_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, planner; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("name", planner.__all__)
def test_every_front_door_name_is_its_module_s_own(name: str) -> None:
    value = getattr(planner, name)
    assert value is getattr(importlib.import_module(planner._FRONT_DOOR[name]), name)
    assert name in dir(planner)


def test_a_name_not_in_the_front_door_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'plan_everything'"):
        planner.plan_everything  # noqa: B018


def test_help_lists_the_front_door() -> None:
    text = planner.__doc__ or ""
    listed = [name for name in planner.__all__ if name in text]
    assert listed == planner.__all__


def test_plan_profile_gives_the_plan_the_command_writes(tmp_path: Path) -> None:
    profile = make_profile([1.0, 2.0, 3.0, 1.0, 2.0, 1.0], sizes=(1, 2))
    path = tmp_path / "p.json"
    planner.save_profile(profile, path)
    out = tmp_path / "plan.json"
    assert main(["plan", str(path), "--ranks", "2", "--global-batch", "4", "--out", str(out)]) == 0
    planned = planner.plan_profile(path, planner.PlanOptions(ranks=2, global_batch=4))
    planner.save_plan(planned.plan, tmp_path / "api.json")
    assert (tmp_path / "api.json").read_bytes() == out.read_bytes()
    assert planned.cluster is None
    # From a Profile object the plan is the same, less the file's digest it cannot know.
    again = planner.plan_profile(profile, planner.PlanOptions(ranks=2, global_batch=4))
    assert again.plan.stages == planned.plan.stages and again.plan.profile_sha256 is None


def test_check_config_gives_the_plan_and_report_the_command_writes(tmp_path: Path, capsys) -> None:
    profile = transformer_profile("gpt2", layers=4, sizes=(1, 2))
    path, config, out = tmp_path / "p.json", tmp_path / "mlm.args", tmp_path / "mine.json"
    planner.save_profile(profile, path)
    config.write_text("--pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 8")
    assert main(["check", str(path), "--from", "megatron", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = planner.check_config(path, "megatron", config.read_text(), planner.CheckOptions())
    planner.save_plan(result.plan, tmp_path / "api.json")
    assert (tmp_path / "api.json").read_bytes() == out.read_bytes()
    assert result.fits and result.best is not None and result.speedup is not None and result.speedup >= 1.0
    assert planner.format_check(result) in printed


def test_plan_profile_over_a_cluster_returns_its_layouts(tmp_path: Path) -> None:
    profile = make_profile([1.0] * 8, sizes=(1, 2))
    planned = planner.plan_profile(
        profile, planner.PlanOptions(global_batch=8), planner.ClusterOptions(devices=4, jobs=1)
    )
    assert planned.cluster is not None and planned.plan.mesh is not None
    assert planned.plan is planned.cluster.plan
    assert planned.plan.mesh.used_devices <= 4


def test_plan_profile_raises_the_library_s_errors() -> None:
    profile = make_profile([1.0] * 4, sizes=(1,))
    with pytest.raises(PlanInfeasibleError):
        planner.plan_profile(profile, planner.PlanOptions(ranks=2, global_batch=4, memory_bytes=1))
