"""Exhaustive enumeration of every partition: the reference the exact solvers are tested against.

It tries every composition of the units into ``P`` contiguous non-empty stages and every combination
of allowed recompute flags, scores each with :func:`solvers.problem.evaluate`, and honours all
constraints, including the ILP-only ones (speeds, pins, units per stage). Only for tiny problems:
``C(n-1, P-1) * len(recompute_choices)**P`` evaluations.
"""

from __future__ import annotations

import itertools
import math
import time

from planner.errors import PlanInfeasibleError
from solvers.problem import PartitionProblem, PartitionSolution, evaluate

__all__ = ["solve_brute", "partition_allowed"]


def partition_allowed(problem: PartitionProblem, boundaries: tuple[int, ...]) -> bool:
    """True when ``boundaries`` honours the pins and the cap on units per stage of ``problem``."""
    ends = (*boundaries[1:], problem.num_units)
    if problem.max_units_per_stage is not None and any(
        e - b > problem.max_units_per_stage for b, e in zip(boundaries, ends, strict=True)
    ):
        return False
    for unit, stage in problem.pinned:
        if not boundaries[stage] <= unit < ends[stage]:
            return False
    return True


def solve_brute(problem: PartitionProblem) -> PartitionSolution:
    """Return an optimal partition by trying all of them.

    Ties keep the first partition in enumeration order (cuts in lexicographic order, recompute flags
    in ``itertools.product`` order), so the answer is deterministic.

    Raises:
        PlanInfeasibleError: no partition satisfies memory, pins and unit caps.
    """
    start = time.perf_counter()
    n, p = problem.num_units, problem.num_stages
    best: tuple[float, float, tuple[int, ...], tuple[bool, ...]] | None = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        boundaries = (0, *cuts)
        if not partition_allowed(problem, boundaries):
            continue
        for recompute in itertools.product(problem.recompute_choices, repeat=p):
            objective, bottleneck = evaluate(problem, boundaries, tuple(recompute))
            if math.isfinite(objective) and (best is None or objective < best[0]):
                best = (objective, bottleneck, boundaries, tuple(recompute))
    if best is None:
        raise PlanInfeasibleError(
            f"no partition of {n} units into {p} stages fits in memory and honours the constraints; "
            "add stages, allow recomputation or lower the micro-batch size"
        )
    objective, bottleneck, boundaries, recompute = best
    return PartitionSolution(
        boundaries=boundaries,
        recompute=recompute,
        objective_s=objective,
        bottleneck_s=bottleneck,
        solver="brute",
        optimal=True,
        gap=0.0,
        solve_s=time.perf_counter() - start,
    )
