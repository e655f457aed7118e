"""Evenly used ranks at no cost to the objective: a second partition for the simulator to judge.

The objective ``sum_s (c_s + k_s) + (M - 1) max_s c_s`` is flat in every stage below the bottleneck, so the
exact solvers may return a partition that leaves a stage nearly empty (gpt2-small on 8 ranks: a stage
holding only ``ln_f``, 0.03 s of 38 s) where another with the same bottleneck spreads the work. The
simulator sees the difference (fill and drain are shorter, the V and zero-bubble schedules fill better)
but can only judge the partitions it is given. :func:`solve_even` gives it the most even one.
"""

from __future__ import annotations

import math

from solvers.problem import PartitionProblem, PartitionSolution, evaluate, stage_cost

__all__ = ["solve_even", "balance_ranks", "MAX_EVEN_WORK"]

_UNKNOWN = -1.0  # no stage computes in negative time

MAX_EVEN_WORK = 20_000
"""Largest ``stages x units^2`` solved (about 0.03 s in pure Python, and the search calls it once per
candidate: 200,000 made a 100-unit, 4-rank plan take 6 s); above it, None."""


def solve_even(problem: PartitionProblem, bottleneck_s: float) -> PartitionSolution | None:
    """The partition with the least sum of squared stage compute among those whose every stage computes
    within ``bottleneck_s`` and fits in memory; None when there is none, or the problem is too large or
    not homogeneous (speeds, pins, caps: the ILP's domain).

    A DP over (stage, first unit of the next stage): ``best[s][j] = min_i best[s-1][i] + c(i..j-1)^2``.
    Recomputation is off when the problem allows it, else on, for every stage.

    Example:
        >>> p = PartitionProblem(forward_s=(1.0, 1.0, 1.0, 1.0, 4.0), backward_s=(1.0, 1.0, 1.0, 1.0, 4.0),
        ...                      num_stages=3, num_microbatches=4)
        >>> solve_even(p, 8.0).boundaries  # same bottleneck as (0, 1, 4): stages of 4, 4, 8 s, not 2, 6, 8
        (0, 2, 4)
    """
    n, stages = problem.num_units, problem.num_stages
    if not problem.is_homogeneous or stages * n * n > MAX_EVEN_WORK or stages > n:
        return None
    recompute = False not in problem.recompute_choices
    limit = bottleneck_s * (1 + 1e-9)
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    back = [[-1] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        # Stage s - 1 takes units i..j-1; every later stage needs at least one unit.
        for j in range(s, n - (stages - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == math.inf:
                    continue
                cost = stage_cost(problem, s - 1, i, j - 1, recompute)
                if cost.compute_s > limit or not cost.feasible:
                    continue
                value = best[s - 1][i] + cost.compute_s**2
                if value < best[s][j]:
                    best[s][j], back[s][j] = value, i
    if best[stages][n] == math.inf:
        return None
    boundaries, j = [], n
    for s in range(stages, 0, -1):
        j = back[s][j]
        boundaries.append(j)
    bounds = tuple(reversed(boundaries))
    flags = (recompute,) * stages
    objective, bottleneck = evaluate(problem, bounds, flags)
    return PartitionSolution(bounds, flags, objective, bottleneck, solver="even")


def balance_ranks(
    problem: PartitionProblem, start: PartitionSolution, stage_rank: tuple[int, ...], max_moves: int = 10_000
) -> PartitionSolution | None:
    """Move ``start``'s boundaries one unit at a time while the busiest rank's compute goes down.

    For schedules that put several stages on a rank (looped, or the V of zbv/dualpipev, where rank r holds
    stages r and 2R-1-r), what the pipeline pays is a rank's sum, not a stage's: the V pairs the first
    stage with the last, so a large last unit (an LM head) wants a small first stage. Local search on
    ``(busiest rank, sum of squared rank loads)``, recomputation flags kept, every stage non-empty and
    fitting; None when no move helps or the problem is not homogeneous.
    """
    n, stages = problem.num_units, problem.num_stages
    if not problem.is_homogeneous or len(stage_rank) != stages or len(set(stage_rank)) == stages:
        return None
    ranks = max(stage_rank) + 1
    # A move changes two stages: their costs are looked up (each stage shape summed once), and the busiest
    # rank and the sum of squares are updated from the two ranks they touch, not rebuilt from every stage
    # (2,000 units on 256 stages, one plan search's 48 calls: 135 s -> 6 s, under cProfile).
    known: dict[tuple[int, int, int], float | None] = {}

    def compute_s(s: int, a: int, b: int) -> float | None:
        key = (s, a, b)
        if key not in known:
            cost = stage_cost(problem, s, a, b - 1, start.recompute[s])
            known[key] = cost.compute_s if cost.feasible else None
        return known[key]

    bounds = start.boundaries
    ends = (*bounds[1:], n)
    costs = [compute_s(s, a, b) for s, (a, b) in enumerate(zip(bounds, ends, strict=True))]
    if None in costs:
        return None
    stage_s: list[float] = [c for c in costs if c is not None]
    moved = False
    for _ in range(max_moves):
        per_rank = [0.0] * ranks
        for s, c in enumerate(stage_s):
            per_rank[stage_rank[s]] += c
        squares = sum(x * x for x in per_rank)
        best_value = (max(per_rank), squares)
        top = sorted(range(ranks), key=lambda r: -per_rank[r])[:3]
        best_move: tuple[int, int, float, float] | None = None
        for k in range(1, stages):
            end = bounds[k + 1] if k + 1 < stages else n
            ra, rb = stage_rank[k - 1], stage_rank[k]
            # The busiest rank that the move leaves alone.
            others = next((per_rank[r] for r in top if r != ra and r != rb), 0.0)
            for step in (-1, 1):
                b = bounds[k] + step
                if b <= bounds[k - 1] or b >= end:
                    continue
                # Inline look-ups: this line runs millions of times in a 2,000-unit cluster search.
                left = known.get((k - 1, bounds[k - 1], b), _UNKNOWN)
                if left == _UNKNOWN:
                    left = compute_s(k - 1, bounds[k - 1], b)
                right = known.get((k, b, end), _UNKNOWN)
                if right == _UNKNOWN:
                    right = compute_s(k, b, end)
                if left is None or right is None:
                    continue
                if ra == rb:  # the turn of a V: both stages on one rank
                    load = per_rank[ra] + left - stage_s[k - 1] + right - stage_s[k]
                    value = (max(others, load), squares - per_rank[ra] ** 2 + load * load)
                else:
                    load_a = per_rank[ra] + left - stage_s[k - 1]
                    load_b = per_rank[rb] + right - stage_s[k]
                    squared = squares - per_rank[ra] ** 2 - per_rank[rb] ** 2 + load_a * load_a + load_b * load_b
                    value = (max(others, load_a, load_b), squared)
                if value < best_value:
                    best_move, best_value = (k, b, left, right), value
        if best_move is None:
            break
        k, b, left, right = best_move
        bounds = (*bounds[:k], b, *bounds[k + 1 :])
        stage_s[k - 1], stage_s[k] = left, right
        moved = True
    if not moved:
        return None
    objective, bottleneck = evaluate(problem, bounds, start.recompute)
    return PartitionSolution(bounds, start.recompute, objective, bottleneck, solver="rank-balance")
