"""The search's floors (planner/bounds.py) lie under every simulation they claim to bound."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.bounds import (
    UnitWork,
    candidate_floor_s,
    order_ceiling_s,
    order_floor_s,
    partition_floor_s,
    partition_order_floor_s,
)
from planner.cost import CostSettings, build_problem, unit_costs
from planner.errors import ScheduleError
from planner.schedule.orders import Schedule, check_microbatches, stage_to_rank
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, in_flight_per_stage, simulate
from solvers.ilp import solve_ilp
from synthetic import make_profile


def _partitions(num_units: int, num_stages: int) -> list[tuple[int, ...]]:
    return [(0, *cuts) for cuts in itertools.combinations(range(1, num_units), num_stages - 1)]


def _cases() -> list[tuple[Schedule, int, int, int]]:
    """(schedule, ranks, stages per rank, micro-batches) that torch accepts, small enough to enumerate."""
    found = []
    for schedule in Schedule:
        for ranks, v, m in itertools.product((2, 3), (1, 2), (1, 2, 3, 4, 6)):
            if (v > 1) != schedule.multi_stage or (schedule.v_shape and v != 2):
                continue
            try:
                check_microbatches(schedule, ranks, v, m)
            except ScheduleError:
                continue
            found.append((schedule, ranks, v, m))
    return found


@pytest.mark.parametrize("schedule, ranks, v, m", _cases(), ids=lambda x: str(x))
def test_floors_lie_under_every_partition_simulated(schedule: Schedule, ranks: int, v: int, m: int) -> None:
    rng = random.Random(f"{schedule.value}-{ranks}-{v}-{m}")
    num_stages = ranks * v
    num_units = num_stages + 3
    forward = [rng.uniform(0.1, 2.0) for _ in range(num_units)]
    backward = [f * rng.uniform(1.0, 3.0) for f in forward]
    weight = [b * rng.uniform(0.2, 0.6) for b in backward]
    inputs = [(b - w) * rng.uniform(0.9, 1.3) for b, w in zip(backward, weight, strict=True)]
    split = schedule.splits_backward
    work = UnitWork.of(forward, backward, inputs, weight) if split else UnitWork.of(forward, backward)
    floor = candidate_floor_s(work, m, ranks, num_stages)
    orders_floor = order_floor_s(schedule, ranks, num_stages, m, forward, backward)
    stage_rank = stage_to_rank(schedule, num_stages, ranks)
    terms = RuntimeTerms(0.05, tuple(rng.uniform(0, 1) for _ in range(ranks)), rng.choice((0.8, 1.0, 1.3)))
    fastest = float("inf")
    paths: list[tuple[float, float]] = []
    for bounds in _partitions(num_units, num_stages):
        stages = [range(a, b) for a, b in zip(bounds, (*bounds[1:], num_units), strict=True)]
        f = [sum(forward[u] for u in units) for units in stages]
        b = [sum(backward[u] for u in units) for units in stages]
        # torch's split: the first stage runs its whole backward as W (planner/cost.split_backward_times)
        i = [0.0] + [sum(inputs[u] for u in units) for units in stages[1:]]
        w = [b[0]] + [sum(weight[u] for u in units) for units in stages[1:]]
        kwargs = {"weight_s": w, "input_s": i} if split else {}
        plain = simulate(Pipeline(f, b, m, schedule, num_ranks=ranks, **kwargs)).iteration_s
        timed = simulate(Pipeline(f, b, m, schedule, num_ranks=ranks, runtime=terms, **kwargs)).iteration_s
        fastest = min(fastest, plain)
        stage_work = [x + (min(y, p + q) if split else y) for x, y, p, q in zip(f, b, i, w, strict=True)]
        chain = f if split else [x + y for x, y in zip(f, b, strict=True)]
        assert partition_floor_s(stage_work, chain, stage_rank, m) <= plain * (1 + 1e-9)
        assert partition_floor_s(stage_work, chain, stage_rank, m, stage_forward_s=f) <= plain * (1 + 1e-9)
        with_terms = partition_floor_s(
            stage_work,
            chain,
            stage_rank,
            m,
            stage_forward_s=f,
            compute_scale=terms.compute_scale,
            action_overhead_s=terms.action_overhead_s,
            step_tail_s=terms.step_tail_s,
        )
        assert with_terms <= timed * (1 + 1e-9)
        # Fact 4 at this partition: over the programme's optimum, under its simulation (plain and timed).
        path = partition_order_floor_s(schedule, ranks, m, f, b)
        timed_path = partition_order_floor_s(
            schedule,
            ranks,
            m,
            f,
            b,
            compute_scale=terms.compute_scale,
            action_overhead_s=terms.action_overhead_s,
            step_tail_s=terms.step_tail_s,
        )
        assert orders_floor <= path * (1 + 1e-9) and path <= plain * (1 + 1e-9)
        assert timed_path <= timed * (1 + 1e-9)
        paths.append((path, plain))
    assert floor <= fastest * (1 + 1e-9)
    if not split:  # the path at a partition is its simulation but for the actions between the kept ones
        assert min(plain - path for path, plain in paths) < 0.05 * fastest
    assert orders_floor <= fastest * (1 + 1e-9)
    # The programme's value at equal stages: over its optimum, under the simulation of equal stages (the programme
    # keeps some of the orders' edges, the simulation all of them).
    ceiling = order_ceiling_s(schedule, ranks, num_stages, m, forward, backward)
    if split:
        assert ceiling == orders_floor == 0.0
    else:
        equal = [sum(forward) / num_stages] * num_stages, [sum(backward) / num_stages] * num_stages
        even = simulate(Pipeline(*equal, m, schedule, num_ranks=ranks)).iteration_s
        assert 0 < orders_floor <= ceiling * (1 + 1e-9) and ceiling <= even * (1 + 1e-9)


def test_the_chain_floor_is_the_bubble_of_gpipe_on_equal_stages() -> None:
    # Four equal units on four ranks, M = 4: any partition simulates at least 1.46 x M * W / P, and the
    # even one (GPipe, F = B / 2) takes (M + P - 1) * (F + B) = 7 units: the floor is not loose by much.
    work = UnitWork.of([1.0] * 4, [2.0] * 4)
    floor = candidate_floor_s(work, 4, 4, 4)
    assert floor == pytest.approx(12.0 / (1 - 0.75**4))
    assert floor == pytest.approx(17.55, abs=0.01)
    assert simulate(Pipeline([1.0] * 4, [2.0] * 4, 4, "gpipe")).iteration_s == pytest.approx(21.0)


def test_split_backward_chain_counts_only_forwards() -> None:
    work = UnitWork.of([1.0, 2.0], [3.0, 2.0], [1.0, 1.0], [1.0, 0.5])
    assert work.work_s == (3.0, 3.5)  # the split parts, cheaper than the full backward
    assert work.chain_fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 4, 8), (2, 2, 4), (8, 2, 16)])
def test_the_rank_floor_is_megatrons_interleaved_bubble_on_equal_chunks(p: int, v: int, m: int) -> None:
    # f = b = 1 a chunk: torch's interleaved 1F1B takes 2 (v M + P - 1), the no-bubble work 2 v M; the last
    # rank's first stage waits for P - 1 forwards and its last is followed by P - 1 backwards, so fact 3
    # is exact here, where the stage-level facts stay near the no-bubble bound.
    stages = p * v
    stage_rank = stage_to_rank(Schedule.INTERLEAVED_1F1B, stages, p)
    work, chain, forward = [2.0] * stages, [2.0] * stages, [1.0] * stages
    simulated = simulate(Pipeline([1.0] * stages, [1.0] * stages, m, "interleaved-1f1b", num_ranks=p)).iteration_s
    assert simulated == 2 * (v * m + p - 1)
    assert partition_floor_s(work, chain, stage_rank, m, stage_forward_s=forward) == pytest.approx(simulated)
    assert partition_floor_s(work, chain, stage_rank, m) < simulated * (1 - 0.5 * (p - 1) / (v * m + p - 1))


@pytest.mark.parametrize(("schedule", "p", "v", "m"), [("interleaved-1f1b", 2, 4, 2), ("looped-bfs", 2, 2, 4)])
def test_the_orders_floor_keeps_the_interleaved_bubble_before_any_partition(
    schedule: str, p: int, v: int, m: int
) -> None:
    # Forty equal units in p * v stages, P = 2: facts 1 and 2 leave almost no bubble for any partition, the orders'
    # programme most of the bubble of the even partition (which it must not exceed).
    sched = Schedule.parse(schedule)
    forward, backward = [1.0] * 40, [2.0] * 40
    stages = p * v
    no_bubble = m * 120.0 / p
    cheap = candidate_floor_s(UnitWork.of(forward, backward), m, p, stages)
    orders_floor = order_floor_s(sched, p, stages, m, forward, backward)
    even = simulate(
        Pipeline([120.0 / stages / 3] * stages, [240.0 / stages / 3] * stages, m, sched, num_ranks=p)
    ).iteration_s
    assert cheap < 1.01 * no_bubble
    assert 1.06 * no_bubble < orders_floor <= even


def test_the_orders_floor_is_none_for_a_split_backward() -> None:
    assert order_floor_s(Schedule.ZERO_BUBBLE, 2, 4, 4, [1.0] * 8, [2.0] * 8) == 0.0


def test_the_ilp_still_solves_after_an_orders_floor() -> None:
    # HiGHS keeps one thread pool a process: the floor's programme asks the ILP's one thread, or the ILP fails.
    assert order_floor_s(Schedule.LOOPED_BFS, 2, 4, 4, [1.0] * 8, [2.0] * 8) > 0
    profile = make_profile([1.0] * 4)
    problem = build_problem(
        profile,
        unit_costs(profile, 1),
        CostSettings(),
        num_stages=2,
        num_microbatches=2,
        in_flight=in_flight_per_stage(Schedule.ONE_F_ONE_B, 2, 2, 2),
        stage_rank=(0, 1),
        recompute_choices=(False,),
        schedule=Schedule.ONE_F_ONE_B,
    )
    assert solve_ilp(problem).boundaries == (0, 2)
