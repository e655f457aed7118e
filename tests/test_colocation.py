"""Co-located profiling: the neighbour processes compute only while asked, at the size asked; a profile
made with them says so and takes no co-location factor from the calibration (profiles/colocation.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from planner.calibration import shipped_calibration
from planner.cost import default_settings
from planner.errors import ProfilingError, UsageError
from planner.runtime.replay import profiled_neighbours
from planner.search import PlanRequest, make_plan
from profiles.colocation import Colocation, Neighbours
from profiles.profiler import profile_model
from profiles.workload import load_workload

SPEC = f"{Path(__file__).with_name('step_log_model.py')}:workload"
FAST = {"repeats": 1, "warmup": 0, "progress": False, "min_time_s": 0.0}


@pytest.fixture
def step_log(tmp_path, monkeypatch) -> Path:
    log = tmp_path / "steps.log"
    log.touch()
    monkeypatch.setenv("PIPEPLAN_TEST_STEP_LOG", str(log))  # the spawned neighbours inherit it
    return log


def _steps(log: Path) -> list[tuple[int, int]]:
    return [(int(pid), int(size)) for pid, size in (line.split() for line in log.read_text().splitlines())]


def test_neighbours_compute_only_while_running_and_at_the_size_asked(step_log):
    with Neighbours(Colocation(SPEC, ranks=3, threads=1)) as neighbours:
        time.sleep(0.2)
        assert _steps(step_log) == []  # built, and idle until asked
        with neighbours.running(3):
            time.sleep(0.3)
        stopped = _steps(step_log)
        time.sleep(0.3)
        assert _steps(step_log) == stopped  # "stopped" was answered: nothing runs after it
        with neighbours.running(5):
            time.sleep(0.3)
    steps = _steps(step_log)
    assert len({pid for pid, _ in stopped}) == 2  # ranks - 1 neighbours
    assert {size for _, size in stopped} == {3}
    assert {size for _, size in steps[len(stopped) :]} == {5}


def test_a_neighbour_that_cannot_build_the_model_is_one_error_not_a_hang(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("def workload():\n    raise RuntimeError('no model here')\n")
    started = time.monotonic()
    with pytest.raises(ProfilingError, match="neighbour exited with code 1"):
        Neighbours(Colocation(f"{bad}:workload", ranks=2, threads=1))
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("ranks, threads", [(1, 1), (2, 0)])
def test_colocation_needs_two_ranks_and_a_thread(ranks, threads):
    with pytest.raises(UsageError):
        Colocation(SPEC, ranks=ranks, threads=threads)


def test_a_co_located_profile_holds_the_slowdown_itself(step_log):
    torch.set_num_threads(1)
    colocated = profile_model(load_workload(SPEC), micro_batch_sizes=(1, 2), colocation=Colocation(SPEC, 2, 1), **FAST)
    neighbour_sizes = {size for pid, size in _steps(step_log) if pid != os.getpid()}
    assert neighbour_sizes == {1, 2}  # the neighbour ran at each size the profile measured
    alone = profile_model(load_workload(SPEC), micro_batch_sizes=(1, 2), **FAST)
    assert (colocated.settings["neighbours"], alone.settings["neighbours"]) == (1, 0)
    cal = shipped_calibration("cpu")
    assert cal.colocation_factor > 1.0
    assert default_settings(colocated, calibration=cal).calibration.colocation_factor == 1.0
    assert default_settings(alone, calibration=cal).calibration.colocation_factor == cal.colocation_factor
    # The plan carries it, and a replay runs the neighbour beside it at the plan's micro-batch size.
    plan = make_plan(colocated, PlanRequest(num_ranks=2, global_batch_size=4, micro_batch_size=2), sha256="0" * 64)
    assert (plan.profile_neighbours, make_plan(alone, PlanRequest(2, 4), sha256="0" * 64).profile_neighbours) == (1, 0)
    step_log.write_text("")
    with profiled_neighbours(plan, SPEC, torch.device("cpu")):
        time.sleep(0.5)
    assert {size for pid, size in _steps(step_log) if pid != os.getpid()} == {2}


def test_co_location_is_refused_for_a_meta_profile():
    with pytest.raises(UsageError, match="not --meta"):
        profile_model(load_workload("mlp", meta=True), colocation=Colocation("mlp", 2, 1), **FAST)
