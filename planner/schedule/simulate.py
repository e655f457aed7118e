"""Event simulator: predicts one training iteration of a pipeline schedule from per-stage times.

The model (docs/cost-model.md, "The model"):

- each rank runs its compute actions strictly in the order of :func:`planner.schedule.orders.rank_orders`,
  one at a time, starting at time 0;
- ``F(s, m)`` may start once its rank is free and ``F(s-1, m)`` has ended plus ``comm_forward_s[s-1]``;
- ``B(s, m)`` (or ``I(s, m)`` under zero-bubble) needs ``F(s, m)`` and the input gradient of stage
  ``s+1``, i.e. ``B``/``I(s+1, m)`` ended plus ``comm_backward_s[s]``; the last stage needs only its own F;
- ``W(s, m)`` needs ``I(s, m)``;
- communication delays a dependency but occupies no rank's compute time (sends are asynchronous);
  a forward paired with a backward (``dualpipev``'s ``OVERLAP_F_B``) sends its output only when the
  backward has ended, as torch's lowering posts the pair's sends after both;
  between two stages on the same rank (the turn of a V, ``zbv``/``dualpipev``) torch hands the tensor
  over in memory, so that cut costs no link time;
- a transfer starts only once its receive is posted (gloo and NCCL pair a send with its receive:
  docs/cost-model.md), so an action that receives starts at ``max(producer's end, posted) + link`` or when
  its rank is free, whichever is later. torch's single-stage schedules (``gpipe``, ``1f1b``) post a
  receive just before the action that needs it (posted = the rank's previous action's end); the
  multi-stage runtime posts it where its lowering (``_add_send_recv``) put it, after some earlier action of
  the rank or right before the one that needs it (:mod:`planner.schedule.receives`);
- with :class:`RuntimeTerms` (measured by ``pipeplan calibrate``, docs/cost-model.md "Runtime terms"):
  every action costs ``action_overhead_s`` more on its rank (torch's dispatch, posting and waiting on
  P2P ops, the loss), each rank ends the iteration with its step tail (tied-gradient sum,
  ``optimizer.step()`` and ``zero_grad``; ranks that share a tied weight start theirs together, when the
  later of them has finished its last action), and every action of a pipeline of two or more ranks
  computes ``k`` times slower than profiled (the co-location factor; docs/cost-model.md says why every
  action and not only those that overlap another rank's), and, given the bytes crossing each cut, an action
  that sends or receives across ranks computes ``transfer_compute_s_per_byte`` longer per byte (on CPU
  gloo's copies take the rank's core).

Start times are therefore the longest path through a DAG (rank order edges + dependency edges), so
the result is exact for this model and independent of event tie-breaking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from planner.errors import UsageError
from planner.schedule.memory import memory_moments
from planner.schedule.orders import (
    Schedule,
    Step,
    check_microbatches,
    default_ranks,
    format_orders,
    kept_rank_orders,
    ranks_of_stages,
    virtual_stages,
)
from planner.schedule.pipeline import Pipeline, RuntimeTerms
from planner.schedule.receives import receive_posts

__all__ = [
    "TimedAction",
    "SimulationResult",
    "ScheduleDeadlockError",
    "simulate",
    "in_flight_per_stage",
]


class ScheduleDeadlockError(RuntimeError):
    """Internal error: no rank can make progress. Never raised for the orders of ``rank_orders``."""


class TimedAction(NamedTuple):
    """One executed compute action with its simulated start and end (seconds from iteration start).

    A named tuple rather than a frozen dataclass: a plan search creates millions of them (up to 32,768 per
    simulation), and a frozen dataclass's ``__init__`` cost more than twice as much per action.
    """

    rank: int
    stage: int
    microbatch: int
    kind: str
    """F, B, I, W (compute) or S (the step tail: tied-gradient sum and optimizer)."""
    start_s: float
    end_s: float
    overhead_s: float = 0.0
    """The part of ``end_s - start_s`` that is runtime overhead, not compute."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "stage": self.stage,
            "microbatch": self.microbatch,
            "kind": self.kind,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "overhead_s": self.overhead_s,
        }


@dataclass(frozen=True)
class SimulationResult:
    """The simulated iteration of one schedule."""

    schedule: Schedule
    num_stages: int
    num_ranks: int
    num_microbatches: int
    actions: tuple[TimedAction, ...]
    """Every compute action, sorted by (rank, start)."""
    iteration_s: float
    """End of the last action."""
    busy_s: tuple[float, ...]
    """Per rank: total compute time (scaled by the co-location factor; overhead and step tail excluded)."""
    bubble_fraction: float
    """``1 - sum(busy_s) / (num_ranks * iteration_s)``: everything that is not compute."""
    peak_in_flight: tuple[int, ...]
    """Per stage: most micro-batches whose forward has ended but whose backward has not (its full
    backward B, or its W where the backward is split: torch's ``stage_backward_input`` keeps the autograd
    graph, and with it the saved activations, until ``stage_backward_weight``), i.e. how many
    micro-batches of saved activations the stage holds at its peak."""
    bottleneck_stage: int
    """The stage with the largest forward + backward time per micro-batch (lowest index on ties)."""
    overhead_s: tuple[float, ...] = ()
    """Per rank: runtime overhead of its actions (0 without :class:`RuntimeTerms`)."""
    step_tail_s: tuple[float, ...] = ()
    """Per rank: tied-gradient sum and optimizer after its last action."""
    comm_wait_s: tuple[float, ...] = ()
    """Per rank: time idle because a needed tensor was still on the link (not the schedule's bubble)."""
    tail_groups: tuple[tuple[int, ...], ...] = ()
    """The runtime terms' groups of ranks whose tails start together (:class:`RuntimeTerms`)."""
    resume: tuple[tuple[float, float, float], ...] = ()
    """The runtime terms' cost of resuming after a wait (:class:`RuntimeTerms`)."""

    @property
    def virtual_stages(self) -> int:
        return self.num_stages // self.num_ranks

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``--json``)."""
        return {
            "schedule": self.schedule.value,
            "num_stages": self.num_stages,
            "num_ranks": self.num_ranks,
            "num_microbatches": self.num_microbatches,
            "iteration_s": self.iteration_s,
            "busy_s": list(self.busy_s),
            "bubble_fraction": self.bubble_fraction,
            "peak_in_flight": list(self.peak_in_flight),
            "bottleneck_stage": self.bottleneck_stage,
            "overhead_s": list(self.overhead_s),
            "step_tail_s": list(self.step_tail_s),
            "comm_wait_s": list(self.comm_wait_s),
            "tail_groups": [list(g) for g in self.tail_groups],
            "resume": [list(point) for point in self.resume],
            "actions": [a.to_dict() for a in self.actions],
        }


@dataclass(frozen=True)
class _Costs:
    """What each action costs and each link delays, as :func:`_run` reads them."""

    durations_s: dict[str, list[float]]
    """Per kind (F, B, I, W), per stage: the action's compute, co-location and transfer copies included."""
    comm_forward_s: list[float]
    """Per cut: the activations' link time (0 where the cut stays on one rank)."""
    comm_backward_s: list[float]
    """Per cut: the gradient's link time."""
    overhead_s: float
    """Per action: the runtime's overhead."""
    resume: tuple[tuple[float, float, float], ...]
    """The extra of an action after its rank was idle (:attr:`RuntimeTerms.resume`)."""


def simulate(
    pipeline: Pipeline, orders: Sequence[Sequence[Step]] | None = None, *, keep_actions: bool = True
) -> SimulationResult:
    """Simulate one iteration of ``pipeline``: its schedule, stage times, links and runtime terms.

    Args:
        pipeline: the :class:`~planner.schedule.pipeline.Pipeline`, its values checked when it was made.
        orders: optional rank orders to run instead of :func:`rank_orders` (e.g. converted from a
            torch schedule's ``pipeline_order`` with :func:`planner.schedule.orders.orders_from_torch`).
        keep_actions: False leaves ``actions`` empty, every other field the same: a plan search ranks
            candidates by their totals and need not build an action object each.

    Returns:
        The :class:`SimulationResult`.

    Raises:
        UsageError: ``orders`` or the runtime terms do not match the ranks, cut bytes of the wrong length.
        ScheduleError: the schedule's placement or micro-batch requirement is not met.
        ScheduleDeadlockError: (internal) the orders cannot complete.

    Example:
        >>> simulate(Pipeline([1, 1, 1, 1], [1, 1, 1, 1], 8, "gpipe")).iteration_s
        22.0
    """
    sched, n, m = pipeline.schedule, pipeline.num_stages, pipeline.num_microbatches
    ranks = pipeline.num_ranks
    assert ranks is not None  # set when the pipeline was made
    check_microbatches(sched, ranks, virtual_stages(sched, n, ranks), m)
    own = orders is None
    # Micro-batch indices of rank_orders' orders are 0..M-1; given orders are scanned for theirs.
    width = m if own else 1 + max((step.microbatch for order in orders for step in order), default=0)
    if orders is None:
        orders = _rank_orders(sched, n, m, ranks)
        peaks = _peaks(sched, n, m, ranks)
    elif len(orders) != ranks:
        raise UsageError(f"orders has {len(orders)} ranks, expected {ranks}")
    else:
        peaks = _peak_in_flight(orders, n)
    terms = pipeline.runtime or RuntimeTerms()
    _check_runtime(terms, ranks)
    stage_rank = ranks_of_stages(orders, n)
    # pipeplan's own orders depend on nothing else, and so do their receives: kept for the plan search.
    posts = _receive_posts(sched, n, m, ranks) if own else _posts(sched, orders, n)
    costs = _costs(pipeline, terms, stage_rank)
    run = _run(orders, posts, width, costs, keep_actions)
    tails = terms.step_tail_s or (0.0,) * ranks
    tail_ends = _tail_ends(run.last_end_s, tails, terms.tail_groups)
    iteration = max(max(run.last_end_s), max(tail_ends))
    actions = _with_step_tails(run.actions, run.last_end_s, tail_ends) if keep_actions else []
    busy = run.busy_s
    per_stage = [f + b for f, b in zip(pipeline.forward_s, pipeline.backward_s, strict=True)]
    return SimulationResult(
        schedule=sched,
        num_stages=n,
        num_ranks=ranks,
        num_microbatches=m,
        actions=tuple(actions),
        iteration_s=iteration,
        busy_s=tuple(busy),
        bubble_fraction=1.0 - sum(busy) / (ranks * iteration),
        peak_in_flight=peaks,
        bottleneck_stage=per_stage.index(max(per_stage)),
        overhead_s=tuple(run.overhead_s),
        step_tail_s=tuple(tails),
        comm_wait_s=tuple(run.comm_wait_s),
        tail_groups=terms.tail_groups,
        resume=terms.resume,
    )


def _check_runtime(terms: RuntimeTerms, ranks: int) -> None:
    """The runtime terms name the pipeline's ranks: one step tail each, groups within them."""
    if terms.step_tail_s and len(terms.step_tail_s) != ranks:
        raise UsageError(f"step_tail_s has {len(terms.step_tail_s)} values for {ranks} ranks")
    if any(not 0 <= r < ranks for group in terms.tail_groups for r in group):
        raise UsageError(f"tail_groups {terms.tail_groups} name a rank outside 0..{ranks - 1}")


def _costs(pipeline: Pipeline, terms: RuntimeTerms, stage_rank: Sequence[int]) -> _Costs:
    """Each action's duration per kind and stage, and each cut's link time, under the runtime terms."""
    n, cuts = pipeline.num_stages, pipeline.num_stages - 1
    fwd, bwd = list(pipeline.forward_s), list(pipeline.backward_s)
    split = pipeline.schedule.splits_backward and bool(pipeline.weight_s)
    w_part = list(pipeline.weight_s) if split else [0.0] * n
    inputs = list(pipeline.input_s)
    i_part = inputs if (split and inputs) else [b - w for b, w in zip(bwd, w_part, strict=True)]
    base = {"F": fwd, "B": bwd, "I": i_part, "W": w_part}
    # A cut between two stages of one rank (the turn of a V) is a hand-over in memory, not a transfer.
    comm_f = [
        0.0 if stage_rank[c] == stage_rank[c + 1] else t for c, t in enumerate(pipeline.comm_forward_s or [0.0] * cuts)
    ]
    comm_b = [
        0.0 if stage_rank[c] == stage_rank[c + 1] else t for c, t in enumerate(pipeline.comm_backward_s or [0.0] * cuts)
    ]
    # Every action of a pipeline of two or more ranks, not only those that overlap another rank's compute:
    # docs/cost-model.md says why.
    scale = terms.compute_scale if pipeline.num_ranks != 1 else 1.0
    durations = {kind: [t * scale for t in times] for kind, times in base.items()}
    if terms.transfer_compute_s_per_byte > 0:
        moved = _bytes_moved(pipeline.cut_forward_bytes, pipeline.cut_backward_bytes, stage_rank)
        cost = terms.transfer_compute_s_per_byte
        for kind, per_stage in (("F", moved[0]), ("B", moved[1]), ("I", moved[1])):
            durations[kind] = [t + cost * b for t, b in zip(durations[kind], per_stage, strict=True)]
    return _Costs(durations, comm_f, comm_b, terms.action_overhead_s, terms.resume)


def _tail_ends(last_end_s: Sequence[float], tails: Sequence[float], groups: Sequence[Sequence[int]]) -> list[float]:
    """Per rank, the end of its step tail (0 without one). A tail starts when its rank's last action ends, or, in
    a group, when the group's last one does (the rank waits inside the collective, as torch's all_reduce does)."""
    start = list(last_end_s)
    for group in groups:
        arrived = max(last_end_s[r] for r in group)
        for r in group:
            start[r] = max(start[r], arrived)
    return [s + t if t > 0 else 0.0 for s, t in zip(start, tails, strict=True)]


def _with_step_tails(
    by_rank: list[list[TimedAction]], last_end_s: Sequence[float], tail_ends: Sequence[float]
) -> list[TimedAction]:
    """The actions in (rank, start) order, each rank's step tail (an S action) after its last one: it sorts last
    among the rank's actions."""
    for r, end in enumerate(tail_ends):
        if end > 0:
            by_rank[r].append(TimedAction(r, -1, -1, "S", last_end_s[r], end))
    return [a for actions in by_rank for a in actions]


class _Ran(NamedTuple):
    """What :func:`_run` gives, per rank."""

    actions: list[list[TimedAction]]
    """The actions in execution order (empty lists unless kept)."""
    last_end_s: list[float]
    busy_s: list[float]
    """Compute: each action's span less its overhead, summed in execution order."""
    overhead_s: list[float]
    comm_wait_s: list[float]
    """Idle waiting on a link."""


def _run(
    orders: Sequence[Sequence[Step]], posts: Sequence[Sequence[int]], width: int, costs: _Costs, keep_actions: bool
) -> _Ran:
    """Time every action of ``orders`` (the longest path over the DAG of the module docstring's rules); ``posts``
    as :func:`_posts` gives them, ``width`` above every micro-batch index."""
    # Repeatedly advance every rank whose next action has all its dependencies timed: each pass advances at least
    # one rank unless the orders deadlock. End times live in one flat list per kind, indexed stage * M +
    # micro-batch (None: not yet timed), and the dependency rules are written out per kind in the loop: a plan
    # search runs this on up to 65,536 actions per call, where tuple-keyed look-ups and a call per action cost.
    durations, comm_f, comm_b = costs.durations_s, costs.comm_forward_s, costs.comm_backward_s
    overhead_s, resume = costs.overhead_s, costs.resume
    last = len(durations["F"]) - 1
    end: dict[str, list[float | None]] = {kind: [None] * ((last + 1) * width) for kind in durations}
    end_f, end_b, end_i = end["F"], end["B"], end["I"]
    ranks = len(orders)
    pos, free, comm_wait = [0] * ranks, [0.0] * ranks, [0.0] * ranks
    busy, overhead = [0.0] * ranks, [0.0] * ranks
    # Per rank, the key of an overlapped forward whose output leaves with the next action's sends (-1: none).
    held = [-1] * len(orders)
    # Each rank's actions in its execution order: start times never decrease along a rank (an action starts
    # when the previous one has ended), so this is the (rank, start, end) order without sorting.
    by_rank: list[list[TimedAction]] = [[] for _ in orders]
    # Each rank's action ends in execution order, for the receives posted after one of its actions.
    ends: list[list[float]] = [[] for _ in orders]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            p, length, busy_until, out, post = pos[rank], len(order), free[rank], ends[rank], posts[rank]
            actions = by_rank[rank]
            while p < length:
                step = order[p]
                kind, s, m = step.kind, step.stage, step.microbatch
                key = s * width + m
                if kind == "F":
                    if s == 0:
                        ready = comm = 0.0
                    else:
                        prev = end_f[key - width]
                        if prev is None:
                            break
                        comm = comm_f[s - 1]
                        # The transfer starts when this rank has posted the receive (q < 0: at the start).
                        if comm and (q := post[p]) >= 0 and out[q] > prev:
                            prev = out[q]
                        ready = prev + comm
                elif kind == "W":
                    own_i = end_i[key]
                    if own_i is None:
                        break
                    ready, comm = own_i, 0.0
                else:
                    own = end_f[key]
                    if own is None:
                        break
                    if s == last:
                        ready, comm = own, 0.0
                    else:
                        grad = end_b[key + width]
                        if grad is None:
                            grad = end_i[key + width]
                            if grad is None:
                                break
                        if comm_b[s] and (q := post[p]) >= 0 and out[q] > grad:
                            grad = out[q]
                        arrival = grad + comm_b[s]
                        ready, comm = (arrival, comm_b[s]) if arrival > own else (own, 0.0)
                # max() and min() spelled as comparisons (the same values, ties included: builtin calls cost).
                start = ready if ready > busy_until else busy_until
                # Of the wait, the part after the producer finished is the link's, not the schedule's.
                wait = start - busy_until
                comm_wait[rank] += wait if wait <= comm else comm
                finish = start + durations[kind][s] + overhead_s
                if resume and wait > 0:
                    finish += _resume_extra(resume, wait, kind == "F")
                if held[rank] >= 0:
                    end_f[held[rank]] = finish
                    held[rank] = -1
                if kind == "F" and step.overlapped:
                    held[rank] = key
                else:
                    end[kind][key] = finish
                out.append(finish)
                busy[rank] += finish - start - overhead_s
                overhead[rank] += overhead_s
                if keep_actions:
                    actions.append(TimedAction(rank, s, m, kind, start, finish, overhead_s))
                busy_until = finish
                p += 1
                remaining -= 1
                progressed = True
            pos[rank], free[rank] = p, busy_until
        if not progressed:
            raise _deadlock(orders, pos)
    last_end = [max(e, default=0.0) for e in ends]
    return _Ran(by_rank, last_end, busy, overhead, comm_wait)


def _deadlock(orders: Sequence[Sequence[Step]], pos: Sequence[int]) -> ScheduleDeadlockError:
    """The error for orders that cannot go on: where each rank is blocked, and the orders."""
    waiting = ", ".join(f"rank {r}: {orders[r][p]}" for r, p in enumerate(pos) if p < len(orders[r]))
    return ScheduleDeadlockError(f"schedule deadlocks; blocked at {waiting}\n{format_orders(orders)}")


def _bytes_moved(
    forward_bytes: Sequence[int], backward_bytes: Sequence[int], stage_rank: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Per stage, the bytes its forward and its backward (B or I) send and receive across ranks: F receives its
    input and sends its output, B/I receive the output's gradient and send the input's; a cut inside one rank
    moves nothing."""
    n = len(stage_rank)
    for name, values in (("cut_forward_bytes", forward_bytes), ("cut_backward_bytes", backward_bytes)):
        if values and len(values) != n - 1:
            raise UsageError(f"{name} has {len(values)} values, expected {n - 1}")
        if any(b < 0 for b in values):
            raise UsageError(f"{name} must be >= 0, got {list(values)}")
    crossing = [stage_rank[c] != stage_rank[c + 1] for c in range(n - 1)]
    per_kind = []
    for values in (forward_bytes, backward_bytes):
        cut = [b if cross else 0 for b, cross in zip(values, crossing, strict=True)] if values else [0] * (n - 1)
        per_kind.append([(cut[s - 1] if s > 0 else 0) + (cut[s] if s < n - 1 else 0) for s in range(n)])
    return per_kind[0], per_kind[1]


def _resume_extra(points: tuple[tuple[float, float, float], ...], gap: float, forward: bool) -> float:
    """The extra of an action after ``gap`` idle: linear between the points and from ``(0, 0)``, flat after."""
    column = 1 if forward else 2
    previous_gap, previous = 0.0, 0.0
    for point in points:
        if gap <= point[0]:
            return previous + (point[column] - previous) * (gap - previous_gap) / (point[0] - previous_gap)
        previous_gap, previous = point[0], point[column]
    return previous


def _peak_in_flight(orders: Sequence[Sequence[Step]], num_stages: int) -> tuple[int, ...]:
    # A stage's actions all run on one rank, in order, so its in-flight count depends only on the
    # order: +1 after each F, -1 after the action that ends the micro-batch's backward (B, or W after
    # an I: dualpipev mixes the two on one stage).
    held = [0] * num_stages
    peak = [0] * num_stages
    for order in orders:
        for step in order:
            if step.kind == "F":
                held[step.stage] += 1
                peak[step.stage] = max(peak[step.stage], held[step.stage])
            elif step.kind in ("B", "W"):
                held[step.stage] -= 1
    return tuple(peak)


@lru_cache(maxsize=32)
def _rank_orders(
    sched: Schedule, num_stages: int, num_microbatches: int, num_ranks: int
) -> tuple[tuple[Step, ...], ...]:
    """:func:`rank_orders`, kept: a plan search simulates each (schedule, stages, M, ranks) for every partition
    it scores (up to 65,536 steps each time); the orders depend on nothing else, and are read, never changed."""
    orders = kept_rank_orders(sched, num_stages, num_microbatches, num_ranks)
    # _run indexes end times by stage * M + micro-batch: an order outside 0..M-1 would alias another action.
    if any(not 0 <= step.microbatch < num_microbatches for order in orders for step in order):
        raise ScheduleDeadlockError(
            f"internal: {sched.value} orders hold a micro-batch outside 0..{num_microbatches - 1}"
        )
    return orders


@lru_cache(maxsize=32)
def _receive_posts(
    sched: Schedule, num_stages: int, num_microbatches: int, num_ranks: int
) -> tuple[tuple[int, ...], ...]:
    """:func:`_posts` of :func:`_rank_orders`, kept for the same reason."""
    return _posts(sched, _rank_orders(sched, num_stages, num_microbatches, num_ranks), num_stages)


def _posts(sched: Schedule, orders: Sequence[Sequence[Step]], num_stages: int) -> tuple[tuple[int, ...], ...]:
    """Per rank and action, the index of the action after which its receive is posted: the one before it under
    torch's single-stage schedules (posted when needed), where the lowering puts it under the multi-stage runtime
    (:func:`~planner.schedule.receives.receive_posts`)."""
    if not sched.multi_stage:
        return tuple(tuple(range(-1, len(order) - 1)) for order in orders)
    try:
        return receive_posts(orders, num_stages)
    except ValueError as exc:
        raise ScheduleDeadlockError(str(exc)) from exc


def in_flight_per_stage(
    sched: Schedule, num_stages: int, num_microbatches: int, num_ranks: int | None = None
) -> tuple[int, ...]:
    """Peak micro-batches of activations held per stage (for the memory model).

    What :func:`simulate` reports as ``peak_in_flight``: it depends only on the orders (``_peak_in_flight``
    counts it on them; tests hold the count here equal), so no timing is run. For 1f1b it equals
    ``min(P - s, M)``, for gpipe ``M``.
    Each schedule keeps its own count: zero-bubble (ZB-H1) 1F1B's, zbv and dualpipev their V's.
    """
    sched = Schedule.parse(sched)
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise UsageError(f"num_microbatches = {num_microbatches!r} must be an integer >= 1")
    if num_stages < 1:
        raise UsageError("forward_s is empty: give one forward time per stage")
    ranks = default_ranks(sched, num_stages) if num_ranks is None else num_ranks
    if not isinstance(ranks, int) or ranks < 1:
        raise UsageError(f"num_ranks = {ranks!r} must be an integer >= 1")
    return _peaks(sched, num_stages, num_microbatches, ranks)


@lru_cache(maxsize=32)
def _peaks(sched: Schedule, num_stages: int, num_microbatches: int, num_ranks: int) -> tuple[int, ...]:
    # Where the count has a closed form the orders are not built (a 256-stage looped BFS order is 32,768
    # steps, and a cluster search asks once per layout); tests hold both equal.
    if sched in (Schedule.NAIVE, Schedule.GPIPE, Schedule.LOOPED_BFS):  # every forward before any backward
        check_microbatches(sched, num_ranks, virtual_stages(sched, num_stages, num_ranks), num_microbatches)
        return (num_microbatches,) * num_stages
    # Elsewhere from the stage's memory moments, which the plan search needs anyway (one walk of the orders, not
    # two): the count rises only at a forward, so it peaks at the start of the next backward action that lowers
    # it, where a moment holds it as ``waiting + split``; the moments kept are those where any such sum peaks.
    moments = memory_moments(sched, num_stages, num_microbatches, num_ranks)
    return tuple(max((m.waiting + m.split for m in stage), default=0) for stage in moments)
