"""A plan's stages under other schedules, on the footing of the plan's own prediction: the same runtime terms
(co-location, step tails, resume), and each schedule's overhead per action from the calibration the plan was
predicted with (recorded in the plan, ``predicted.schedule_overhead_s``; for a plan made before it was, the
calibration the plan names, where it can still be found), so that ``simulate PLAN --compare`` and ``plan`` never
disagree about the plan's schedule."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from planner.calibration import Calibration, load_calibration, shipped_calibration
from planner.errors import PipeplanError
from planner.plan import Plan
from planner.schedule.orders import Schedule
from planner.schedule.simulate import SimulationResult
from planner.schedule.what_if import compare_schedules

__all__ = ["plan_calibration", "compare_plan"]


def plan_calibration(plan: Plan) -> Calibration | None:
    """The calibration named in the plan (``constraints.calibration``: ``shipped`` or a file that still exists),
    None when the plan had none or the file is gone."""
    label = str(plan.constraints.get("calibration", plan.predicted.calibration))
    try:
        if label == "shipped":
            return shipped_calibration(str(plan.device.get("kind", "cpu")))
        if label not in ("none", "") and Path(label).is_file():
            return load_calibration(label)
    except PipeplanError:
        return None
    return None


def compare_plan(
    plan: Plan, schedules: Sequence[Schedule], virtual_stages: int | None = None
) -> list[SimulationResult]:
    """Each of ``schedules`` run on the plan's stages (``compare_schedules``); the plan's own schedule gives
    exactly the plan's predicted iteration."""
    recorded = plan.predicted.schedule_overhead_s
    calibration = None if recorded else plan_calibration(plan)

    def overhead_of(schedule: Schedule, stages_per_rank: int) -> float | None:
        if schedule.value in recorded:
            return recorded[schedule.value][stages_per_rank > 1]
        if calibration is not None:
            return calibration.overhead_for(schedule, stages_per_rank, plan.num_microbatches)
        return None  # the plan's own overhead

    return compare_schedules(plan.pipeline(), schedules, virtual_stages, overhead_of)
