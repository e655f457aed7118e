"""Several plans of one model run in one launch, interleaved: ratios that hold on a machine whose speed moves.

A shared machine's speed moves by tens of percent within a minute (``profiles/reference.py``'s layer alone shows
it): two plans verified one after the other, each in its own launch, differ by as much from that alone.
:func:`verify_plans` starts the ranks once; every rank builds each plan's stages on a model of its own (same seed),
warms each up, then runs ``rounds`` rounds in which every plan runs a block of steps (at least one, and on until
``min_block_s``), the order rotating from round to round
(:func:`planner.runtime.rank_timing.rank_main_interleaved`). Plans timed seconds apart see the same machine, so the
per-round ratio of two plans (:attr:`InterleavedRun.round_iteration_s`) holds while its speed moves.
Short blocks and many rounds pair the plans' times closer than long blocks and few rounds in the same time: each
round's ratio is taken over a shorter stretch of the machine, and the median over rounds has more of them
(``python benchmarks/bench_learning.py`` measures the spread).

Two copies of one plan, each on a model of its own, still differ by a few percent. Where a ratio must hold that
closely, run a plan as several copies and pass their indices to :meth:`InterleavedRun.ratio` together.

Each plan also gets the :class:`~planner.runtime.verify_report.VerifyReport` that ``verify`` would give it
(stage times, waits, step tail, memory, speed reference), for :func:`planner.runtime.tune.refit_calibration`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import UsageError
from planner.plan import Plan
from planner.runtime.launch import run_ranks
from planner.runtime.rank_timing import MIN_WARMUP_S, RankResult, rank_main_interleaved
from planner.runtime.tensor_parallel import check_runtime_layout
from planner.runtime.verify import build_report, measured_from_ranks, rank_thread_count
from planner.runtime.verify_report import MEMORY_TOLERANCE, VerifyReport

__all__ = ["InterleavedRun", "verify_plans", "rounds_within", "MIN_BLOCK_S"]

MIN_BLOCK_S = 0.1
"""Each plan's block of steps in a round lasts at least this long (and one step): long enough for a few steps of
a small model (mlp's are 5-15 ms on 2 CPU ranks), short enough that the plans of a round run within a second or
two of each other (module docstring)."""


@dataclass(frozen=True)
class InterleavedRun:
    reports: tuple[VerifyReport, ...]
    """Per plan, in the order given: what ``verify`` reports of it, from all its rounds' steps."""
    round_iteration_s: tuple[tuple[float, ...], ...]
    """Per plan, per round: the median iteration of its block (the slowest rank's)."""

    def ratio(self, a: int | Sequence[int], b: int | Sequence[int]) -> float:
        """Plan ``a``'s iteration over plan ``b``'s: the median over rounds of the ratio in each round. Either may
        name several copies of one plan (indices of the same plan given several times): a round's time of the
        plan is then the geometric mean of its copies' times in that round."""
        pairs = zip(self._round_times(a), self._round_times(b), strict=True)
        return statistics.median(x / y for x, y in pairs)

    def _round_times(self, plan: int | Sequence[int]) -> list[float]:
        copies = [plan] if isinstance(plan, int) else list(plan)
        return [
            math.exp(statistics.fmean(math.log(self.round_iteration_s[k][index]) for k in copies))
            for index in range(len(self.round_iteration_s[copies[0]]))
        ]


def rounds_within(
    plans: Sequence[Plan], budget_s: float, *, at_least: int, at_most: int, min_block_s: float = MIN_BLOCK_S
) -> int:
    """How many rounds of :func:`verify_plans` fit in about ``budget_s`` of timed steps: a round gives each plan
    a block of ``min_block_s`` or one predicted iteration, whichever is longer; never fewer than ``at_least``
    nor more than ``at_most`` rounds."""
    per_round = sum(max(min_block_s, p.predicted.iteration_s) for p in plans)
    return max(at_least, min(at_most, int(budget_s / per_round)))


def _round_medians(everyone: Sequence[RankResult], rounds: int) -> tuple[float, ...]:
    """Per round: the slowest rank's median iteration (the ranks step together between barriers)."""
    out = []
    for index in range(rounds):
        per_rank = [
            statistics.median(t for t, r in zip(res.iteration_s, res.step_rounds, strict=True) if r == index)
            for res in everyone
        ]
        out.append(max(per_rank))
    return tuple(out)


def verify_plans(
    plans: Sequence[Plan],
    workload: str,
    *,
    rounds: int = 5,
    warmup: int = 2,
    min_warmup_s: float = MIN_WARMUP_S,
    min_block_s: float = MIN_BLOCK_S,
    timeout_s: float = 900.0,
    device: str = "cpu",
    tolerance: float = 0.25,
    memory_tolerance: float = MEMORY_TOLERANCE,
    unit_references: Sequence[bool] | None = None,
    track_memory: bool = True,
) -> InterleavedRun:
    """Run ``plans`` (of the model ``workload``, a MODEL spec) in one launch on real processes, interleaved.

    ``unit_references[k]``: whether plan ``k``'s ranks time its units alone after each round, its reports' speed
    reference (None: every plan's); a plan without takes the machine's speed reference, a fixed layer, and its
    units are not timed: where only some plans' speed is read (learning from a launch reads the first plan's),
    the others' unit timing is the launch's largest cost after the steps on a long model.

    ``track_memory``: each plan's memory is tracked over one more step at the end (a slow one: the tracker sees
    every operator); without it the reports hold no measured memory, for a launch that learns times alone.

    Raises:
        UsageError: no plans, fewer than one round, or plans that need different process counts or threads
            (one launch has one world size) or a cluster mesh (pipelines only).
        ExecutionError / ModelMismatchError: a rank failed, or the model is not the plans'.
    """
    if not plans or rounds < 1:
        raise UsageError(f"verify_plans needs plans and at least one round (plans: {len(plans)}, rounds: {rounds})")
    if any(p.mesh is not None for p in plans):
        raise UsageError("verify_plans runs pipelines on one process per rank: plans with a cluster mesh one at a time")
    ranks = {p.num_ranks for p in plans}
    threads = {rank_thread_count(p, "processes", device) for p in plans}
    if len(ranks) > 1 or len(threads) > 1:
        raise UsageError(
            f"plans run in one launch need the same ranks and threads per rank (ranks {sorted(ranks)}, threads "
            f"{sorted(threads, key=str)})"
        )
    for plan in plans:
        check_runtime_layout(plan)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if unit_references is not None and len(unit_references) != len(plans):
        raise UsageError(f"unit_references has {len(unit_references)} entries for {len(plans)} plans")
    args = (workload, list(plans), rounds, warmup, min_warmup_s, min_block_s, device, unit_references, track_memory)
    everyone = run_ranks(
        rank_main_interleaved, args, ranks.pop(), timeout_s=timeout_s, backend=backend, threads=threads.pop()
    )
    reports, per_round = [], []
    for k, plan in enumerate(plans):
        results = [rank[k] for rank in everyone]
        reports.append(build_report(plan, "processes", measured_from_ranks(plan, results), tolerance, memory_tolerance))
        per_round.append(_round_medians(results, rounds))
    return InterleavedRun(tuple(reports), tuple(per_round))
