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

4. Facts 1 and 2 are the rank orders' sequence edges and data edges taken one kind at a time. Taken together,
   under the schedule's own orders (planner/schedule/orders.py), with each stage's forward ``f_s`` and backward
   ``b_s`` as real variables (totals fixed; each ``b_s / f_s`` within the units' least and greatest ratio), the
   least longest path of the action graph is a linear programme: a start time per action, no earlier than the
   end of the rank's previous action and of the action it needs (``F`` of the stage before, ``B`` of the stage
   after). Every partition's stage times are one feasible point, communication, overhead and recomputation only
   lengthen actions, and a longest path never shortens when an action does, so no partition simulates
   faster. Kept whole the programme has ``2 S M`` actions; :func:`order_floor_s` keeps those of the first and
   the last micro-batch and lets each rank's other actions only add their time to the gap before the next
   kept one (the edges left out only loosen it). It holds most of the interleaved bubble (Megatron's
   ``(P - 1) / (v M)`` on equal chunks) that facts 1-3 leave out before a partition is known: e.g. 8.7 % of
   the work for P = 2, v = 4, M = 2, where fact 2's relaxation finds 1 %.

``tests/planner/test_bounds.py`` holds the floors under the simulation of every partition of small problems, under
every schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from planner.schedule.orders import Schedule, Step, kept_rank_orders

__all__ = [
    "UnitWork",
    "candidate_floor_s",
    "partition_floor_s",
    "partition_order_floor_s",
    "order_floor_s",
    "order_ceiling_s",
]

LP_SHAVE = 1e-6
""":func:`order_floor_s` is taken this fraction below the programme's optimum: HiGHS meets its constraints to
1e-7 of the (normalised, order-1) values, and a floor must not rise above the true optimum by that."""


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


def order_floor_s(
    schedule: Schedule,
    num_ranks: int,
    num_stages: int,
    num_microbatches: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
) -> float:
    """No partition of these units (per-unit forward and full backward) into ``num_stages`` stages simulates
    faster under ``schedule``'s rank orders (module docstring, fact 4), at full speed. 0 for a split backward
    (its I and W actions are not modelled here) or no work.

    >>> round(order_floor_s(Schedule.INTERLEAVED_1F1B, 2, 8, 2, [1.0] * 16, [2.0] * 16) / (2 * 48 / 2), 3)
    1.087
    """
    shape = _programme_shape(schedule, forward_s, backward_s)
    if shape is None:
        return 0.0
    total, share, low, high = shape
    optimum = _order_programme(schedule, num_ranks, num_stages, num_microbatches, share, low, high)
    return optimum * total * (1.0 - LP_SHAVE)


def order_ceiling_s(
    schedule: Schedule,
    num_ranks: int,
    num_stages: int,
    num_microbatches: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
) -> float:
    """The programme of :func:`order_floor_s` at one feasible point, every stage an equal share of the forwards and
    of the backwards: its least longest path there, so never below the programme's optimum (HiGHS's tolerance
    aside, which :data:`LP_SHAVE` covers), found by one pass over the action graph rather than a linear programme.
    Where this is no higher than what a floor must exceed to prune, the programme need not be solved. 0 where
    :func:`order_floor_s` is 0.

    >>> ceiling = order_ceiling_s(Schedule.INTERLEAVED_1F1B, 2, 8, 2, [1.0] * 16, [2.0] * 16)
    >>> ceiling >= order_floor_s(Schedule.INTERLEAVED_1F1B, 2, 8, 2, [1.0] * 16, [2.0] * 16)
    True
    """
    shape = _programme_shape(schedule, forward_s, backward_s)
    if shape is None:
        return 0.0
    total, share, _, _ = shape
    return _order_at_equal_stages(schedule, num_ranks, num_stages, num_microbatches, share) * total


def _programme_shape(
    schedule: Schedule, forward_s: Sequence[float], backward_s: Sequence[float]
) -> tuple[float, float, float, float] | None:
    """The programme's data, scaled to work 1: (total work, forwards' share, least and greatest ``b_s / f_s``);
    None where it gives no floor (a split backward, no work)."""
    if schedule.splits_backward:
        return None
    total_f, total_b = math.fsum(forward_s), math.fsum(backward_s)
    total = total_f + total_b
    if not total > 0 or not math.isfinite(total):
        return None
    # A stage's ratio b_s / f_s lies between its units' least and greatest (units without a forward allow any).
    ratios = [b / f for f, b in zip(forward_s, backward_s, strict=True) if f > 0]
    low = min(ratios, default=0.0)
    high = math.inf if len(ratios) < len(forward_s) else max(ratios, default=math.inf)
    return total, total_f / total, low, high


@lru_cache(maxsize=512)
def _order_programme(
    schedule: Schedule, ranks: int, stages: int, m: int, forward_share: float, low: float, high: float
) -> float:
    """The programme of fact 4 for work 1 (forwards ``forward_share`` of it): its optimum, or 0 when HiGHS
    finds none (no floor). Cached: a cluster search meets the same (schedule, P, S, M, shares) per placement."""
    rows, columns = _programme_rows(schedule, ranks, stages, m, low, high)
    # The equal-stage point is feasible (the totals' ratio lies within the units'), and the primal simplex started
    # there takes a fraction of the iterations the dual takes from nothing.
    durations = _equal_stages(stages, forward_share)
    starts = _earliest(_order_edges(schedule, ranks, stages, m), durations, ())
    return _solve_programme(rows, stages, columns, forward_share, [*durations, *starts[2 * stages :]])


def _programme_rows(
    schedule: Schedule, ranks: int, stages: int, m: int, low: float, high: float
) -> tuple[list[dict[int, float]], int]:
    """The programme's rows: the orders' (:func:`_order_rows`) and each stage's backward within ``low`` and
    ``high`` times its forward."""
    rows, columns = _sequence_rows(schedule, ranks, stages, m)
    ratios = []
    for s in range(stages):
        ratios.append({s: low, stages + s: -1.0})  # low * f_s <= b_s
        if math.isfinite(high):
            ratios.append({stages + s: 1.0, s: -high})  # b_s <= high * f_s
    return rows + ratios, columns


@lru_cache(maxsize=64)
def _sequence_rows(schedule: Schedule, ranks: int, stages: int, m: int) -> tuple[list[dict[int, float]], int]:
    """:func:`_order_rows` of the schedule's kept orders, shared by the programme and the paths (read only)."""
    return _order_rows(kept_rank_orders(schedule, stages, m, ranks), stages, m)


@lru_cache(maxsize=512)
def _order_at_equal_stages(schedule: Schedule, ranks: int, stages: int, m: int, forward_share: float) -> float:
    """The programme's least step for work 1 with every ``f_s = forward_share / S`` and ``b_s`` the rest over
    ``S`` (a point within the units' ratios, as their totals are): the longest path through its order rows."""
    return _longest_path(_order_edges(schedule, ranks, stages, m), _equal_stages(stages, forward_share), ())


def _equal_stages(stages: int, forward_share: float) -> list[float]:
    """Every stage's forward and backward at an equal share of work 1 (the programme's stage columns)."""
    return [forward_share / stages] * stages + [(1.0 - forward_share) / stages] * stages


def partition_order_floor_s(
    schedule: Schedule,
    num_ranks: int,
    num_microbatches: int,
    stage_forward_s: Sequence[float],
    stage_backward_s: Sequence[float],
    *,
    compute_scale: float = 1.0,
    action_overhead_s: float = 0.0,
    step_tail_s: Sequence[float] = (),
) -> float:
    """Fact 4 at one partition: the longest path through the programme's rows with this partition's own stage
    times (its forward ``f_s`` and full backward ``b_s``, recomputation in it), each action scaled and lengthened
    as the simulator does, and each rank's step tail after its last action (fact 3). The programme's value at one
    of its feasible points, so never below its optimum (:func:`order_floor_s`), and no simulation of the partition
    is shorter. 0 for a split backward.

    >>> partition_order_floor_s(Schedule.ONE_F_ONE_B, 2, 2, [1.0, 1.0], [2.0, 2.0])
    9.0
    """
    if schedule.splits_backward or not stage_forward_s:
        return 0.0
    scale = compute_scale if num_ranks > 1 else 1.0  # as the simulator scales every action of a pipeline
    durations = [f * scale + action_overhead_s for f in stage_forward_s]
    durations += [b * scale + action_overhead_s for b in stage_backward_s]
    edges = _order_edges(schedule, num_ranks, len(stage_forward_s), num_microbatches)
    return _longest_path(edges, durations, step_tail_s)


_Edges = tuple[tuple[tuple[int, int, int, tuple[tuple[int, float], ...]], ...], int]


@lru_cache(maxsize=64)
def _order_edges(schedule: Schedule, ranks: int, stages: int, m: int) -> _Edges:
    """The orders' rows (:func:`_order_rows`) as edges of the kept actions' graph, in topological order from time
    0: each ``(source, target, rank, [(stage column, count), ...])``, source -1 being time 0, the last column the
    step, ``rank`` the rank whose last action an edge into the step follows (else -1); and the column count."""
    rows, columns = _sequence_rows(schedule, ranks, stages, m)
    start, step_col = 2 * stages, columns - 1
    edges: dict[int, list[tuple[int, int, tuple[tuple[int, float], ...]]]] = {}
    waiting = [0] * columns  # per start column, the edges into it not yet taken
    into_step = 0  # _order_rows writes one row into the step per rank, in rank order
    for row in rows:
        target = next(c for c, x in row.items() if c >= start and x < 0)
        source = next((c for c, x in row.items() if c >= start and x > 0), -1)
        rank = into_step if target == step_col else -1
        into_step += target == step_col
        edges.setdefault(source, []).append((target, rank, tuple((c, x) for c, x in row.items() if c < start)))
        waiting[target] += 1
    # Kahn's order from time 0: every edge runs forward in time, the rank orders and data edges a DAG.
    ordered: list[tuple[int, int, int, tuple[tuple[int, float], ...]]] = []
    ready = [-1]
    while ready:
        node = ready.pop()
        for target, rank, counts in edges.get(node, ()):
            ordered.append((node, target, rank, counts))
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    return tuple(ordered), columns


def _longest_path(edges: _Edges, durations: Sequence[float], step_tail_s: Sequence[float]) -> float:
    """The latest start of the step column through ``edges`` (:func:`_order_edges`) with each stage column's
    action lasting ``durations[column]``, an edge into the step from rank ``r``'s last action lengthened by
    ``step_tail_s[r]``."""
    return _earliest(edges, durations, step_tail_s)[-1]


def _earliest(edges: _Edges, durations: Sequence[float], step_tail_s: Sequence[float]) -> list[float]:
    """Per column, the earliest start through ``edges`` (:func:`_longest_path`; 0 for the stage columns)."""
    ordered, columns = edges
    earliest = [0.0] * columns
    for source, target, rank, counts in ordered:
        length = math.fsum(x * durations[c] for c, x in counts)
        if 0 <= rank < len(step_tail_s):
            length += step_tail_s[rank]
        at = earliest[source] if source >= 0 else 0.0
        earliest[target] = max(earliest[target], at + length)
    return earliest


def _order_rows(orders: Sequence[Sequence[Step]], stages: int, m: int) -> tuple[list[dict[int, float]], int]:
    """The programme's ``<= 0`` rows (column -> coefficient) and its column count: the ranks' orders and the
    dependencies between the first and last micro-batches' actions."""
    kept_mbs = {0, m - 1}
    kept: dict[tuple[int, int, str], int] = {}
    for order in orders:
        for step in order:
            if step.microbatch in kept_mbs:
                kept[(step.stage, step.microbatch, step.kind)] = len(kept)
    # Columns: f_s, b_s for every stage, a start per kept action, the step T.
    start = 2 * stages
    step_col = start + len(kept)
    rows: list[dict[int, float]] = []

    def duration(key: tuple[int, int, str], row: dict[int, float]) -> None:
        column = key[0] if key[2] == "F" else stages + key[0]
        row[column] = row.get(column, 0.0) + 1.0

    for order in orders:
        # start(next kept) >= end(previous kept) + the rank's actions between them (from 0 before the first).
        row: dict[int, float] = {}
        previous: tuple[int, int, str] | None = None
        for step in order:
            if step.microbatch not in kept_mbs:  # its duration only (up to 65,536 steps: inlined)
                column = step.stage if step.kind == "F" else stages + step.stage
                row[column] = row.get(column, 0.0) + 1.0
                continue
            key = (step.stage, step.microbatch, step.kind)
            if previous is not None:
                row[start + kept[previous]] = 1.0
                duration(previous, row)
            row[start + kept[key]] = row.get(start + kept[key], 0.0) - 1.0
            rows.append(row)
            row, previous = {}, key
        if previous is not None:
            row[start + kept[previous]] = row.get(start + kept[previous], 0.0) + 1.0
            duration(previous, row)
        row[step_col] = -1.0  # T >= the rank's last end
        rows.append(row)
    for (s, mb, kind), column in kept.items():
        # F needs the stage before's F; B the stage after's B (the last stage's own F).
        if kind == "F":
            needed = (s - 1, mb, "F") if s > 0 else None
        else:
            needed = (s + 1, mb, "B") if s < stages - 1 else (s, mb, "F")
        if needed is None or needed not in kept:
            continue
        row = {start + kept[needed]: 1.0, start + column: -1.0}
        duration(needed, row)
        rows.append(row)
    return rows, step_col + 1


def _solve_programme(
    rows: list[dict[int, float]], stages: int, columns: int, forward_share: float, start: Sequence[float]
) -> float:
    """Minimise the step (the last column) under ``rows`` with the stages' forwards summing to ``forward_share``
    and their backwards to the rest, by the primal simplex from the feasible point ``start`` (a value a column):
    its optimum, or 0 when HiGHS finds none."""
    import highspy  # here, not at the top: commands that plan nothing start without HiGHS and numpy
    import numpy as np

    from solvers.quiet import quiet_stdout

    step_col = columns - 1
    count = len(rows)
    sums_row = [dict.fromkeys(range(stages), 1.0), dict.fromkeys(range(stages, 2 * stages), 1.0)]
    lp = highspy.HighsLp()
    lp.num_col_ = step_col + 1
    lp.num_row_ = count + 2
    lp.col_cost_ = np.eye(1, step_col + 1, step_col).ravel()
    lp.col_lower_ = np.zeros(step_col + 1)
    lp.col_upper_ = np.full(step_col + 1, highspy.kHighsInf)
    lp.row_lower_ = np.array([-highspy.kHighsInf] * count + [forward_share, 1.0 - forward_share])
    lp.row_upper_ = np.array([0.0] * count + [forward_share, 1.0 - forward_share])
    starts, indices, values = [0], [], []
    for row in rows + sums_row:
        indices.extend(row)
        values.extend(row.values())
        starts.append(len(indices))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(indices, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(values, dtype=np.float64)
    with quiet_stdout():  # the banner HiGHS prints on a process's first instance: stdout may carry JSON
        solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    # One thread, as the ILP solver asks (solvers/ilp.py): HiGHS keeps one thread pool a process, and a run
    # asking another size than the pool's first fails.
    solver.setOptionValue("threads", 1)
    solver.setOptionValue("presolve", "off")  # presolve would set the starting point aside
    solver.setOptionValue("simplex_strategy", 4)  # primal
    solver.passModel(lp)
    solution = highspy.HighsSolution()
    solution.col_value = list(start)
    solution.value_valid = True
    solver.setSolution(solution)
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return 0.0
    return max(0.0, float(solver.getInfo().objective_function_value))
