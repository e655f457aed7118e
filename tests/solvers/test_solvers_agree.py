"""DP == ILP == brute force on seeded random instances, plus hand cases with known answers."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from planner.errors import PlanInfeasibleError, UsageError
from solvers.brute import solve_brute
from solvers.dp import solve_dp
from solvers.dp_inner import InnerDP
from solvers.ilp import solve_ilp
from solvers.problem import Moment, PartitionProblem, PartitionSolution, evaluate


def random_problem(
    seed: int, ilp_only: bool = False, runtime_memory: bool = False, pins: bool = False
) -> PartitionProblem:
    """Up to 10 units and 4 stages, with comm, memory (sometimes binding) and recompute choices; with
    ``runtime_memory`` also the runtime's memory terms (moments, buffers, split, the step's tail); with ``pins``
    one to three units pinned to stages a partition can give them."""
    rng = random.Random(seed)
    n = rng.randint(1, 10)
    p = rng.randint(1, min(4, n))
    m = rng.randint(1, 8)
    fwd = tuple(rng.choice([0.0, rng.uniform(0.1, 3.0), float(rng.randint(1, 4))]) for _ in range(n))
    bwd = tuple(2 * x if rng.random() < 0.5 else rng.uniform(0, 5) for x in fwd)
    params = tuple(rng.randint(0, 200) for _ in range(n))
    saved = tuple(rng.randint(0, 100) for _ in range(n))
    capacity: tuple[float, ...] = ()
    if rng.random() < 0.6:
        c = rng.uniform(0.3, 1.0) * (sum(params) + sum(saved) * m) / p + 60
        capacity = tuple(c if rng.random() < 0.7 else c * rng.uniform(0.7, 1.3) for _ in range(p))
    extra: dict = {}
    if ilp_only:
        extra["speed"] = tuple(rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(p))
        if rng.random() < 0.5:
            unit = rng.randrange(n)
            extra["pinned"] = ((unit, rng.randint(max(0, p - n + unit), min(unit, p - 1))),)
        if rng.random() < 0.5:
            extra["max_units_per_stage"] = rng.randint(-(-n // p), n)
    if pins:
        chosen = rng.sample(range(n), rng.randint(1, min(3, n)))
        extra["pinned"] = tuple((u, rng.randint(max(0, p - n + u), min(u, p - 1))) for u in sorted(chosen))
    if runtime_memory:
        streams = (random.Random(seed + 104729), random.Random(seed + 15485863))
        extra.update(_runtime_memory(random.Random(seed + 7919), n, p, m, params, *streams))
    return PartitionProblem(
        forward_s=fwd,
        backward_s=bwd,
        num_stages=p,
        num_microbatches=m,
        cut_forward_s=tuple(rng.uniform(0, 1) for _ in range(n - 1)) if rng.random() < 0.7 else (),
        cut_backward_s=tuple(rng.uniform(0, 1) for _ in range(n - 1)) if rng.random() < 0.7 else (),
        cut_bytes=tuple(rng.randint(0, 100) for _ in range(n - 1)),
        input_bytes=rng.randint(0, 100),
        param_state_bytes=params,
        saved_bytes=saved,
        transient_bytes=tuple(rng.randint(0, 50) for _ in range(n)) if rng.random() < 0.5 else (),
        in_flight=tuple(min(p - s, m) for s in range(p)) if rng.random() < 0.7 else (),
        capacity_bytes=capacity,
        recompute_choices=rng.choice([(False,), (True,), (False, True)]),
        **extra,
    )


def _runtime_memory(
    rng: random.Random, n: int, p: int, m: int, params: tuple[int, ...], loss: random.Random, latest: random.Random
) -> dict:
    """The runtime's memory terms, drawn (solvers/problem.py ``stage_memory_peak``); the loss's (target, kept
    losses, finished micro-batches) from ``loss`` and the latest output the schedule's loop holds from ``latest``,
    so that the other terms are drawn as before they existed."""

    def moment() -> Moment:
        counts = (rng.randint(0, m), rng.randint(0, 2))
        flags = (rng.random() < 0.6, rng.random() < 0.7, rng.choice("BIW"))
        return Moment(*counts, *flags, rng.randint(0, 3), rng.randint(0, 2), loss.randint(0, m), latest.randint(0, 1))

    def relay() -> tuple[int, int, int]:
        producer = rng.randrange(n)
        return producer, rng.randint(producer + 1, n + 1), rng.randint(1, 60)

    def per_unit(high: int) -> tuple[int, ...]:
        return tuple(rng.randint(0, high) for _ in range(n)) if rng.random() < 0.7 else ()

    return {
        "moments": tuple(tuple(moment() for _ in range(rng.randint(1, 3))) for _ in range(p)),
        "grad_bytes": tuple(rng.randint(0, x) for x in params),
        "split_held_bytes": per_unit(40),
        "buffer_microbatches": rng.choice([0, m]),
        "cut_grad_bytes": tuple(rng.randint(0, 100) for _ in range(n - 1)),
        "output_held_bytes": rng.randint(0, 60),
        "step_bytes": per_unit(80),
        "step_bytes_add": rng.random() < 0.3,
        "input_transient_bytes": per_unit(50),
        "weight_transient_bytes": per_unit(50),
        "final_output_bytes": rng.randint(0, 30),
        "local_inputs": tuple(s > 0 and rng.random() < 0.3 for s in range(p)),
        "relays": tuple(relay() for _ in range(rng.randint(0, 3))) if n > 1 else (),
        "target_bytes": loss.randint(0, 40),
        "kept_loss_bytes": loss.randint(0, 30),
        "latest_output_bytes": latest.randint(0, 30),
        "split_backward": loss.random() < 0.5,
        "unit_output_bytes": tuple(loss.randint(0, 20) for _ in range(n)) if loss.random() < 0.7 else (),
    }


def check_partition(problem: PartitionProblem, sol: PartitionSolution) -> None:
    n = problem.num_units
    ranges = sol.stage_units(n)
    assert len(ranges) == problem.num_stages == len(sol.recompute)
    assert [u for r in ranges for u in r] == list(range(n))  # contiguous, covers every unit once
    assert all(len(r) > 0 for r in ranges)
    assert all(r in problem.recompute_choices for r in sol.recompute)
    objective, bottleneck = evaluate(problem, sol.boundaries, sol.recompute)
    assert objective == sol.objective_s and bottleneck == sol.bottleneck_s
    assert math.isfinite(objective)


def solve_or_none(solver, problem):
    try:
        return solver(problem)
    except PlanInfeasibleError:
        return None


def assert_same_optimum(problem: PartitionProblem, reference: PartitionSolution | None, sol) -> None:
    assert (reference is None) == (sol is None)
    if sol is not None:
        check_partition(problem, sol)
        assert sol.objective_s == pytest.approx(reference.objective_s, rel=1e-9, abs=1e-12)


def test_dp_matches_brute_force_on_300_random_instances():
    infeasible = 0
    for seed in range(300):
        problem = random_problem(seed)
        reference = solve_or_none(solve_brute, problem)
        found = solve_or_none(lambda p: solve_dp(p)[0], problem)
        assert_same_optimum(problem, reference, found)
        infeasible += reference is None
    assert 30 < infeasible < 200  # both outcomes are exercised


def test_dp_with_pins_matches_brute_force_and_the_ilp():
    # Pins drawn independently often contradict each other (unit 5 in stage 1, unit 3 in stage 2): no partition.
    infeasible = 0
    for seed in range(5000, 5300):
        problem = random_problem(seed, runtime_memory=seed % 2 == 0, pins=True)
        reference = solve_or_none(solve_brute, problem)
        found = solve_or_none(lambda p: solve_dp(p)[0], problem)
        assert_same_optimum(problem, reference, found)
        if found is not None:
            ends = (*found.boundaries[1:], problem.num_units)
            assert all(found.boundaries[s] <= u < ends[s] for u, s in problem.pinned)
        if seed < 5040:
            assert_same_optimum(problem, reference, solve_or_none(lambda p: solve_ilp(p, backend="highs"), problem))
        infeasible += reference is None
    assert 30 < infeasible < 250  # both outcomes are exercised


def test_dp_matches_brute_force_with_the_runtime_memory_terms():
    infeasible = 0
    for seed in range(300):
        problem = random_problem(seed, runtime_memory=True)
        reference = solve_or_none(solve_brute, problem)
        found = solve_or_none(lambda p: solve_dp(p)[0], problem)
        assert_same_optimum(problem, reference, found)
        infeasible += reference is None
    assert 30 < infeasible < 250  # both outcomes are exercised


def test_ilp_matches_brute_force_with_the_runtime_memory_terms():
    for seed in range(4000, 4300):
        problem = random_problem(seed, runtime_memory=True)
        found = solve_or_none(lambda p: solve_ilp(p, backend="highs"), problem)
        assert_same_optimum(problem, solve_or_none(solve_brute, problem), found)


def test_ilp_counts_the_latest_output_where_it_binds():
    # The instances whose optimum moves with the last stage's latest output (held by the schedule's loop): the
    # ILP's optimum moves with it.
    binding = 0
    for seed in range(4000, 4400):
        problem = random_problem(seed, runtime_memory=True)
        reference = solve_or_none(solve_brute, problem)
        without = solve_or_none(solve_brute, replace(problem, latest_output_bytes=0))
        if (reference is None) == (without is None) and (
            reference is None or reference.objective_s == without.objective_s
        ):
            continue
        binding += 1
        assert_same_optimum(problem, reference, solve_or_none(lambda p: solve_ilp(p, backend="highs"), problem))
    assert binding >= 2


def test_ilp_highs_matches_brute_force_on_100_random_instances():
    for seed in range(1000, 1100):
        problem = random_problem(seed)
        found = solve_or_none(lambda p: solve_ilp(p, backend="highs"), problem)
        assert_same_optimum(problem, solve_or_none(solve_brute, problem), found)
        if found is not None:
            assert found.optimal and found.gap == 0.0 and found.solver == "ilp-highs"


def test_ilp_cbc_matches_brute_force_on_10_random_instances():
    for seed in range(2000, 2010):
        problem = random_problem(seed)
        found = solve_or_none(lambda p: solve_ilp(p, backend="cbc"), problem)
        assert_same_optimum(problem, solve_or_none(solve_brute, problem), found)


def test_ilp_with_speeds_pins_and_unit_caps_matches_brute_force():
    for seed in range(3000, 3080):
        problem = random_problem(seed, ilp_only=True)
        found = solve_or_none(lambda p: solve_ilp(p, backend="highs"), problem)
        assert_same_optimum(problem, solve_or_none(solve_brute, problem), found)


def test_all_solvers_raise_when_nothing_fits():
    problem = PartitionProblem(
        forward_s=(1.0,) * 4,
        backward_s=(2.0,) * 4,
        num_stages=2,
        num_microbatches=4,
        param_state_bytes=(100,) * 4,
        capacity_bytes=(150.0, 150.0),  # every stage holds >= 2 units = 200 bytes
    )
    for solver in (solve_brute, solve_dp, solve_ilp):
        with pytest.raises(PlanInfeasibleError):
            solver(problem)


def test_equal_units_split_evenly():
    problem = PartitionProblem(forward_s=(1.0,) * 8, backward_s=(2.0,) * 8, num_stages=4, num_microbatches=4)
    for sol in (solve_dp(problem)[0], solve_ilp(problem), solve_brute(problem)):
        assert sol.boundaries == (0, 2, 4, 6)
        assert sol.objective_s == 4 * 6.0 + 3 * 6.0


def test_one_heavy_unit_gets_a_stage_of_its_own():
    problem = PartitionProblem(
        forward_s=(1.0, 1.0, 1.0, 10.0, 1.0, 1.0),
        backward_s=(2.0, 2.0, 2.0, 20.0, 2.0, 2.0),
        num_stages=3,
        num_microbatches=8,
    )
    for sol in (solve_dp(problem)[0], solve_ilp(problem)):
        assert sol.boundaries == (0, 3, 4)
        assert sol.bottleneck_s == 30.0


def test_heavy_lm_head_at_the_end_stands_alone():
    problem = PartitionProblem(
        forward_s=(1.0,) * 7 + (6.0,), backward_s=(2.0,) * 7 + (12.0,), num_stages=3, num_microbatches=8
    )
    for sol in (solve_dp(problem)[0], solve_ilp(problem)):
        assert sol.boundaries[-1] == 7
        assert sol.objective_s == 7 * 3.0 + 18.0 + 7 * 18.0


def test_memory_forces_recompute_on_the_first_stage():
    # 1F1B holds 2 micro-batches on stage 0 and 1 on stage 1: 2 * 60 > 100, so stage 0 recomputes.
    problem = PartitionProblem(
        forward_s=(1.0,) * 4,
        backward_s=(2.0,) * 4,
        num_stages=2,
        num_microbatches=4,
        saved_bytes=(30,) * 4,
        cut_bytes=(5, 5, 5),
        input_bytes=5,
        in_flight=(2, 1),
        capacity_bytes=(100.0, 100.0),
        recompute_choices=(False, True),
    )
    for sol in (solve_dp(problem)[0], solve_ilp(problem), solve_brute(problem)):
        assert sol.boundaries == (0, 2)
        assert sol.recompute == (True, False)


def test_a_twice_faster_stage_gets_twice_the_work():
    problem = PartitionProblem(
        forward_s=(1.0,) * 6, backward_s=(2.0,) * 6, num_stages=2, num_microbatches=4, speed=(2.0, 1.0)
    )
    sol = solve_ilp(problem)
    assert sol.boundaries == (0, 4)
    assert sol.bottleneck_s == 6.0
    assert sol.objective_s == solve_brute(problem).objective_s


def test_pins_and_unit_caps_are_honoured():
    base = dict(forward_s=(1.0,) * 8, backward_s=(2.0,) * 8, num_stages=4, num_microbatches=4)
    pinned = PartitionProblem(**base, pinned=((2, 0),))
    assert solve_ilp(pinned).boundaries[1] == 3  # unit 2 joins stage 0
    assert solve_dp(pinned)[0].boundaries[1] == 3
    assert solve_ilp(pinned).objective_s == solve_brute(pinned).objective_s == solve_dp(pinned)[0].objective_s
    # As Megatron's rule puts the final norm (here unit 5) in the last stage with the head, a stage longer there.
    last = PartitionProblem(**base, pinned=((5, 3),))
    assert solve_dp(last)[0].boundaries[3] == solve_brute(last).boundaries[3] == 5
    assert solve_dp(last)[0].objective_s == solve_brute(last).objective_s
    with pytest.raises(PlanInfeasibleError, match="unit 1 cannot be in stage 3"):
        solve_dp(PartitionProblem(**base, pinned=((1, 3),)))
    with pytest.raises(UsageError, match="out of range"):
        solve_dp(PartitionProblem(**base, pinned=((9, 0),)))
    capped = PartitionProblem(
        forward_s=(1.0, 1.0, 1.0, 1.0, 1.0, 9.0),
        backward_s=(0.0,) * 6,
        num_stages=2,
        num_microbatches=2,
        max_units_per_stage=3,
    )
    assert solve_ilp(capped).boundaries == (0, 3)  # the cap overrides the better (0, 5)


def test_dp_rejects_what_only_the_ilp_supports():
    base = dict(forward_s=(1.0,) * 4, backward_s=(1.0,) * 4, num_stages=2, num_microbatches=2)
    for extra in ({"speed": (1.0, 2.0)}, {"max_units_per_stage": 2}):
        with pytest.raises(UsageError):
            solve_dp(PartitionProblem(**base, **extra))


def test_unknown_ilp_backend_is_a_usage_error():
    problem = PartitionProblem(forward_s=(1.0,) * 2, backward_s=(1.0,) * 2, num_stages=2, num_microbatches=1)
    with pytest.raises(UsageError, match="gurobi"):
        solve_ilp(problem, backend="gurobi")


def test_top_k_candidates_are_distinct_sorted_and_start_with_the_optimum():
    several = 0
    for seed in range(4000, 4060):
        problem = random_problem(seed)
        reference = solve_or_none(solve_brute, problem)
        if reference is None:
            continue
        candidates = solve_dp(problem, top_k=4)
        assert 1 <= len(candidates) <= 4
        for sol in candidates:
            check_partition(problem, sol)
        keys = [(s.boundaries, s.recompute) for s in candidates]
        assert len(set(keys)) == len(keys)
        objectives = [s.objective_s for s in candidates]
        assert objectives == sorted(objectives)
        assert objectives[0] == pytest.approx(reference.objective_s, rel=1e-9, abs=1e-12)
        several += len(candidates) > 1
    assert several >= 3  # top_k is the best across bounds examined, often fewer than k


def test_dp_is_deterministic():
    problem = random_problem(7)

    def key(sols):
        return [(s.boundaries, s.recompute, s.objective_s) for s in sols]

    assert key(solve_dp(problem, top_k=3)) == key(solve_dp(problem, top_k=3))


def test_even_matches_enumeration_and_keeps_the_dp_bottleneck():
    # solve_even against enumerating every partition: least sum of squared stage compute among those
    # within the DP's bottleneck that fit; and it never worsens the objective's bottleneck term.
    import itertools

    from solvers.even import solve_even
    from solvers.problem import stage_cost

    checked = 0
    for seed in range(200):
        problem = random_problem(seed)
        dp = solve_or_none(lambda p: solve_dp(p)[0], problem)
        if dp is None:
            continue
        even = solve_even(problem, dp.bottleneck_s)
        n, p = problem.num_units, problem.num_stages
        flag = False not in problem.recompute_choices
        best = math.inf
        for cuts in itertools.combinations(range(1, n), p - 1):
            bounds = (0, *cuts)
            spans = enumerate(zip(bounds, (*cuts, n), strict=True))
            costs = [stage_cost(problem, s, a, b - 1, flag) for s, (a, b) in spans]
            if all(c.feasible and c.compute_s <= dp.bottleneck_s * (1 + 1e-9) for c in costs):
                best = min(best, sum(c.compute_s**2 for c in costs))
        # One recompute flag for every stage, so the DP's own (mixed) partition may not qualify.
        assert (even is None) == (best == math.inf)
        if even is None:
            continue
        check_partition(problem, even)
        assert even.bottleneck_s <= dp.bottleneck_s * (1 + 1e-9)
        got = sum(stage_cost(problem, s, r[0], r[-1], flag).compute_s ** 2 for s, r in enumerate(even.stage_units(n)))
        assert got == pytest.approx(best, rel=1e-9, abs=1e-12)
        checked += 1
    assert checked > 100


def test_balance_ranks_pairs_a_small_first_stage_with_a_large_last_one():
    from solvers.even import balance_ranks

    # A V on 2 ranks: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2. The last unit weighs 6.
    problem = PartitionProblem(forward_s=(1.0,) * 7 + (6.0,), backward_s=(0.0,) * 8, num_stages=4, num_microbatches=4)
    start = PartitionSolution((0, 2, 4, 6), (False,) * 4, *evaluate(problem, (0, 2, 4, 6), (False,) * 4), "given")
    # Rank loads: rank 0 = 2 + 7 = 9, rank 1 = 2 + 2 = 4.
    better = balance_ranks(problem, start, (0, 1, 1, 0))
    assert better is not None
    check_partition(problem, better)
    loads = [0.0, 0.0]
    for s, r in enumerate(better.stage_units(8)):
        loads[(0, 1, 1, 0)[s]] += sum(problem.forward_s[u] for u in r)
    assert max(loads) == 7.0  # optimal: rank 0 holds the 6 and stage 0 (at least one unit)
    assert balance_ranks(problem, start, (0, 1, 2, 3)) is None  # one stage per rank: nothing to pair


def _rank_key(problem: PartitionProblem, bounds: tuple[int, ...], recompute: tuple[bool, ...], ranks: tuple[int, ...]):
    """(busiest rank, sum of squared rank loads) of a partition, or None where a stage is empty or does not fit."""
    from solvers.problem import stage_cost

    ends = (*bounds[1:], problem.num_units)
    loads = [0.0] * (max(ranks) + 1)
    for s, (a, b) in enumerate(zip(bounds, ends, strict=True)):
        if b <= a:
            return None
        cost = stage_cost(problem, s, a, b - 1, recompute[s])
        if not cost.feasible:
            return None
        loads[ranks[s]] += cost.compute_s
    return max(loads), sum(x * x for x in loads)


def test_balance_ranks_ends_where_no_move_that_fits_is_better_even_when_memory_binds():
    from solvers.dp import solve_dp
    from solvers.even import balance_ranks

    checked = binding = 0
    for seed in range(400):
        problem = random_problem(seed)
        if problem.num_stages < 2 or problem.num_stages % 2:
            continue
        ranks = tuple(min(s, problem.num_stages - 1 - s) for s in range(problem.num_stages))  # a V
        try:
            start = solve_dp(problem)[0]
        except PlanInfeasibleError:
            continue
        result = balance_ranks(problem, start, ranks)
        final = result or start
        key = _rank_key(problem, final.boundaries, final.recompute, ranks)
        assert key is not None, seed  # every stage non-empty and fitting
        if result is not None:  # no worse than where it started (a move of a unit that computes nothing ties)
            before = _rank_key(problem, start.boundaries, start.recompute, ranks)
            assert before is not None and key <= (before[0] * (1 + 1e-12), before[1] * (1 + 1e-12)), seed
        for k in range(1, problem.num_stages):
            for step in (-1, 1):
                moved = list(final.boundaries)
                moved[k] += step
                other = _rank_key(problem, tuple(moved), final.recompute, ranks)
                if other is None:
                    binding += problem.capacity_bytes != ()
                    continue
                busiest, squares = other
                # The search stops only where no move lowers (busiest, squares) (float sums may tie).
                assert (busiest, squares) >= (key[0] * (1 - 1e-12), key[1] * (1 - 1e-12)), (seed, k, step)
        checked += 1
    assert checked > 50 and binding > 10


def test_the_inner_dp_fills_only_the_rows_a_partition_under_the_bound_ends_on():
    # Six units of 3 s on 3 stages: under a bound of 6 s each stage is exactly two units, so each stage's end is
    # pinned (1, 3, 5); under 9 s three units a stage reach stage 0's end to unit 2 and stage 1's to 5, and the
    # stages after reach back to before unit 0 and to unit 2 (a stage's one unit at least is solve's own limit).
    problem = PartitionProblem(forward_s=(1.0,) * 6, backward_s=(2.0,) * 6, num_stages=3, num_microbatches=4)
    model = InnerDP(problem)
    assert model._reach(6.0, 6) == [(1, 1), (3, 3), (5, 5)]
    assert model._reach(9.0, 6) == [(-1, 2), (2, 5), (5, 5)]
    assert model._reach(9.0, 2) == [(1, 1), (3, 3), (5, 5)]  # two units a stage at most: the width pins them too
    found = model.solve(6.0)
    assert found is not None and found.boundaries == (0, 2, 4) and found.sum_s == 18.0
    assert model.solve(5.9) is None
    assert solve_dp(problem)[0].boundaries == solve_brute(problem).boundaries == (0, 2, 4)
