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
- a transfer starts only once its receive is posted (gloo's do: a receive posted 5 ms after its send
  still took 230 us, one link latency, on the development VM; NCCL pairs a send with its receive too,
  not measured here), so an action that receives starts at ``max(producer's end, posted) + link`` or when
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
  gloo's copies take the rank's core: cnn13's interleaved plans ran slow in the order of their bytes).

Start times are therefore the longest path through a DAG (rank order edges + dependency edges), so
the result is exact for this model and independent of event tie-breaking.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, NamedTuple

from planner.errors import UsageError
from planner.schedule.orders import (
    Schedule,
    Step,
    check_microbatches,
    format_orders,
    rank_orders,
    ranks_of_stages,
    virtual_stages,
)
from planner.schedule.receives import receive_posts

__all__ = [
    "TimedAction",
    "SimulationResult",
    "ScheduleDeadlockError",
    "simulate",
    "in_flight_per_stage",
    "RuntimeTerms",
]


@dataclass(frozen=True)
class RuntimeTerms:
    """What a real runtime adds to the compute of a schedule (all zero: the textbook model)."""

    action_overhead_s: float = 0.0
    """Per compute action, on its rank: torch's Python dispatch, posting and waiting on P2P ops."""
    step_tail_s: tuple[float, ...] = ()
    """Per rank, after its last action: tied-gradient sum, ``optimizer.step()``, ``zero_grad``."""
    compute_scale: float = 1.0
    """Co-location factor: compute inside a running pipeline / compute profiled alone. Applied to every
    action of a pipeline of two or more ranks (module docstring)."""
    tail_groups: tuple[tuple[int, ...], ...] = ()
    """Ranks whose step tails open by summing a weight tied across them, each waiting for the others: a rank
    of a group starts its tail when the group's last rank has finished its last action."""
    resume: tuple[tuple[float, float, float], ...] = ()
    """``(idle gap, forward extra, backward extra)`` points, gaps increasing: what an action costs more after
    its rank was idle that long (profiles/resume.py). Interpolated linearly from ``(0, 0, 0)``, flat past
    the last gap; I and W take the backward's. Empty: nothing added."""
    transfer_compute_s_per_byte: float = 0.0
    """Compute time a rank loses per byte it sends or receives across ranks, charged to the action that sends
    or consumes it (F: its input and output; B or I: the gradients; W: none) and counted as compute. On CPU
    gloo copies each message on the ranks' cores (docs/cost-model.md, "The cores a CPU transfer takes"); 0:
    nothing."""

    def __post_init__(self) -> None:
        values = (
            self.action_overhead_s,
            self.transfer_compute_s_per_byte,
            *self.step_tail_s,
            *(v for point in self.resume for v in point),
        )
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise UsageError(f"runtime terms must be finite and >= 0, got {values}")
        if not (math.isfinite(self.compute_scale) and self.compute_scale > 0):
            raise UsageError(f"compute_scale must be finite and > 0, got {self.compute_scale}")
        gaps = [point[0] for point in self.resume]
        if not resume_gaps_valid(gaps):
            raise UsageError(f"resume gaps must be positive and increasing, got {gaps}")

    def at_speed(self, speed: float) -> RuntimeTerms:
        """These terms on a machine ``speed`` times slower: the per-action overhead and the step tails are
        the machine's own work (Python, the optimizer, refilling caches, copying messages), so they scale; the
        co-location factor is a ratio."""
        return replace(
            self,
            action_overhead_s=self.action_overhead_s * speed,
            transfer_compute_s_per_byte=self.transfer_compute_s_per_byte * speed,
            step_tail_s=tuple(t * speed for t in self.step_tail_s),
            resume=tuple((g, f * speed, b * speed) for g, f, b in self.resume),
        )


def resume_gaps_valid(gaps: Sequence[float]) -> bool:
    """The idle gaps of resume points: positive and strictly increasing (what interpolation needs)."""
    return all(g > 0 for g in gaps) and list(gaps) == sorted(set(gaps))


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


def _as_times(name: str, values: Sequence[float], length: int | None, *, allow_zero: bool) -> list[float]:
    out = [float(x) for x in values]
    if length is not None and len(out) != length:
        raise UsageError(f"{name} has {len(out)} values, expected {length}")
    for i, x in enumerate(out):
        ok = math.isfinite(x) and (x >= 0 if allow_zero else x > 0)
        if not ok:
            need = ">= 0" if allow_zero else "> 0"
            raise UsageError(f"{name}[{i}] = {x} must be finite and {need} (seconds)")
    return out


def _default_ranks(schedule: Schedule, num_stages: int) -> int:
    if schedule is Schedule.INTERLEAVED_1F1B or schedule.v_shape:
        if num_stages % 2 != 0:
            raise UsageError(
                f"{schedule.value} with {num_stages} stages: give num_ranks (the default, stages / 2, "
                f"needs an even number of stages)"
            )
        return num_stages // 2
    return num_stages


def simulate(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    num_microbatches: int,
    schedule: Schedule | str,
    *,
    num_ranks: int | None = None,
    comm_forward_s: Sequence[float] = (),
    comm_backward_s: Sequence[float] = (),
    weight_s: Sequence[float] = (),
    input_s: Sequence[float] = (),
    orders: Sequence[Sequence[Step]] | None = None,
    runtime: RuntimeTerms | None = None,
    cut_forward_bytes: Sequence[int] = (),
    cut_backward_bytes: Sequence[int] = (),
) -> SimulationResult:
    """Simulate one iteration of ``schedule``.

    Args:
        forward_s: per stage, forward time of one micro-batch (``R * v`` stages for looped schedules).
        backward_s: per stage, full backward time of one micro-batch (input + weight gradients).
        num_microbatches: ``M``.
        schedule: a :class:`Schedule`, or its name (parsed here: this is an entry point of the API).
        num_ranks: ``R``; default ``len(forward_s)``, or half of it for interleaved-1f1b, zbv and dualpipev.
        comm_forward_s: per cut ``s`` (between stage ``s`` and ``s+1``), the delay of sending the
            activations; empty means 0. It delays ``F(s+1, m)`` but occupies no compute.
        comm_backward_s: per cut ``s``, the delay of sending the gradient back to stage ``s``.
        weight_s: per stage, the weight-gradient part ``W`` of ``backward_s`` (measured by the profiler
            with torch's ``stage_backward_weight``); the input-gradient part is ``I = backward_s - W``.
            Used by the schedules that split the backward (zero-bubble, zbv, dualpipev; a full backward
            ``B`` still costs ``backward_s``). Empty: the backward stays unsplit, ``I = backward_s`` and
            ``W = 0`` (no guess of the split). Ignored by the other schedules.
        input_s: per stage, the input-gradient action ``I`` as measured apart (torch's
            ``stage_backward_input``); empty: ``backward_s - weight_s``. Given with ``weight_s``, the
            split may cost more than ``backward_s`` (torch walks the autograd graph to split it).
        orders: optional rank orders to run instead of :func:`rank_orders` (e.g. converted from a
            torch schedule's ``pipeline_order`` with :func:`planner.schedule.orders.orders_from_torch`).
        runtime: overhead per action, step tail per rank, co-location factor and the compute a byte sent costs;
            None: all zero.
        cut_forward_bytes: per cut, the bytes of one micro-batch's activations sent across it; empty: none
            (with ``runtime.transfer_compute_s_per_byte``, what each transfer costs its two ranks' compute).
        cut_backward_bytes: per cut, the bytes of the gradient sent back across it; empty: none.

    Returns:
        The :class:`SimulationResult`.

    Raises:
        UsageError: a time is not positive/finite, a list has the wrong length, ``M < 1``.
        ScheduleError: the schedule's placement or micro-batch requirement is not met.
        ScheduleDeadlockError: (internal) the orders cannot complete.

    Example:
        >>> simulate([1, 1, 1, 1], [1, 1, 1, 1], 8, "gpipe").iteration_s
        22.0
    """
    sched = Schedule.parse(schedule)
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise UsageError(f"num_microbatches = {num_microbatches!r} must be an integer >= 1")
    n = len(forward_s)
    if n < 1:
        raise UsageError("forward_s is empty: give one forward time per stage")
    fwd = _as_times("forward_s", forward_s, None, allow_zero=False)
    bwd = _as_times("backward_s", backward_s, n, allow_zero=False)
    cuts = n - 1
    comm_f = _as_times("comm_forward_s", comm_forward_s, cuts, allow_zero=True) if comm_forward_s else [0.0] * cuts
    comm_b = _as_times("comm_backward_s", comm_backward_s, cuts, allow_zero=True) if comm_backward_s else [0.0] * cuts
    weight = _as_times("weight_s", weight_s, n, allow_zero=True) if weight_s else []
    inputs = _as_times("input_s", input_s, n, allow_zero=True) if input_s else []
    if inputs and not weight:
        raise UsageError("input_s needs weight_s: give both parts of the split backward")
    for s, (w, b) in enumerate(zip(weight, bwd, strict=False)):
        if w > b and not inputs:
            raise UsageError(f"weight_s[{s}] = {w} must be at most backward_s[{s}] = {b} (W is a part of B)")
    ranks = _default_ranks(sched, n) if num_ranks is None else num_ranks
    if not isinstance(ranks, int) or ranks < 1:
        raise UsageError(f"num_ranks = {ranks!r} must be an integer >= 1")
    v = virtual_stages(sched, n, ranks)
    check_microbatches(sched, ranks, v, num_microbatches)
    # Micro-batch indices of rank_orders' orders are 0..M-1; given orders are scanned for theirs.
    width = num_microbatches if orders is None else None
    if orders is None:
        orders = _rank_orders(sched, n, num_microbatches, ranks)
        peaks = _peaks(sched, n, num_microbatches, ranks)
    elif len(orders) != ranks:
        raise UsageError(f"orders has {len(orders)} ranks, expected {ranks}")
    else:
        peaks = _peak_in_flight(orders, n)

    split = sched.splits_backward and bool(weight)
    w_part = weight if split else [0.0] * n
    i_part = inputs if (split and inputs) else [b - w for b, w in zip(bwd, w_part, strict=True)]
    terms = runtime or RuntimeTerms()
    if terms.step_tail_s and len(terms.step_tail_s) != ranks:
        raise UsageError(f"step_tail_s has {len(terms.step_tail_s)} values for {ranks} ranks")
    if any(not 0 <= r < ranks for group in terms.tail_groups for r in group):
        raise UsageError(f"tail_groups {terms.tail_groups} name a rank outside 0..{ranks - 1}")
    base = {
        "F": fwd,
        "B": bwd,
        "I": i_part,
        "W": w_part,
    }
    stage_rank = ranks_of_stages(orders, n)
    # A cut between two stages of one rank (the turn of a V) is a hand-over in memory, not a transfer.
    comm_f = [0.0 if stage_rank[c] == stage_rank[c + 1] else t for c, t in enumerate(comm_f)]
    comm_b = [0.0 if stage_rank[c] == stage_rank[c + 1] else t for c, t in enumerate(comm_b)]
    # pipeplan's own orders depend on nothing else, and so do their receives: kept for the plan search.
    posts = _receive_posts(sched, n, num_microbatches, ranks) if width is not None else _posts(sched, orders, n)
    # Not in proportion to the overlap with other ranks' compute, as before: ranks computing side by side
    # slowed each other only 0.97-1.05x, while every action inside a pipeline ran 1.2-2.2x its profile
    # (docs/BENCHMARKS.md, "Fidelity": ranks side by side vs in a pipeline, and the runs of both rules).
    scale = terms.compute_scale if ranks > 1 else 1.0
    durations = {kind: [t * scale for t in times] for kind, times in base.items()}
    if terms.transfer_compute_s_per_byte > 0:
        moved = _bytes_moved(cut_forward_bytes, cut_backward_bytes, stage_rank)
        cost = terms.transfer_compute_s_per_byte
        for kind, per_stage in (("F", moved[0]), ("B", moved[1]), ("I", moved[1])):
            durations[kind] = [t + cost * b for t, b in zip(durations[kind], per_stage, strict=True)]
    actions, comm_wait = _run(orders, durations, comm_f, comm_b, n, posts, terms.action_overhead_s, width, terms.resume)
    tails = terms.step_tail_s or (0.0,) * ranks
    # One pass, not one per rank: a plan search simulates up to 65,536 actions on 64 ranks.
    last_end = [0.0] * ranks
    for a in actions:
        last_end[a.rank] = max(last_end[a.rank], a.end_s)
    # A tail starts when its rank's last action ends, or, in a group, when the group's last one does (the
    # rank waits inside the collective, as torch's all_reduce does): it sorts last among the rank's actions.
    tail_start = list(last_end)
    for group in terms.tail_groups:
        arrived = max(last_end[r] for r in group)
        for r in group:
            tail_start[r] = max(tail_start[r], arrived)
    if any(t > 0 for t in tails):
        by_rank: list[list[TimedAction]] = [[] for _ in range(ranks)]
        for a in actions:
            by_rank[a.rank].append(a)
        for r in range(ranks):
            if tails[r] > 0:
                by_rank[r].append(TimedAction(r, -1, -1, "S", last_end[r], tail_start[r] + tails[r]))
        actions = [a for group in by_rank for a in group]
    iteration = max(a.end_s for a in actions)
    busy = [0.0] * ranks
    overhead = [0.0] * ranks
    for a in actions:
        if a.kind != "S":
            busy[a.rank] += a.end_s - a.start_s - a.overhead_s
            overhead[a.rank] += a.overhead_s
    bubble = 1.0 - sum(busy) / (ranks * iteration)
    per_stage = [f + b for f, b in zip(fwd, bwd, strict=True)]
    return SimulationResult(
        schedule=sched,
        num_stages=n,
        num_ranks=ranks,
        num_microbatches=num_microbatches,
        actions=tuple(actions),
        iteration_s=iteration,
        busy_s=tuple(busy),
        bubble_fraction=bubble,
        peak_in_flight=peaks,
        bottleneck_stage=per_stage.index(max(per_stage)),
        overhead_s=tuple(overhead),
        step_tail_s=tuple(tails),
        comm_wait_s=tuple(comm_wait),
        tail_groups=terms.tail_groups,
        resume=terms.resume,
    )


def _run(
    orders: Sequence[Sequence[Step]],
    durations: dict[str, list[float]],
    comm_f: list[float],
    comm_b: list[float],
    num_stages: int,
    posts: Sequence[Sequence[int]],
    overhead_s: float = 0.0,
    width: int | None = None,
    resume: tuple[tuple[float, float, float], ...] = (),
) -> tuple[list[TimedAction], list[float]]:
    # Longest path over the DAG: repeatedly advance every rank whose next action has all its
    # dependencies timed. Each pass advances at least one rank unless the orders deadlock.
    # End times live in one flat list per kind, indexed stage * M + micro-batch (None: not yet timed): a
    # plan search runs this on up to 65,536 actions per call, and tuple-keyed dict look-ups were its cost.
    # The dependency rules are the module docstring's, written out per kind (they were a function called per
    # action, with the same arithmetic: the results are the same).
    if width is None:  # one more than the largest micro-batch index, unless the caller knows it (M)
        width = 1 + max((step.microbatch for order in orders for step in order), default=0)
    kinds = ("F", "B", "I", "W", *durations)
    end: dict[str, list[float | None]] = {kind: [None] * (num_stages * width) for kind in kinds}
    end_f, end_b, end_i = end["F"], end["B"], end["I"]
    last = num_stages - 1
    pos = [0] * len(orders)
    free = [0.0] * len(orders)
    # Per rank, the key of an overlapped forward whose output leaves with the next action's sends (-1: none).
    held = [-1] * len(orders)
    comm_wait = [0.0] * len(orders)
    # Each rank's actions in its execution order: start times never decrease along a rank (an action starts
    # when the previous one has ended), so this is the (rank, start, end) order without sorting.
    by_rank: list[list[TimedAction]] = [[] for _ in orders]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            p, length, busy_until, out, post = pos[rank], len(order), free[rank], by_rank[rank], posts[rank]
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
                        if comm:  # the transfer starts when this rank has posted the receive
                            q = post[p]
                            posted = out[q].end_s if q >= 0 else 0.0
                            if posted > prev:
                                prev = posted
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
                        if comm_b[s]:
                            q = post[p]
                            posted = out[q].end_s if q >= 0 else 0.0
                            if posted > grad:
                                grad = posted
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
                out.append(TimedAction(rank, s, m, kind, start, finish, overhead_s))
                busy_until = finish
                p += 1
                remaining -= 1
                progressed = True
            pos[rank], free[rank] = p, busy_until
        if not progressed:
            waiting = ", ".join(f"rank {r}: {orders[r][p]}" for r, p in enumerate(pos) if p < len(orders[r]))
            raise ScheduleDeadlockError(f"schedule deadlocks; blocked at {waiting}\n{format_orders(orders)}")
    return [a for actions in by_rank for a in actions], comm_wait


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
    orders = tuple(tuple(order) for order in rank_orders(sched, num_stages, num_microbatches, num_ranks))
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

    What :func:`simulate` reports as ``peak_in_flight``: it depends only on the orders (see
    ``_peak_in_flight``), so no timing is run. For 1f1b it equals ``min(P - s, M)``, for gpipe ``M``.
    Each schedule keeps its own count: zero-bubble (ZB-H1) 1F1B's, zbv and dualpipev their V's.
    """
    sched = Schedule.parse(sched)
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise UsageError(f"num_microbatches = {num_microbatches!r} must be an integer >= 1")
    if num_stages < 1:
        raise UsageError("forward_s is empty: give one forward time per stage")
    ranks = _default_ranks(sched, num_stages) if num_ranks is None else num_ranks
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
    return _peak_in_flight(_rank_orders(sched, num_stages, num_microbatches, num_ranks), num_stages)
