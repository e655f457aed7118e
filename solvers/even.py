"""Evenly used ranks at no cost to the objective: a second partition for the simulator to judge.

The objective ``sum_s (c_s + k_s) + (M - 1) max_s c_s`` is flat in every stage below the bottleneck, so the
exact solvers may return a partition that leaves a stage nearly empty (gpt2-small on 8 ranks: a stage
holding only ``ln_f``, 0.03 s of 38 s) where another with the same bottleneck spreads the work. The
simulator sees the difference (fill and drain are shorter, the V and zero-bubble schedules fill better)
but can only judge the partitions it is given. :func:`solve_even` gives it the most even one.
"""

from __future__ import annotations

import math

import numpy as np

from solvers.problem import PartitionProblem, PartitionSolution, evaluate, stage_compute_s, stage_cost

__all__ = ["solve_even", "balance_ranks", "MAX_EVEN_WORK"]

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
    if not problem.is_free or stages * n * n > MAX_EVEN_WORK or stages > n:
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
                # Time first: a stage over the bottleneck, or no better than the best so far, needs no memory.
                compute = stage_compute_s(problem, s - 1, i, j - 1, recompute)
                if compute > limit:
                    continue
                value = best[s - 1][i] + compute**2
                if value < best[s][j] and stage_cost(problem, s - 1, i, j - 1, recompute).feasible:
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
    stages = problem.num_stages
    if not problem.is_free or len(stage_rank) != stages or len(set(stage_rank)) == stages:
        return None
    moves = _BoundaryMoves(problem, start, stage_rank)
    if np.isnan(moves.stage_s).any():
        return None
    moved = False
    for _ in range(max_moves):
        m = moves.best()
        if m is None:
            break
        moves.take(m)
        moved = True
    if not moved:
        return None
    bounds = tuple(moves.bounds)
    objective, bottleneck = evaluate(problem, bounds, start.recompute)
    return PartitionSolution(bounds, start.recompute, objective, bottleneck, solver="rank-balance")


class _BoundaryMoves:
    """The moves of :func:`balance_ranks`: each boundary one unit left or right, scored all at once.

    Move ``2(k-1)`` takes boundary ``k`` one unit left, ``2(k-1)+1`` one unit right; ``new_left``/``new_right``
    hold the compute of the two stages it changes (NaN: the move empties a stage or does not fit). A move touches
    only the boundaries beside it, so after each move six entries are looked up again, and every move is scored
    in one numpy pass (a plan of hundreds of stages has hundreds of moves at every step)."""

    def __init__(self, problem: PartitionProblem, start: PartitionSolution, stage_rank: tuple[int, ...]) -> None:
        n, stages = problem.num_units, problem.num_stages
        self.problem, self.recompute, self.n, self.stages = problem, start.recompute, n, stages
        self.ranks = max(stage_rank) + 1
        self.known: dict[tuple[int, int, int], float] = {}
        self.bounds = list(start.boundaries)
        ends = (*self.bounds[1:], n)
        self.stage_s = np.array(
            [
                self.compute_s(s, a, b) if self.fits(s, a, b) else math.nan
                for s, (a, b) in enumerate(zip(self.bounds, ends, strict=True))
            ]
        )
        self.a_stage = np.repeat(np.arange(stages - 1), 2)
        self.b_stage = self.a_stage + 1
        self.rank_of = np.asarray(stage_rank)
        self.ra, self.rb = self.rank_of[self.a_stage], self.rank_of[self.b_stage]
        self.same = self.ra == self.rb
        self.new_left = np.full(2 * (stages - 1), math.nan)
        self.new_right = np.full(2 * (stages - 1), math.nan)
        for k in range(1, stages):
            self.look_up(k)

    def compute_s(self, s: int, a: int, b: int) -> float:
        """Stage ``s`` holding units ``a..b-1``: its compute, or NaN where it is empty (whether it fits is
        :meth:`fits`'s, asked only of the moves :meth:`best` would take)."""
        if not 0 <= a < b <= self.n:
            return math.nan
        key = (s, a, b)
        if key not in self.known:
            self.known[key] = stage_compute_s(self.problem, s, a, b - 1, self.recompute[s])
        return self.known[key]

    def fits(self, s: int, a: int, b: int) -> bool:
        """Whether stage ``s`` holding units ``a..b-1`` fits in its memory (:func:`stage_cost` keeps the answer per
        problem)."""
        return stage_cost(self.problem, s, a, b - 1, self.recompute[s]).feasible

    def _moved(self, m: int) -> tuple[int, int]:
        """Move ``m``'s boundary ``k`` and where it puts it."""
        k = m // 2 + 1
        return k, self.bounds[k] + (1 if m % 2 else -1)

    def _end(self, k: int) -> int:
        """Where the stage that boundary ``k`` starts ends (exclusive)."""
        return self.bounds[k + 1] if k + 1 < self.stages else self.n

    def look_up(self, k: int) -> None:
        """The two moves of boundary ``k``: the compute of the stages on either side after each."""
        bounds = self.bounds
        if not 1 <= k < self.stages:
            return
        end = self._end(k)
        for j, step in enumerate((-1, 1)):
            b = bounds[k] + step
            m = 2 * (k - 1) + j
            self.new_left[m] = self.compute_s(k - 1, bounds[k - 1], b) if bounds[k - 1] < b < end else math.nan
            self.new_right[m] = self.compute_s(k, b, end) if bounds[k - 1] < b < end else math.nan

    def best(self) -> int | None:
        """The move of steepest descent on (busiest rank, sum of squared loads), the first such in boundary order,
        among the moves whose two stages fit; None where no move lowers it."""
        while True:
            m = self._steepest()
            if m is None:
                return None
            # Memory is asked of the move found, and one that does not fit is struck out: the steepest of those
            # left is then the steepest of the moves that fit, as if each had been asked first.
            k, b = self._moved(m)
            if self.fits(k - 1, self.bounds[k - 1], b) and self.fits(k, b, self._end(k)):
                return m
            self.new_left[m] = self.new_right[m] = math.nan

    def _steepest(self) -> int | None:
        ra, rb, stage_s = self.ra, self.rb, self.stage_s
        # Sums in stage order, as a loop would (bincount adds its weights in order).
        per_rank = np.bincount(self.rank_of, weights=stage_s, minlength=self.ranks)
        loads = per_rank.tolist()
        squares = sum(x * x for x in loads)
        busiest = max(loads)
        # The busiest rank that a move leaves alone: the first of the three busiest not among its two.
        top = sorted(range(self.ranks), key=lambda r: -loads[r])[:3]
        others = np.zeros(len(ra))
        for r in reversed(top):
            others = np.where((ra != r) & (rb != r), per_rank[r], others)
        load_a = per_rank[ra] + self.new_left - stage_s[self.a_stage]
        load_b = per_rank[rb] + self.new_right - stage_s[self.b_stage]
        # The turn of a V (both stages on one rank): one load changes by both moves.
        turn = load_a + self.new_right - stage_s[self.b_stage]
        peak = np.where(self.same, np.maximum(others, turn), np.maximum(np.maximum(others, load_a), load_b))
        spread = np.where(
            self.same,
            squares - per_rank[ra] * per_rank[ra] + turn * turn,
            squares - per_rank[ra] * per_rank[ra] - per_rank[rb] * per_rank[rb] + load_a * load_a + load_b * load_b,
        )
        valid = ~np.isnan(peak)
        if not valid.any():
            return None
        least = peak[valid].min()
        tied = valid & (peak == least)
        flattest = spread[tied].min()
        if (least, flattest) >= (busiest, squares):
            return None
        return int(np.flatnonzero(tied & (spread == flattest))[0])

    def take(self, m: int) -> None:
        """Make move ``m`` and look up again the moves it changed."""
        k, b = self._moved(m)
        self.bounds[k] = b
        self.stage_s[k - 1], self.stage_s[k] = self.new_left[m], self.new_right[m]
        for j in (k - 1, k, k + 1):
            self.look_up(j)
