"""Pipeline schedules: the ordered compute actions each rank runs, as ``torch.distributed.pipelining`` runs them.

The orders are rebuilt here in pure Python (no torch import) from torch 2.13's
``torch/distributed/pipelining/schedules.py``, so the planner and its solvers work without torch and
stay stable across torch versions; ``tests/planner/schedule/test_orders_torch.py`` asserts they equal torch's own
``pipeline_order`` for many ``(ranks, virtual stages, micro-batches)``.

Which torch class runs each schedule:

=====================  ================================  ==========================================
Schedule               torch class                        placement / micro-batch requirement
=====================  ================================  ==========================================
``naive``              ``ScheduleGPipe`` with M = 1       one stage per rank, exactly 1 micro-batch
``gpipe``              ``ScheduleGPipe``                  one stage per rank, M >= 1
``1f1b``               ``Schedule1F1B``                   one stage per rank, M >= number of stages
``interleaved-1f1b``   ``ScheduleInterleaved1F1B``        looped (rank r: stages r, r+R, ...),
                                                          M % max(1, M // R) == 0
``zero-bubble``        ``ScheduleInterleavedZeroBubble``  looped like interleaved (any v >= 1),
                                                          M % max(1, M // R) == 0
``looped-bfs``         ``ScheduleLoopedBFS``              looped (any v >= 1), M >= 1
``zbv``                ``ScheduleZBVZeroBubble``          V (rank r: stages r and 2R-1-r), v = 2,
                                                          M >= 1
``dualpipev``          ``ScheduleDualPipeV``              V, v = 2, M >= 2R (the number of stages)
=====================  ================================  ==========================================

``zero-bubble`` is torch's ZB1P (``ScheduleInterleavedZeroBubble``, Qi et al., ICLR 2024): with one stage
per rank it is ZB-H1. ``zbv`` is the paper's ZB-V (section 6); ``dualpipev`` is DeepSeek-V3's DualPipe
folded into a V (torch's port of deepseek-ai/DualPipe). The three split the backward into ``I`` (input
gradient) and ``W`` (weight gradient) and run ``W`` later to fill the bubble; ``dualpipev`` also runs
full backwards ``B`` and pairs a forward with a backward (torch's ``OVERLAP_F_B``, executed as the
forward then the backward: :func:`rank_orders` lists the two, the forward marked ``overlapped``: its send waits
for the backward).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache

from planner.errors import ScheduleError, UsageError

__all__ = [
    "Schedule",
    "Step",
    "TORCH_SCHEDULE_CLASS",
    "rank_orders",
    "kept_rank_orders",
    "stage_to_rank",
    "min_microbatches",
    "check_microbatches",
    "virtual_stages",
    "orders_from_torch",
    "format_orders",
    "ranks_of_stages",
    "default_ranks",
]


class Schedule(str, Enum):
    """A pipeline schedule; the value is the name users type."""

    NAIVE = "naive"
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE = "zero-bubble"
    LOOPED_BFS = "looped-bfs"
    ZBV = "zbv"
    DUALPIPEV = "dualpipev"

    @classmethod
    def parse(cls, text: str | Schedule) -> Schedule:
        """Parse a schedule name (case-insensitive, ``_`` accepted for ``-``).

        Raises:
            ScheduleError: unknown name; the message lists the valid names.
        """
        if isinstance(text, Schedule):
            return text
        key = str(text).strip().lower().replace("_", "-")
        for member in cls:
            if member.value == key:
                return member
        valid = ", ".join(m.value for m in cls)
        raise ScheduleError(f"unknown schedule {text!r} (valid: {valid})")

    @property
    def multi_stage(self) -> bool:
        """True when a rank may hold several stages (torch's multi-stage classes, which take a list)."""
        return self in (
            Schedule.INTERLEAVED_1F1B,
            Schedule.ZERO_BUBBLE,
            Schedule.LOOPED_BFS,
            Schedule.ZBV,
            Schedule.DUALPIPEV,
        )

    @property
    def v_shape(self) -> bool:
        """True for the V placement: exactly two stages per rank, rank r holds stages r and 2R-1-r."""
        return self in (Schedule.ZBV, Schedule.DUALPIPEV)

    @property
    def splits_backward(self) -> bool:
        """True when the schedule runs the weight gradient W apart from the input gradient I."""
        return self in (Schedule.ZERO_BUBBLE, Schedule.ZBV, Schedule.DUALPIPEV)

    @property
    def virtual_stage_choices(self) -> tuple[int, ...]:
        """Stages per rank the planner tries on more than one rank: 2 or 4 for the looped schedules (with
        v = 1 looped BFS is GPipe's order), also 1 for zero-bubble (ZB-H1), exactly 2 for the V ones."""
        if self.v_shape:
            return (2,)
        if self is Schedule.ZERO_BUBBLE:
            return (1, 2, 4)
        return (2, 4) if self.multi_stage else (1,)

    @property
    def default_virtual_stages(self) -> int:
        """Stages per rank when none is given: the smallest the planner tries."""
        return self.virtual_stage_choices[0]

    def __str__(self) -> str:
        return self.value


TORCH_SCHEDULE_CLASS: Mapping[Schedule, str] = {
    Schedule.NAIVE: "ScheduleGPipe",
    Schedule.GPIPE: "ScheduleGPipe",
    Schedule.ONE_F_ONE_B: "Schedule1F1B",
    Schedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
    Schedule.ZERO_BUBBLE: "ScheduleInterleavedZeroBubble",
    Schedule.LOOPED_BFS: "ScheduleLoopedBFS",
    Schedule.ZBV: "ScheduleZBVZeroBubble",
    Schedule.DUALPIPEV: "ScheduleDualPipeV",
}
"""Name of the class in ``torch.distributed.pipelining`` that runs each schedule."""

_KINDS = ("F", "B", "I", "W")
_STEP_RE = re.compile(r"^(\d+)(F|B|I|W)(\d+)$")


@dataclass(frozen=True)
class Step:
    """One compute action: ``kind`` is F (forward), B (full backward), I (input grad) or W (weight grad)."""

    stage: int
    microbatch: int
    kind: str
    overlapped: bool = field(default=False, compare=False)
    """A forward paired with the backward after it (torch's ``OVERLAP_F_B``, ``dualpipev``): torch's lowering
    (``_add_send_recv``) posts the pair's sends after both, so this forward's output leaves its rank only
    when the backward has run. Not part of the step's identity (equality, hashing)."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Step kind must be one of {_KINDS}, got {self.kind!r}")

    def __str__(self) -> str:
        # torch's compact notation: stage, kind, micro-batch (``2F0``).
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Step:
        """Inverse of ``str``: ``Step.parse("2F0") == Step(2, 0, "F")``."""
        match = _STEP_RE.match(text.strip())
        if match is None:
            raise ValueError(f"not a compute action in torch notation (e.g. 2F0): {text!r}")
        return cls(stage=int(match[1]), microbatch=int(match[3]), kind=match[2])


_step = lru_cache(maxsize=1 << 16)(Step)
"""``Step(...)``, one shared object per distinct action: a plan search builds millions of steps over a few
thousand distinct ones, and a frozen dataclass costs 0.6 us to make where the cache's lookup costs 0.1 us."""


def virtual_stages(sched: Schedule, num_stages: int, num_ranks: int) -> int:
    """Stages per rank ``v``; raises ScheduleError when the placement is impossible."""
    if num_ranks < 1 or num_stages < 1:
        raise UsageError(f"need at least 1 rank and 1 stage (ranks: {num_ranks}, stages: {num_stages})")
    if not sched.multi_stage:
        if num_stages != num_ranks:
            raise ScheduleError(
                f"schedule {sched.value} runs one stage per rank (stages: {num_stages}, ranks: {num_ranks}); "
                f"use interleaved-1f1b, zero-bubble, looped-bfs, zbv or dualpipev for several stages per rank"
            )
        return 1
    if sched.v_shape and num_stages != 2 * num_ranks:
        raise ScheduleError(
            f"schedule {sched.value} runs exactly 2 stages per rank in a V (stages: {num_stages}, ranks: "
            f"{num_ranks}); use {2 * num_ranks} stages"
        )
    if num_stages % num_ranks != 0:
        raise ScheduleError(
            f"schedule {sched.value} needs the number of stages to be a multiple of the number of ranks "
            f"(stages: {num_stages}, ranks: {num_ranks})"
        )
    return num_stages // num_ranks


def default_ranks(schedule: Schedule, num_stages: int) -> int:
    """The rank count when none is given: one stage per rank, or two for interleaved-1f1b and the V schedules."""
    if schedule is Schedule.INTERLEAVED_1F1B or schedule.v_shape:
        if num_stages % 2 != 0:
            raise UsageError(
                f"{schedule.value} with {num_stages} stages: give num_ranks (the default, stages / 2, "
                f"needs an even number of stages)"
            )
        return num_stages // 2
    return num_stages


def stage_to_rank(schedule: Schedule, num_stages: int, num_ranks: int) -> tuple[int, ...]:
    """The rank holding each stage: stage ``s`` on rank ``s % num_ranks`` (torch's looped placement), or
    for the V schedules rank ``r`` holding stages ``r`` and ``2R-1-r`` (torch's ``style="v"``)."""
    virtual_stages(schedule, num_stages, num_ranks)
    if schedule.v_shape:
        return tuple(s if s < num_ranks else num_stages - 1 - s for s in range(num_stages))
    return tuple(s % num_ranks for s in range(num_stages))


def min_microbatches(sched: Schedule, num_ranks: int, virtual_stages: int = 1) -> int:
    """The fewest micro-batches torch's class for ``schedule`` accepts.

    ``1f1b``: torch's ``Schedule1F1B`` refuses fewer micro-batches than stages, and ``dualpipev`` fewer
    than its ``2 * num_ranks`` stages. Interleaved-1f1b and zero-bubble accept any M >= 1 for which
    ``M % max(1, M // num_ranks) == 0`` (see :func:`check_microbatches`); looped-bfs and zbv any M >= 1.
    """
    if sched in (Schedule.ONE_F_ONE_B, Schedule.DUALPIPEV):
        return num_ranks * virtual_stages
    return 1


def _rounds(num_microbatches: int, num_ranks: int) -> int:
    return max(1, num_microbatches // num_ranks)


def check_microbatches(sched: Schedule, num_ranks: int, virtual_stages: int, num_microbatches: int) -> None:
    """Raise ScheduleError, saying what is required, when torch would refuse ``num_microbatches``."""
    m = num_microbatches
    if m < 1:
        raise ScheduleError(f"need at least 1 micro-batch (got {m})")
    if sched is Schedule.NAIVE and m != 1:
        raise ScheduleError(f"schedule naive runs exactly 1 micro-batch (got {m}); use gpipe or 1f1b for more")
    low = min_microbatches(sched, num_ranks, virtual_stages)
    if m < low:
        raise ScheduleError(
            f"schedule {sched.value} needs at least as many micro-batches as stages (micro-batches: {m}, stages: {low})"
        )
    if sched in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE):
        rounds = _rounds(m, num_ranks)
        if m % rounds != 0:
            ok = [k for k in range(max(1, m - num_ranks), m + num_ranks + 1) if k % _rounds(k, num_ranks) == 0]
            raise ScheduleError(
                f"schedule {sched.value} needs micro-batches divisible by max(1, M // ranks) = {rounds} "
                f"(micro-batches: {m}, ranks: {num_ranks}); nearby valid counts: {ok}"
            )


@lru_cache(maxsize=32)
def kept_rank_orders(
    schedule: Schedule, num_stages: int, num_microbatches: int, num_ranks: int
) -> tuple[tuple[Step, ...], ...]:
    """:func:`rank_orders`, kept and read-only: a plan search reads one schedule's orders for a stage's memory
    moments, its order floor and every simulation of its partitions (up to 65,536 steps each)."""
    return tuple(tuple(order) for order in rank_orders(schedule, num_stages, num_microbatches, num_ranks))


def rank_orders(
    schedule: Schedule | str, num_stages: int, num_microbatches: int, num_ranks: int | None = None
) -> list[list[Step]]:
    """The ordered compute actions of each rank, as torch 2.13 executes them (idle slots dropped).

    Args:
        schedule: a :class:`Schedule`, or its name (parsed here: this is an entry point of the API).
        num_stages: total stages ``S`` (``R * v`` for the looped schedules).
        num_microbatches: ``M``.
        num_ranks: ``R``; defaults to ``num_stages``.

    Returns:
        ``orders[r]`` is rank ``r``'s list of :class:`Step` in execution order.

    Raises:
        ScheduleError: placement impossible or ``M`` not accepted by the schedule.

    Example:
        >>> [str(s) for s in rank_orders("1f1b", 2, 3)[0]]
        ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    sched = Schedule.parse(schedule)
    ranks = num_stages if num_ranks is None else num_ranks
    v = virtual_stages(sched, num_stages, ranks)
    check_microbatches(sched, ranks, v, num_microbatches)
    m = num_microbatches
    if sched in (Schedule.NAIVE, Schedule.GPIPE):
        return [[_step(r, i, "F") for i in range(m)] + [_step(r, i, "B") for i in range(m)] for r in range(ranks)]
    if sched is Schedule.ONE_F_ONE_B:
        return [_one_f_one_b(r, ranks, m) for r in range(ranks)]
    if sched is Schedule.LOOPED_BFS:
        return [_looped_bfs(r, ranks, v, m) for r in range(ranks)]
    if sched is Schedule.ZBV:
        return [_zbv(r, ranks, m) for r in range(ranks)]
    if sched is Schedule.DUALPIPEV:
        return [_dualpipev(r, ranks, m) for r in range(ranks)]
    zero_bubble = sched is Schedule.ZERO_BUBBLE
    return [_looped_1f1b(r, ranks, v, m, zero_bubble) for r in range(ranks)]


def _one_f_one_b(stage: int, num_stages: int, m: int) -> list[Step]:
    # Schedule1F1B._step_microbatches: min(M, P - s) warm-up forwards, then B/F pairs, then the rest of B.
    warmup = min(m, num_stages - stage)
    order = [_step(stage, i, "F") for i in range(warmup)]
    fwd, bwd = warmup, 0
    while True:
        order.append(_step(stage, bwd, "B"))
        bwd += 1
        if fwd == m:
            break
        order.append(_step(stage, fwd, "F"))
        fwd += 1
    order.extend(_step(stage, i, "B") for i in range(bwd, m))
    return order


def _looped_1f1b(rank: int, ranks: int, v: int, m: int, zero_bubble: bool) -> list[Step]:
    # ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble._calculate_single_rank_operations
    # with _get_warmup_ops and _get_1f1b_rank_ops, minus the None padding (idle is simulated, not listed).
    per_round = m // _rounds(m, ranks)
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (ranks - 1 - rank), m * v)
    fwd_bwd = m * v - warmup
    cooldown = warmup

    def forward_stage(op: int) -> int:
        return ((op // per_round) % v) * ranks + rank

    def backward_stage(op: int) -> int:
        return (v - 1 - ((op - warmup) // per_round) % v) * ranks + rank

    return _rank_ops_1f1b(warmup, fwd_bwd, cooldown, forward_stage, backward_stage, rank if zero_bubble else None)


def _rank_ops_1f1b(
    warmup: int,
    fwd_bwd: int,
    cooldown: int,
    forward_stage: Callable[[int], int],
    backward_stage: Callable[[int], int],
    num_1f1b_microbatches: int | None,
) -> list[Step]:
    # num_1f1b_microbatches is None for plain interleaved (full backward B); an int turns on the
    # zero-bubble split: I in place of B, and W deferred by that many backward ops.
    zero_bubble = num_1f1b_microbatches is not None
    next_mb: dict[tuple[str, int], int] = defaultdict(int)
    order: list[Step] = []
    backward_ops: list[int] = []
    weight_count = 0

    def emit(kind: str, stage: int) -> None:
        key = (kind, stage)
        order.append(_step(stage, next_mb[key], kind))
        next_mb[key] += 1

    def maybe_weight(op: int) -> None:
        nonlocal weight_count
        if zero_bubble and op - warmup >= num_1f1b_microbatches:  # type: ignore[operator]
            emit("W", backward_stage(backward_ops[weight_count]))
            weight_count += 1

    back_kind = "I" if zero_bubble else "B"
    for op in range(warmup + fwd_bwd + cooldown):
        if op < warmup:
            emit("F", forward_stage(op))
            continue
        if op < warmup + fwd_bwd:
            emit("F", forward_stage(op))
        emit(back_kind, backward_stage(op))
        backward_ops.append(op)
        maybe_weight(op)
    while zero_bubble and weight_count < len(backward_ops):
        emit("W", backward_stage(backward_ops[weight_count]))
        weight_count += 1
    return order


def _looped_bfs(rank: int, ranks: int, v: int, m: int) -> list[Step]:
    # ScheduleLoopedBFS._calculate_single_rank_operations: every forward of each local stage in turn,
    # then every backward, local stages and micro-batches both reversed.
    stages = range(rank, ranks * v, ranks)
    order = [_step(s, i, "F") for s in stages for i in range(m)]
    order.extend(_step(s, i, "B") for s in reversed(stages) for i in reversed(range(m)))
    return order


def _zbv(rank: int, ranks: int, m: int) -> list[Step]:
    # ScheduleZBVZeroBubble._calculate_single_rank_operations: built for max(2R - 1, M) micro-batches,
    # then the actions of micro-batches >= M are dropped (torch turns them into idle slots).
    n_micro = max(2 * ranks - 1, m)
    chunk0, chunk1 = rank, 2 * ranks - 1 - rank
    count = {("F", 0): 0, ("F", 1): 0, ("I", 0): 0, ("I", 1): 0, ("W", 0): 0, ("W", 1): 0}
    order: list[Step] = []

    def emit(kind: str, chunk: int) -> None:
        order.append(_step(chunk1 if chunk else chunk0, count[(kind, chunk)], kind))
        count[(kind, chunk)] += 1

    for _ in range(2 * (ranks - rank) - 1):
        emit("F", 0)
    for _ in range(rank):
        emit("F", 1)
        emit("F", 0)
    for _ in range(ranks - rank):
        emit("F", 1)
        emit("I", 1)
        emit("W", 1)
    while count[("F", 1)] < count[("F", 0)] or count[("F", 0)] < n_micro:
        if count[("F", 0)] < n_micro:
            emit("F", 0)
        emit("I", 0)
        emit("W", 0)
        emit("F", 1)
        emit("I", 1)
        emit("W", 1)
    for _ in range(rank):
        emit("I", 0)
        emit("I", 1)
    for _ in range(ranks - rank):
        emit("I", 0)
        emit("W", 0)
    while count[("W", 1)] < count[("I", 1)]:
        emit("W", 1)
    while count[("W", 0)] < count[("I", 0)]:
        emit("W", 0)
    return [step for step in order if step.microbatch < m]


def _dualpipev(rank: int, ranks: int, m: int) -> list[Step]:
    # ScheduleDualPipeV._calculate_single_rank_operations (torch's port of deepseek-ai/DualPipe's
    # DualPipeV). An OVERLAP_F_B pair is listed as its forward then its full backward, the order in
    # which _PipelineScheduleRuntime executes the two sub-actions. A full backward B advances both the
    # I and the W counters; an I queues its W, which a later "weight slot" pops (oldest first).
    stage0, stage1 = rank, 2 * ranks - 1 - rank
    counters: dict[tuple[int, str], int] = defaultdict(int)
    weight_queue: list[tuple[int, int]] = []
    order: list[Step] = []

    def add(stage: int, kind: str, *, overlapped: bool = False) -> None:
        key = (stage, "I" if kind == "B" else kind)
        mb = counters[key]
        order.append(_step(stage, mb, kind, overlapped))
        if kind == "B":
            counters[(stage, "I")] += 1
            counters[(stage, "W")] += 1
            return
        if kind == "I":
            weight_queue.append((stage, mb))
        counters[key] = mb + 1

    def weight_slot() -> None:
        if weight_queue:
            stage, mb = weight_queue.pop(0)
            order.append(_step(stage, mb, "W"))
            counters[(stage, "W")] += 1

    for _ in range((ranks - rank - 1) * 2):  # step 1: F0
        add(stage0, "F")
    for _ in range(rank + 1):  # step 2: F0 F1
        add(stage0, "F")
        add(stage1, "F")
    for _ in range(ranks - rank - 1):  # step 3: I1 W F1
        add(stage1, "I")
        weight_slot()
        add(stage1, "F")
    for i in range(m - ranks * 2 + rank + 1):  # step 4: (F0 B1) (F1 B0)
        add(stage0, "F", overlapped=not (i == 0 and rank == ranks - 1))  # torch's one pair left apart
        add(stage1, "B")
        add(stage1, "F", overlapped=True)
        add(stage0, "B")
    for _ in range(ranks - rank - 1):  # step 5: B1 (F1 B0)
        add(stage1, "B")
        add(stage1, "F", overlapped=True)
        add(stage0, "B")
    step_6 = rank + 1  # step 6: B1 B0, the second half as zero bubble (I)
    zero_bubble = False
    for i in range(step_6):
        if i == step_6 // 2 and rank % 2 == 1:
            zero_bubble = True
        add(stage1, "I" if zero_bubble else "B")
        if i == step_6 // 2 and rank % 2 == 0:
            zero_bubble = True
        add(stage0, "I" if zero_bubble else "B")
    for _ in range(ranks - rank - 1):  # step 7: W B0
        weight_slot()
        add(stage0, "I" if zero_bubble else "B")
    for _ in range(rank + 1):  # step 8: W
        weight_slot()
    return order


def orders_from_torch(pipeline_order: Mapping[int, Iterable[object]]) -> list[list[Step]]:
    """Convert a torch schedule's ``pipeline_order`` (rank -> actions, ``None`` for idle) to Step lists.

    Only compute actions (F, B, I, W) are kept; idle slots, communication and REDUCE_GRAD are dropped; an
    action with ``sub_actions`` (torch's ``OVERLAP_F_B``) becomes its sub-actions in order, every one but the
    last ``overlapped`` (its sends are posted after the last). Works on the ``str`` of each action, so torch is
    not imported here.
    """
    orders: list[list[Step]] = []
    for rank in sorted(pipeline_order):
        steps = []
        for action in pipeline_order[rank]:
            if action is None:
                continue
            parts = getattr(action, "sub_actions", None) or (action,)
            for index, part in enumerate(parts):
                match = _STEP_RE.match(str(part).strip())
                if match is not None:
                    steps.append(Step(int(match[1]), int(match[3]), match[2], index < len(parts) - 1))
        orders.append(steps)
    return orders


def ranks_of_stages(orders: Sequence[Sequence[Step]], num_stages: int) -> list[int]:
    """The rank that runs each stage, read from ``orders`` (a stage no order names: rank 0)."""
    ranks = [0] * num_stages
    for rank, order in enumerate(orders):
        for step in order:
            ranks[step.stage] = rank
    return ranks


def format_orders(orders: Sequence[Sequence[Step]]) -> str:
    """One line per rank in torch's notation, for debugging and error messages."""
    return "\n".join(f"rank {r}: " + " ".join(str(s) for s in steps) for r, steps in enumerate(orders))
