"""``pipeplan simulate``'s options, declared once (planner/options.py), and :func:`simulate`, what the command
does with them: a plan's pipeline, or one given by hand (a what-if), simulated and, with ``compare``, the
same stages under other schedules."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from planner.compare import compare_plan
from planner.errors import UsageError
from planner.limits import MAX_MICROBATCHES, MAX_RANKS, check_simulation
from planner.options import check_fields, float_list, int_range, items, option, positive_float
from planner.plan import Plan, load_plan
from planner.schedule.orders import Schedule
from planner.schedule.simulate import SimulationResult
from planner.schedule.simulate import simulate as simulate_pipeline
from planner.schedule.what_if import compare_schedules, what_if_pipeline

__all__ = ["SimulateOptions", "Simulated", "simulate"]

MAX_COMPARED = 8
"""Schedules ``--compare`` may name."""


@dataclass(frozen=True, kw_only=True)
class SimulateOptions:
    plan: str | None = option(
        None, positional=True, metavar="PLAN.json", help="a plan (or none, for a what-if: the options below)"
    )
    out: str | None = option(
        None,
        flag=("--out", "--png"),
        metavar="timeline.png",
        help="write a Gantt chart: .png, .svg or .pdf by the file's suffix (default: none)",
    )
    json: bool = option(False, help="print the numbers as JSON")
    compare: str | None = option(
        None,
        metavar="gpipe,1f1b,...",
        help="the same stages under each of these schedules, on the plan's footing (default: none)",
    )
    compare_out: str | None = option(
        None,
        flag=("--compare-out", "--compare-png"),
        metavar="schedules.png",
        help="with --compare: write the schedules' Gantt charts stacked, .png, .svg or .pdf (default: none)",
    )
    ranks: int | None = option(
        None, flag=("--ranks", "--stages"), parse=int_range(1, MAX_RANKS), help="what-if: ranks P"
    )
    micro_batches: int | None = option(
        None,
        flag=("--micro-batches", "--microbatches"),
        parse=int_range(1, MAX_MICROBATCHES),
        help="what-if: micro-batches M",
    )
    schedule: str | None = option(
        None,
        choices=[x.value for x in Schedule],
        help="what-if: the schedule; naive runs one micro-batch through the stages in turn, no pipelining, "
        "the baseline the bubble is measured against (default 1f1b)",
    )
    virtual_stages: int | None = option(
        None,
        parse=int_range(1, 16),
        help="what-if: stages per rank of interleaved-1f1b, looped-bfs (default 2) and zero-bubble (default 1); "
        "zbv and dualpipev always run 2",
    )
    stage_times: tuple[float, ...] | None = option(
        None,
        parse=float_list,
        unit="s",
        metavar="1,1,2,1",
        help="what-if: forward seconds per stage, or one value for every stage (default: 1 each)",
    )
    backward_times: tuple[float, ...] | None = option(
        None,
        parse=float_list,
        unit="s",
        metavar="SECONDS,...",
        help="what-if: backward seconds per stage; with --weight-times, its input-gradient part B (the full "
        "backward is B + W) (default: --backward-ratio x forward)",
    )
    weight_times: tuple[float, ...] | None = option(
        None,
        parse=float_list,
        unit="s",
        metavar="SECONDS,...",
        help="what-if: weight-gradient seconds W per stage: split-backward schedules (zero-bubble, zbv, dualpipev) "
        "run it apart (default: none, the backward stays unsplit)",
    )
    backward_ratio: float = option(
        1.0,
        parse=positive_float,
        help="what-if: backward = ratio x forward when --backward-times is not given (default 1)",
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Simulated:
    """What :func:`simulate` found: the iteration, the same stages under the compared schedules, the plan."""

    result: SimulationResult
    compared: list[SimulationResult]
    plan: Plan | None


def _compared(options: SimulateOptions) -> list[Schedule]:
    if not options.compare:
        return []
    try:
        names = items(options.compare, MAX_COMPARED)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--compare {exc}") from None
    return [Schedule.parse(name) for name in names]


def simulate(options: SimulateOptions) -> Simulated:
    """Simulate ``options.plan`` (a PLAN.json) or the what-if pipeline the options describe.

    Raises:
        UsageError: neither a plan nor ``ranks`` and ``micro_batches``; a what-if the limits refuse.
    """
    compare = _compared(options)
    plan = None
    if options.plan:
        plan = load_plan(options.plan)
        pipeline = plan.pipeline()
        check_simulation(pipeline.num_stages, pipeline.num_microbatches)
        compared = compare_plan(plan, compare) if compare else []
    elif not options.ranks or not options.micro_batches:
        raise UsageError("give a PLAN.json, or --ranks and --micro-batches for a what-if simulation")
    else:
        pipeline = what_if_pipeline(
            options.ranks,
            options.micro_batches,
            Schedule.parse(options.schedule or "1f1b"),
            virtual_stages=options.virtual_stages,
            stage_times=options.stage_times,
            backward_times=options.backward_times,
            weight_times=options.weight_times,
            backward_ratio=options.backward_ratio,
        )
        check_simulation(pipeline.num_stages, pipeline.num_microbatches)
        compared = compare_schedules(pipeline, compare, options.virtual_stages) if compare else []
    return Simulated(simulate_pipeline(pipeline), compared, plan)
