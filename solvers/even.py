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

__all__ = ["solve_even", "MAX_EVEN_WORK"]

MAX_EVEN_WORK = 200_000
"""Largest ``stages x units^2`` solved (a few tenths of a second in pure Python); above it, None."""


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
