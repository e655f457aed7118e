"""Exact dynamic program for the pipeline partition problem (homogeneous stages, pinned units allowed).

Method: Alpa (Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed
Deep Learning", OSDI 2022), Sec. 5.2, Eq. 2-3. The objective of :func:`solvers.problem.evaluate` ::

    T* = min over t_max of { min over partitions with every c_s <= t_max of sum_s (c_s + k_s) }
         + (M - 1) * t_max

is exact when ``t_max`` ranges over the candidate bottlenecks (every stage compute time that can
occur). For a fixed ``t_max`` the inner minimum ``g(t_max)`` is a DP over (stage index, last unit),
where stage ``s`` may hold units ``i..j`` only if its compute is ``<= t_max`` and it fits in memory
*as stage s* (memory depends on ``s`` through its moments, ``in_flight[s]``, and ``capacity_bytes[s]``).
A pinned unit ``u`` in stage ``s`` bounds the rows: stage ``s`` ends at ``u`` or later, stage ``s - 1`` before
``u`` (the pins only remove partitions, so every bound of the search below stays a bound).

Speed (1,000 units x 64 stages well under a second):

- the inner DP (solvers/dp_inner.py) is vectorised with numpy: for a bound ``t_max`` the starts ``i`` allowed
  for an end ``j`` form a band (prefix sums of compute are monotone), so each stage is one ``n x W`` array;
- memory feasibility is precomputed once per kind of stage (its moments and capacity) as a mask over the
  stage shapes, with :func:`solvers.problem.stage_memory_peak`'s formula on arrays; a stage then costs one
  lookup per shape;
- instead of scanning every candidate bound in ascending order with Alpa's early stop
  ``(M-1) * t_max + LB >= best``, the candidates are searched by branch and bound: ``g`` is a
  non-increasing step function of ``t_max``, so an interval of candidates whose ends have equal
  ``g`` holds nothing better than its left end, and an interval ``(a, b]`` cannot beat the incumbent
  when ``g(b) + (M-1) * t_a+1 >= best`` (Alpa's stop rule applied per interval). The smallest
  feasible bound is found first by galloping + binary search (a small problem is first solved once at the
  loosest bound memory leaves, which says whether any partition fits at all). The result equals the full scan.

``top_k``: the candidates are the inner-DP optima at the bounds examined (each is the best partition
whose bottleneck is at most that bound), distinct by boundaries and recompute flags, sorted by
objective, best first. Bounds pruned against the k-th best are not examined, so this is "the best
solutions across ``t_max`` values", not the k best partitions overall. With ``M = 1`` the bound does
not enter the objective and one solution is returned.

Ties are broken deterministically (smallest candidate bound first; within the DP ``argmin`` keeps
the earliest start).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace

import numpy as np

from planner.errors import PlanInfeasibleError, UsageError
from solvers.dp_inner import Found, InnerDP
from solvers.problem import (
    PartitionProblem,
    PartitionSolution,
    check_pins,
    evaluate,
    stage_cost,
)

__all__ = ["solve_dp", "smallest_plan_bytes"]

PROBE_CELLS = 65_536
"""Units times band width under which one solve of the DP costs little beyond its Python (:func:`_search`)."""


class _Incumbents:
    """The best ``k`` distinct solutions seen so far."""

    def __init__(self, k: int, num_microbatches: int) -> None:
        self.k, self.m = k, num_microbatches
        self.seen: dict[tuple[tuple[int, ...], tuple[bool, ...]], Found] = {}

    def add(self, found: Found | None) -> None:
        if found is not None:
            self.seen.setdefault((found.boundaries, found.recompute), found)

    def ranked(self) -> list[Found]:
        return sorted(self.seen.values(), key=lambda f: (f.objective_s(self.m), f.boundaries, f.recompute))

    def bound(self, fallback_worst: bool = False) -> float:
        """Objective a new candidate must beat: the k-th best; while fewer are known, infinity
        (or, with ``fallback_worst``, the worst one known, to bound the range of ``t_max`` examined)."""
        ranked = self.ranked()
        if len(ranked) >= self.k:
            return ranked[self.k - 1].objective_s(self.m)
        return ranked[-1].objective_s(self.m) if fallback_worst and ranked else math.inf


def _search(model: InnerDP, best: _Incumbents) -> None:
    """Examine the bottleneck bounds that can matter (see the module docstring): the least feasible one, an
    upper bound past which none can win, and the candidates between them by branch and bound."""
    c_min = model.c_min
    total = float(c_min[-1])
    cut_comm = np.sort(model.comm[1:])
    sum_low = total + float(np.sum(cut_comm[: model.p - 1]))
    # The whole model as one stage (with recompute if allowed): no stage compute exceeds it.
    t_all = float(model.pfb[-1] + (model.pf[-1] if model.allow1 else 0.0))
    if model.m == 1:
        best.add(model.solve(math.inf))
        return
    # A small problem (its cost mostly Python's) is asked first whether any partition fits at all: one solve at the
    # loosest bound memory leaves, where the gallop would solve a dozen bounds on its way there (a plan search meets
    # many options that no partition fits). A large one is not: that one solve, its band wide open, can cost more
    # than the whole gallop. Not an incumbent: the candidates are the optima of the bounds examined below.
    loosest = model.loosest_bound()
    if model.n * model.width_for(loosest) <= PROBE_CELLS and model.solve(loosest) is None:
        return
    t_min = _least_bottleneck(model, best, c_min, t_all)
    if t_min is None:
        return
    upper = _upper_bound(model, best, t_min, sum_low)
    _branch_and_bound(model, best, t_min, t_all if math.isinf(upper) else upper)


def _least_bottleneck(model: InnerDP, best: _Incumbents, c_min: np.ndarray, t_all: float) -> float | None:
    """The least bottleneck bound with a feasible partition (None: none up to ``t_all``): gallop upward from the
    lower bound until some bound is feasible, then bisect over the candidates below it."""
    total = float(c_min[-1])
    t_low = max(float(np.diff(c_min).max()), total / model.p) * (1 - 1e-12)
    lo, step = t_low, max(0.05 * t_low, 1e-9 * total, 1e-300)
    hi = min(t_low + step, t_all)
    while (found := model.solve(hi)) is None:
        if hi >= t_all:
            return None
        lo, step = hi, 2 * step
        hi = min(hi + step, t_all)
    best.add(found)
    between = model.candidates(lo, found.bottleneck_s)
    a, b = 0, len(between) - 1  # solve(between[b]) is feasible: it holds found
    while a < b:
        mid = (a + b) // 2
        probe = model.solve(float(between[mid]))
        best.add(probe)
        if probe is None:
            a = mid + 1
        else:
            b = mid
    t_min = float(between[b])
    best.add(model.solve(t_min))
    return t_min


def _upper_bound(model: InnerDP, best: _Incumbents, t_min: float, sum_low: float) -> float:
    """Bounds above it cannot win: ``(M-1) * t_max + (a lower bound of the sum) >= k-th best`` (inf: no bound
    known yet), tightened by the partition found at it, at most twice."""
    m = model.m
    upper = max(t_min, (best.bound(fallback_worst=True) - sum_low) / (m - 1))
    for _ in range(2):
        if upper <= t_min or math.isinf(upper):
            break
        at_upper = model.solve(upper)
        best.add(at_upper)
        assert at_upper is not None  # feasible at t_min <= upper
        tighter = max(t_min, (best.bound(fallback_worst=True) - at_upper.sum_s) / (m - 1))
        if tighter >= 0.9 * upper:
            upper = tighter
            break
        upper = tighter
    return upper


def _branch_and_bound(model: InnerDP, best: _Incumbents, t_min: float, upper: float) -> None:
    """Branch and bound over the sorted candidate bounds in ``[t_min, upper]``: an interval whose best possible
    objective (its right end's sum, its left end's bottleneck) cannot beat the k-th best is dropped."""
    m = model.m
    cands = model.candidates(t_min, upper)
    if len(cands) == 0 or cands[0] != t_min:
        cands = np.unique(np.concatenate(([t_min], cands)))
    g: dict[int, float] = {}

    def sum_at(index: int) -> float:
        found = model.solve(float(cands[index]))
        best.add(found)
        assert found is not None
        g[index] = found.sum_s
        return found.sum_s

    last = len(cands) - 1
    sum_at(0)
    sum_at(last)
    heap: list[tuple[float, int, int]] = []

    def push(a: int, b: int) -> None:
        if b - a > 1 and g[a] != g[b]:
            heapq.heappush(heap, (g[b] + (m - 1) * float(cands[a + 1]), a, b))

    push(0, last)
    while heap:
        bound, a, b = heapq.heappop(heap)
        if bound >= best.bound():
            break
        mid = (a + b) // 2
        sum_at(mid)
        # The optimum at cands[mid] has bottleneck <= cands[mid]; g is flat between the two.
        found = model.solve(float(cands[mid]))
        assert found is not None
        flat = int(np.searchsorted(cands, found.bottleneck_s, side="left"))
        if flat > last or cands[flat] != found.bottleneck_s or flat >= mid:
            push(a, mid)
        elif flat > a:
            g[flat] = g[mid]
            push(a, flat)
        # else: the solution at cands[mid] already fits under cands[a], so (a, mid) is flat.
        push(mid, b)


def solve_dp(problem: PartitionProblem, top_k: int = 1) -> list[PartitionSolution]:
    """Solve ``problem`` exactly; return up to ``top_k`` distinct candidates, best first.

    See the module docstring for the method (Alpa, OSDI 2022, Eq. 2-3) and what ``top_k`` means.
    ``objective_s`` and ``bottleneck_s`` of each candidate are recomputed with
    :func:`solvers.problem.evaluate`.

    Raises:
        UsageError: the problem has per-stage speeds or a cap on units per stage (use the ILP solver), negative
            times, a pin out of range, or ``top_k < 1``.
        PlanInfeasibleError: no partition fits in memory and honours the pins.

    Examples:
        >>> p = PartitionProblem(forward_s=(1.0,) * 8, backward_s=(2.0,) * 8, num_stages=4, num_microbatches=4)
        >>> solve_dp(p)[0].boundaries
        (0, 2, 4, 6)
    """
    start = time.perf_counter()
    if not problem.is_homogeneous:
        raise UsageError(
            "the DP solver handles identical stages only; per-stage speed and max units per stage need the ILP "
            "solver (--solver ilp)"
        )
    check_pins(problem)
    if top_k < 1:
        raise UsageError(f"top_k must be >= 1, got {top_k}")
    model = InnerDP(problem)
    best = _Incumbents(top_k, problem.num_microbatches)
    _search(model, best)
    ranked = best.ranked()
    if not ranked:
        raise PlanInfeasibleError(
            f"no partition of {problem.num_units} units into {problem.num_stages} stages fits in memory"
            f"{' and honours the pins' if problem.pinned else ''}; "
            "add stages, allow recomputation or lower the micro-batch size"
        )
    elapsed = time.perf_counter() - start
    solutions = []
    for found in ranked[:top_k]:
        objective, bottleneck = evaluate(problem, found.boundaries, found.recompute)
        solutions.append(
            PartitionSolution(
                boundaries=found.boundaries,
                recompute=found.recompute,
                objective_s=objective,
                bottleneck_s=bottleneck,
                solver="dp",
                optimal=True,
                gap=0.0,
                solve_s=elapsed,
            )
        )
    solutions.sort(key=lambda sol: (sol.objective_s, sol.boundaries, sol.recompute))
    return solutions


def smallest_plan_bytes(problem: PartitionProblem) -> float:
    """The least memory per stage any partition of ``problem`` needs (its fullest stage), to 0.5 %: the capacity,
    found by bisection, under which :func:`solve_dp` first finds a partition (pins, speeds and caps dropped)."""
    p = problem.num_stages
    single = [
        max(stage_cost(problem, s, u, u, r).memory_bytes for s in range(p) for r in problem.recompute_choices)
        for u in range(problem.num_units)
    ]
    low, high = max(min(single), 1.0), max(sum(single), 1.0)

    def fits(capacity: float) -> bool:
        try:
            solve_dp(replace(problem, capacity_bytes=(capacity,) * p, speed=(), pinned=(), max_units_per_stage=None))
        except PlanInfeasibleError:
            return False
        return True

    while not fits(high):
        high *= 2
    while high - low > 0.005 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high
