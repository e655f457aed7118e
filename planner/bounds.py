"""Floors under a simulated iteration: what lets a search skip what cannot win.

These facts hold for every schedule the simulator runs (planner/schedule/simulate.py):

1. a rank runs its actions one at a time, so the step lasts at least the work of its busiest rank;
2. a stage's first forward waits for that micro-batch's forwards on every stage before it, and its
   last backward is followed by the backwards of every stage before it (with a split backward only
   the forwards count: the stage's W may overlap the chain). So for every stage ``k``::

       step >= sum_{s<k} chain_s + M * work_s=k        chain_s = f_s + b_s  (split: f_s)

Communication and per-action overhead only add; the co-location factor multiplies every action's
compute of a pipeline of two or more ranks, in the simulator as here. Over all partitions into ``S``
stages of a chain of total work ``W`` per micro-batch, with ``chain_s >= c * work_s``, the second fact is
least binding when each stage takes as much as the facts allow, a geometric series (the relaxation over
real-valued stage sizes)::

       step >= c * W / (1 - (1 - c / M) ** S)

which for ``S = P = M = 4``, ``c = 1`` is 1.46 x the ``M * W / P`` of the first fact: the pipeline
bubble of GPipe and 1F1B, as a bound no partition can beat.

3. A rank's first action is a forward of its lowest stage ``s_r`` (any action of a stage needs that
   micro-batch's forward on every stage below, and the rank's own stages below come first), and without a
   split backward its last action is a backward of ``s_r``, followed by the backwards of every stage
   below. So, for a partition::

       step >= sum_{s<s_r} f_s + (rank r's work) + max(sum_{s<s_r} b_s, rank r's step tail)

   the rank-level bubble: for ``v`` equal chunks per rank it is Megatron's interleaved bubble
   ``(P - 1)/(v M)``, where fact 2's relaxation leaves the looped schedules almost none. It needs the
   partition (which stage is a rank's first), so it is a partition floor only.

``tests/planner/test_bounds.py`` holds the floors under the simulation of every partition of small problems, under
every schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

__all__ = ["UnitWork", "candidate_floor_s", "partition_floor_s"]


@dataclass(frozen=True)
class UnitWork:
    """What every partition must compute for one micro-batch, unit by unit (seconds, full speed)."""

    work_s: tuple[float, ...]
    """Per unit: forward plus the cheaper of the full backward and its split parts."""
    chain_fraction: float
    """The least share of a unit's work that lies on the chain of fact 2 (1 without a split)."""

    @cached_property
    def total_s(self) -> float:
        return sum(self.work_s)

    @cached_property
    def longest_s(self) -> float:
        return max(self.work_s, default=0.0)

    @classmethod
    def of(
        cls,
        forward_s: Sequence[float],
        backward_s: Sequence[float],
        input_s: Sequence[float] = (),
        weight_s: Sequence[float] = (),
    ) -> UnitWork:
        """``input_s``/``weight_s`` given: a split backward (its chain holds only the forwards)."""
        if not weight_s:
            return cls(tuple(f + b for f, b in zip(forward_s, backward_s, strict=True)), 1.0)
        parts = zip(forward_s, backward_s, input_s, weight_s, strict=True)
        work = tuple(f + min(b, i + w) for f, b, i, w in parts)
        shares = [f / w for f, w in zip(forward_s, work, strict=True) if w > 0]
        return cls(work, min(shares, default=1.0))


def candidate_floor_s(work: UnitWork, num_microbatches: int, num_ranks: int, num_stages: int) -> float:
    """No partition of these units into ``num_stages`` stages on ``num_ranks`` ranks simulates faster."""
    m, total = num_microbatches, work.total_s
    spread = m * total / num_ranks
    longest = m * work.longest_s  # some stage holds the longest unit
    c = work.chain_fraction
    chain = c * total / (1.0 - (1.0 - c / m) ** num_stages) if c > 0 else 0.0
    return max(spread, longest, chain)


def partition_floor_s(
    stage_work_s: Sequence[float],
    stage_chain_s: Sequence[float],
    stage_rank: Sequence[int],
    num_microbatches: int,
    *,
    stage_forward_s: Sequence[float] = (),
    compute_scale: float = 1.0,
    action_overhead_s: float = 0.0,
    step_tail_s: Sequence[float] = (),
) -> float:
    """No simulation of this partition is shorter: per rank its work, overheads and step tail; per stage
    the chain before it plus its own work; with ``stage_forward_s``, per rank the chain before its first
    stage, its work, and the backwards after it (module docstring, fact 3)."""
    m = num_microbatches
    ranks = max(stage_rank) + 1
    scale = compute_scale if ranks > 1 else 1.0  # as the simulator scales every action of a pipeline
    busy = [0.0] * ranks
    for s, rank in enumerate(stage_rank):
        # Every stage runs at least a forward and a backward action per micro-batch.
        busy[rank] += m * (stage_work_s[s] * scale + 2 * action_overhead_s)
    tails = list(step_tail_s) + [0.0] * (ranks - len(step_tail_s))
    floor = max(b + t for b, t in zip(busy, tails, strict=True))
    before = 0.0
    for work_s, chain_s in zip(stage_work_s, stage_chain_s, strict=True):
        floor = max(floor, (before + m * work_s) * scale)
        before += chain_s
    if stage_forward_s:
        forwards = backwards = 0.0  # the chain below stage s
        seen: set[int] = set()
        for s, rank in enumerate(stage_rank):
            if rank not in seen:  # s is the rank's first stage
                seen.add(rank)
                floor = max(floor, forwards * scale + busy[rank] + max(backwards * scale, tails[rank]))
            forwards += stage_forward_s[s]
            backwards += stage_chain_s[s] - stage_forward_s[s]
    return floor if math.isfinite(floor) else math.inf
