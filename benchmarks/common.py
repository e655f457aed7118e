"""What every benchmark shares: one profile -> one partition problem, scoring any boundaries, the bound.

All partitions, pipeplan's and the peers', are judged here by the same cost model
(``planner.cost.build_problem``) and the same event simulator (``planner.schedule.simulate.simulate``), so a
ratio between two rows is a ratio of two simulations of the same profile.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.cost import CostSettings, UnitCosts, build_problem, default_settings, unit_costs  # noqa: E402
from planner.schedule.orders import Schedule, stage_to_rank  # noqa: E402
from planner.schedule.pipeline import Pipeline  # noqa: E402
from planner.schedule.simulate import in_flight_per_stage  # noqa: E402
from profiles.format import Profile  # noqa: E402
from solvers.problem import PartitionProblem, evaluate, stage_cost  # noqa: E402

__all__ = ["Setting", "Score", "make_setting", "score", "lower_bound_s", "stage_sizes"]


@dataclass(frozen=True)
class Setting:
    """One (profile, micro-batch size, P, M, schedule) on which partitions are compared."""

    profile: Profile
    costs: UnitCosts
    problem: PartitionProblem
    schedule: Schedule
    micro_batch_size: int
    num_stages: int
    num_microbatches: int


@dataclass(frozen=True)
class Score:
    boundaries: tuple[int, ...]
    iteration_s: float
    """Simulated iteration of the schedule, communication included."""
    formula_s: float
    """The solvers' declared objective for the same partition (inf: does not fit in memory)."""
    peak_memory_bytes: float
    fits: bool


def make_setting(
    profile: Profile,
    micro_batch_size: int,
    num_stages: int,
    num_microbatches: int,
    *,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    settings: CostSettings | None = None,
    recompute_choices: tuple[bool, ...] = (False,),
) -> Setting:
    """The partition problem of one stage per rank under ``schedule`` (in-flight counts from the simulator)."""
    costs = unit_costs(profile, micro_batch_size)
    problem = build_problem(
        profile,
        costs,
        settings or default_settings(profile),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        in_flight=in_flight_per_stage(schedule, num_stages, num_microbatches, num_stages),
        stage_rank=stage_to_rank(schedule, num_stages, num_stages),
        recompute_choices=recompute_choices,
        schedule=schedule,
    )
    return Setting(profile, costs, problem, schedule, micro_batch_size, num_stages, num_microbatches)


def score(setting: Setting, boundaries: tuple[int, ...], recompute: tuple[bool, ...] | None = None) -> Score:
    """Simulate ``boundaries`` (first unit of every stage) in ``setting``; memory checked against its cap."""
    p = setting.problem
    recompute = recompute or (False,) * p.num_stages
    n = p.num_units
    ends = [*boundaries[1:], n]
    forward, backward = [], []
    for s, (i, j) in enumerate(zip(boundaries, ends, strict=True)):
        f = sum(p.forward_s[i:j])
        forward.append(f)
        backward.append(sum(p.backward_s[i:j]) + (f if recompute[s] else 0.0))
    cuts = [b - 1 for b in boundaries[1:]]
    sim = Pipeline(
        schedule=setting.schedule,
        num_ranks=p.num_stages,
        num_microbatches=p.num_microbatches,
        forward_s=forward,
        backward_s=backward,
        comm_forward_s=[p.cut_forward_s[c] for c in cuts] if p.cut_forward_s else (),
        comm_backward_s=[p.cut_backward_s[c] for c in cuts] if p.cut_backward_s else (),
    ).simulate()
    objective, _ = evaluate(p, tuple(boundaries), tuple(recompute))
    peak = max(
        stage_cost(p, s, i, j - 1, recompute[s]).memory_bytes
        for s, (i, j) in enumerate(zip(boundaries, ends, strict=True))
    )
    return Score(tuple(boundaries), sim.iteration_s, objective, peak, objective != float("inf"))


def lower_bound_s(costs: UnitCosts, num_stages: int, num_microbatches: int) -> float:
    """``W + (M - 1) * max(W / P, largest unit)``, W the forward+backward work of one micro-batch.

    No communication: one micro-batch must cross all the work (W), and the M - 1 others leave at
    least at the rate of the busiest stage, which holds at least W / P and at least the largest unit.
    """
    per_unit = [f + b for f, b in zip(costs.forward_s, costs.backward_s, strict=True)]
    work = sum(per_unit)
    return work + (num_microbatches - 1) * max(work / num_stages, max(per_unit))


def stage_sizes(boundaries: tuple[int, ...], num_units: int) -> tuple[int, ...]:
    """Units per stage, e.g. (0, 5, 9) of 12 units -> (5, 4, 3)."""
    ends = [*boundaries[1:], num_units]
    return tuple(j - i for i, j in zip(boundaries, ends, strict=True))
