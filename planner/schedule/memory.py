"""When a stage's memory peaks: the moments of a schedule at which a stage holds the most, from its orders.

A stage's live memory grows with each forward (the micro-batch's activations are held until its backward) and
peaks when a backward action begins: then the micro-batches in flight are all held, the backward adds its
working memory, and, except for the step's first backward, the weight gradients exist (``zero_grad`` frees
them at the end of every step; the first backward allocates them). Which moment is the peak depends on the
sizes (a stage whose gradients outweigh one micro-batch's activations peaks at its second backward under
GPipe, not its first), so this module returns every moment that could be one, and planner/cost.py weighs them.

A moment counts, for one stage at the start of one backward action (B, I or W, in the order of
:func:`planner.schedule.orders.rank_orders`, so torch 2.13's):

- ``waiting``: micro-batches whose forward has run and whose backward has not begun (the acting one among
  them for B and I): each holds its activations;
- ``split``: micro-batches whose input gradient (I) has run and whose weight gradient (W) has not (the acting
  one among them for W): each holds its activations, kept by the graph, and the gradients I keeps for W;
- ``grads``: whether the stage's weight gradients exist (a B or W ran before in the step);
- ``kind``: the acting action's kind (a recomputing stage re-runs its forward inside B and I);
- ``done``: on the last stage, micro-batches whose backward is done (B, or W after I): torch's schedules keep
  each one's loss (``_internal_losses``) until the step ends (0 on the other stages, which hold no loss);
- ``held_output``: on the last stage, 1 where the rank's latest forward is this stage's and its micro-batch's
  backward (B or I) has begun before this action: torch 2.13's schedule loops keep that forward's output in a
  local (``output``) until the rank's next forward, so it outlives what the stage lets go at I (the model's
  output; the last stage sends none);
- ``sent_grads``, ``sent_outputs``: input gradients and outputs of micro-batches past their backward that a
  send still holds. A gloo send's work keeps its tensor for as long as the work lives ("the work captures the
  tensor to prevent it being deallocated", ProcessGroupGloo.cpp ``SendWork``), and torch 2.13's schedules keep
  works and ops in variables past their wait (schedules.py). The multi-stage runtime (``_PipelineScheduleRuntime``)
  keeps every send's work to the end of the step, so every input gradient sent (after B or I) and every output
  sent whose backward is done (after B or W) stays. GPipe keeps every forward and backward send's work in
  ``fwd_sends_to_wait`` / ``bwd_sends_to_wait`` to the end of the step: all of them. 1F1B keeps its last
  backward's send ops in ``bwd_sends`` until the next backward's replace them (one input gradient at every
  backward but the step's first), and the work of its warm-up's second-to-last forward send in ``send_work``
  until its cool-down reassigns it: with ``w = min(M, P - s)`` warm-up forwards, the output of micro-batch
  ``w - 2`` from its own backward to the last one of the steady phase (micro-batch ``M - w``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from planner.schedule.orders import Schedule, kept_rank_orders

__all__ = ["MemoryMoment", "memory_moments"]


@dataclass(frozen=True)
class MemoryMoment:
    waiting: int
    split: int
    grads: bool
    kind: str
    sent_grads: int = 0
    sent_outputs: int = 0
    done: int = 0
    """Micro-batches whose backward is done (B, or W after I): the last stage still holds their losses."""
    held_output: int = 0
    """The last stage: 1 where the schedule's loop still references the output of the rank's latest forward, whose
    micro-batch is past the start of its backward (module docstring)."""

    def covers(self, other: MemoryMoment) -> bool:
        """Whether this moment holds at least as much as ``other`` whatever the sizes: as many micro-batches of
        each state and sends, the gradients if ``other`` has them, and the same action (whose working memory)."""
        return (
            self.waiting >= other.waiting
            and self.split >= other.split
            and self.grads >= other.grads
            and self.sent_grads >= other.sent_grads
            and self.sent_outputs >= other.sent_outputs
            and self.done >= other.done
            and self.held_output >= other.held_output
            and self.kind == other.kind
        )


_Fields = tuple[int, int, bool, str, int, int, int, int]
"""A moment's fields in :class:`MemoryMoment`'s order, as the walk finds them."""


@lru_cache(maxsize=2048)
def _pareto(found: frozenset[_Fields]) -> tuple[MemoryMoment, ...]:
    """The moments no other covers. Fullest first, so that a moment is only held against those kept (one covers
    another only if it holds at least as much of everything, so none later covers one before). Cached: a plan
    search walks hundreds of schedules, and two of every three stages' moments are ones met shortly before (2,048
    sets hold nearly every reuse of the device-model Llama 3 70B search, about 8 KB each)."""

    def fullness(m: MemoryMoment) -> tuple[int, ...]:
        return (
            m.waiting + m.split + m.sent_grads + m.sent_outputs + m.done + m.held_output + int(m.grads),
            m.waiting,
            m.split,
            m.sent_grads,
        )

    # A convex mix first (cheap, and it leaves few; on the counts alone, an object made only for what it keeps),
    # then single moments across gradient states.
    groups: dict[tuple[bool, str], list[tuple[int, int, int, int, int, int]]] = {}
    for waiting, split, grads, kind, sent_grads, sent_outputs, done, held_output in found:
        groups.setdefault((grads, kind), []).append((waiting, split, sent_grads, sent_outputs, done, held_output))
    candidates = [
        MemoryMoment(waiting, split, grads, kind, sent_grads, sent_outputs, done, held_output)
        for (grads, kind), group in groups.items()
        for waiting, split, sent_grads, sent_outputs, done, held_output in _hull(group)
    ]
    kept: list[MemoryMoment] = []
    for m in sorted(candidates, key=fullness, reverse=True):
        if not any(o.covers(m) for o in kept):
            kept.append(m)
    return tuple(
        sorted(
            kept,
            key=lambda m: (m.waiting, m.split, m.grads, m.kind, m.sent_grads, m.sent_outputs, m.done, m.held_output),
        )
    )


def _between(p: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether some ``lam`` in [0, 1] makes ``lam a + (1 - lam) b`` at least ``p`` in every count (as
    :func:`_hull` takes them): each count bounds ``lam`` from below or above, and the highest lower bound must not pass
    the lowest upper one (fractions compared cross-multiplied: the counts are integers)."""
    low_num, low_den = 0, 1  # lam >= low_num / low_den
    high_num, high_den = 1, 1  # lam <= high_num / high_den
    for i in range(len(p)):  # indexed, not zipped: the search asks millions of times
        x, y, z = p[i], a[i], b[i]  # x <= z + lam (y - z)
        if y > z:
            if x > y:
                return False
            if (x - z) * low_den > low_num * (y - z):
                low_num, low_den = x - z, y - z
        elif y < z:
            if x > z:
                return False
            if (z - x) * high_den < high_num * (z - y):
                high_num, high_den = z - x, z - y
        elif x > y:
            return False
    return low_num * high_den <= high_num * low_den


def _hull(group: list[tuple[int, int, int, int, int, int]]) -> list[tuple[int, int, int, int, int, int]]:
    """The counts (``waiting, split, sent_grads, sent_outputs, done, held_output``) of one action kind and gradient
    state's moments that a mix of two others does not cover.

    A stage's memory at a moment is a sum of its counts, each times bytes that do not depend on the moment
    (solvers/problem.py ``stage_memory_peak``), so the largest over the moments is never at one that is covered
    by a convex combination of others: under an interleaved schedule the moments lie on a line (one more
    micro-batch waiting, one fewer send held) and only its ends can peak. A monotone chain in the order of the
    counts: each moment drops the last ones kept while they lie between it and the one before them.
    """
    kept: list[tuple[int, int, int, int, int, int]] = []
    for counts in sorted(group):
        while len(kept) >= 2 and _between(kept[-1], kept[-2], counts):
            del kept[-1]
        kept.append(counts)
    return kept


@lru_cache(maxsize=1024)
def memory_moments(
    sched: Schedule, num_stages: int, num_microbatches: int, num_ranks: int
) -> tuple[tuple[MemoryMoment, ...], ...]:
    """Per stage, the moments at which it may peak (none dominated by another; see the module docstring)."""
    waiting = [0] * num_stages
    split = [0] * num_stages
    done = [0] * num_stages
    grads = [False] * num_stages
    # Plain tuples of MemoryMoment's fields while walking (a walk meets every backward of the step, and most
    # repeat a moment already found): one object per distinct moment, made at the end.
    found: list[set[_Fields]] = [set() for _ in range(num_stages)]
    held = _sends_holding(sched, num_stages, num_microbatches)
    last = num_stages - 1
    for order in kept_rank_orders(sched, num_stages, num_microbatches, num_ranks):
        latest: tuple[int, int] | None = None  # the rank's latest forward: (stage, micro-batch)
        begun: set[int] = set()  # the last stage's micro-batches whose B or I has run
        for step in order:
            s, kind = step.stage, step.kind
            if kind == "F":
                waiting[s] += 1
                latest = (s, step.microbatch)
                continue
            sent_grads, sent_outputs = held(done[s], split[s], s)
            if s == last:
                # Only the last stage holds losses (elsewhere ``done`` would only keep moments the others cover), and
                # only its output, never sent, is held by nothing but the schedule's loop past I.
                output = int(latest is not None and latest[0] == s and latest[1] in begun)
                found[s].add((waiting[s], split[s], grads[s], kind, sent_grads, sent_outputs, done[s], output))
                if kind in "BI":
                    begun.add(step.microbatch)
            else:
                found[s].add((waiting[s], split[s], grads[s], kind, sent_grads, sent_outputs, 0, 0))
            if kind == "B":
                waiting[s] -= 1
                done[s] += 1
                grads[s] = True
            elif kind == "I":
                waiting[s] -= 1
                split[s] += 1
            else:
                split[s] -= 1
                done[s] += 1
                grads[s] = True
    return tuple(_pareto(frozenset(f)) for f in found)


def _sends_holding(
    sched: Schedule, num_stages: int, num_microbatches: int
) -> Callable[[int, int, int], tuple[int, int]]:
    """``held(done, split, stage)``: the ``(input gradients, outputs)`` of finished micro-batches that a send still
    holds at the start of a backward action of ``stage``, ``done`` backward actions (B or W) finished before it and
    ``split`` micro-batches between their I and W (module docstring). One function per schedule, chosen once: the
    walk asks at every backward of the step."""
    if sched.multi_stage:
        return lambda done, split, stage: (done + split, done)
    if sched is Schedule.ONE_F_ONE_B:

        def one_f_one_b(done: int, split: int, stage: int) -> tuple[int, int]:
            warmup = min(num_microbatches, num_stages - stage)
            return int(done >= 1), int(warmup >= 2 and warmup - 2 < done <= num_microbatches - warmup)

        return one_f_one_b
    return lambda done, split, stage: (done, done)
