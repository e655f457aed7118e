"""The partition problem every solver answers, and the one function that scores a partition.

Units ``0..n-1`` are cut into ``P`` contiguous, non-empty stages. Stage ``s`` holds units ``i..j``
and chooses recomputation ``r_s`` (activation checkpointing). With ``M`` micro-batches:

- compute ``c_s = (F + B + r_s * F) / speed_s`` with ``F``, ``B`` the sums of unit forward and
  backward times (recomputation re-runs the forward inside backward);
- communication into stage ``s > 0``: ``k_s = cut_forward_s[i-1] + cut_backward_s[i-1]``
  (activations in, gradients back); it delays dependencies but does not occupy the compute stream;
- objective (the declared one, seconds per iteration) ::

      sum_s (c_s + k_s) + (M - 1) * max_s c_s

  the fill/drain latency of one micro-batch through every stage, plus ``M - 1`` further micro-batches
  at the bottleneck's rate. It is the textbook pipeline formula; the planner re-scores its best
  candidates with the event simulator of the chosen schedule (docs/cost-model.md);
- memory of stage ``s`` (bytes) ::

      params_s + transient_s + (a_s * in_flight_s  if not r_s else
                                in_s * in_flight_s + a_s)

  with ``params_s`` the weight+gradient+optimizer bytes of its units, ``a_s`` their saved activation
  bytes per micro-batch, ``in_s`` its input bytes (kept per micro-batch under recomputation; the
  ``+ a_s`` is the one micro-batch re-materialised during its backward) and ``transient_s`` the
  largest transient of its units. Feasible iff ``memory_s <= capacity_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import UsageError

__all__ = ["PartitionProblem", "PartitionSolution", "StageCost", "evaluate", "stage_cost", "INFEASIBLE"]

INFEASIBLE = math.inf


@dataclass(frozen=True)
class PartitionProblem:
    forward_s: tuple[float, ...]
    """Per unit: forward time of one micro-batch."""
    backward_s: tuple[float, ...]
    """Per unit: backward time of one micro-batch."""
    num_stages: int
    num_microbatches: int
    cut_forward_s: tuple[float, ...] = ()
    """Per cut k (between unit k and k+1), n-1 values: time to send the crossing activations. Empty = 0."""
    cut_backward_s: tuple[float, ...] = ()
    """Per cut k: time to send their gradients back. Empty = 0."""
    cut_bytes: tuple[int, ...] = ()
    """Per cut k: bytes of activations crossing it (a recomputing stage keeps its input per micro-batch)."""
    input_bytes: int = 0
    """Bytes of the model input per micro-batch (stage 0's input)."""
    param_state_bytes: tuple[int, ...] = ()
    """Per unit: weights + gradients + optimizer state. Empty = 0."""
    saved_bytes: tuple[int, ...] = ()
    """Per unit: activations saved for backward per micro-batch. Empty = 0."""
    transient_bytes: tuple[int, ...] = ()
    """Per unit: working memory above what is held (peak during its forward+backward). Empty = 0."""
    in_flight: tuple[int, ...] = ()
    """Per stage: micro-batches whose activations the stage holds at its peak. Empty = M on every stage."""
    capacity_bytes: tuple[float, ...] = ()
    """Per stage: memory available. Empty = unlimited."""
    recompute_choices: tuple[bool, ...] = (False,)
    """Allowed values of r_s: (False,) off, (True,) on, (False, True) chosen per stage."""
    speed: tuple[float, ...] = ()
    """ILP only. Per stage: relative speed of its device (2.0 = twice as fast). Empty = 1."""
    pinned: tuple[tuple[int, int], ...] = ()
    """ILP only. (unit, stage) pairs that must hold."""
    max_units_per_stage: int | None = None
    """ILP only. Upper bound on units in any stage."""

    def __post_init__(self) -> None:
        n, p = len(self.forward_s), self.num_stages
        if n == 0 or len(self.backward_s) != n:
            raise UsageError(f"forward_s and backward_s need the same non-zero length ({n}, {len(self.backward_s)})")
        if p < 1 or p > n:
            raise UsageError(f"cannot cut {n} units into {p} non-empty stages")
        if self.num_microbatches < 1:
            raise UsageError(f"num_microbatches must be >= 1, got {self.num_microbatches}")
        for name in ("cut_forward_s", "cut_backward_s", "cut_bytes"):
            if getattr(self, name) and len(getattr(self, name)) != n - 1:
                raise UsageError(f"{name} needs {n - 1} values (one per cut), got {len(getattr(self, name))}")
        for name in ("param_state_bytes", "saved_bytes", "transient_bytes"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise UsageError(f"{name} needs {n} values (one per unit), got {len(getattr(self, name))}")
        for name in ("in_flight", "capacity_bytes", "speed"):
            if getattr(self, name) and len(getattr(self, name)) != p:
                raise UsageError(f"{name} needs {p} values (one per stage), got {len(getattr(self, name))}")
        if not self.recompute_choices:
            raise UsageError("recompute_choices must not be empty")

    @property
    def num_units(self) -> int:
        return len(self.forward_s)

    @property
    def is_homogeneous(self) -> bool:
        """True when the DP can solve it: no speeds, pins or per-stage unit caps."""
        return (
            (not self.speed or all(v == 1.0 for v in self.speed))
            and not self.pinned
            and (self.max_units_per_stage is None)
        )


@dataclass(frozen=True)
class StageCost:
    compute_s: float
    comm_in_s: float
    memory_bytes: float
    feasible: bool


@dataclass(frozen=True)
class PartitionSolution:
    boundaries: tuple[int, ...]
    """First unit of every stage; boundaries[0] == 0, strictly increasing, length P."""
    recompute: tuple[bool, ...]
    objective_s: float
    bottleneck_s: float
    solver: str
    optimal: bool = True
    gap: float | None = 0.0
    solve_s: float = 0.0

    def stage_units(self, num_units: int) -> list[range]:
        ends = (*self.boundaries[1:], num_units)
        return [range(a, b) for a, b in zip(self.boundaries, ends, strict=True)]


def _at(values: tuple[float, ...] | tuple[int, ...], k: int) -> float:
    return values[k] if values else 0


def stage_cost(problem: PartitionProblem, stage: int, first: int, last: int, recompute: bool) -> StageCost:
    """Cost of stage ``stage`` holding units ``first..last`` (inclusive)."""
    fwd = math.fsum(problem.forward_s[first : last + 1])
    bwd = math.fsum(problem.backward_s[first : last + 1])
    speed = problem.speed[stage] if problem.speed else 1.0
    compute = (fwd + bwd + (fwd if recompute else 0.0)) / speed
    comm = 0.0 if first == 0 else _at(problem.cut_forward_s, first - 1) + _at(problem.cut_backward_s, first - 1)
    params = sum(problem.param_state_bytes[first : last + 1]) if problem.param_state_bytes else 0
    saved = sum(problem.saved_bytes[first : last + 1]) if problem.saved_bytes else 0
    transient = max(problem.transient_bytes[first : last + 1]) if problem.transient_bytes else 0
    stage_input = problem.input_bytes if first == 0 else _at(problem.cut_bytes, first - 1)
    in_flight = problem.in_flight[stage] if problem.in_flight else problem.num_microbatches
    activations = stage_input * in_flight + saved if recompute else saved * in_flight
    memory = params + transient + activations
    capacity = problem.capacity_bytes[stage] if problem.capacity_bytes else math.inf
    return StageCost(compute, comm, memory, memory <= capacity)


def evaluate(
    problem: PartitionProblem, boundaries: tuple[int, ...], recompute: tuple[bool, ...]
) -> tuple[float, float]:
    """Return ``(objective_s, bottleneck_s)`` of a partition, ``(inf, inf)`` if any stage does not fit."""
    n, p = problem.num_units, problem.num_stages
    if len(boundaries) != p or len(recompute) != p or boundaries[0] != 0:
        raise UsageError(f"a partition needs {p} boundaries starting at 0 and {p} recompute flags")
    ends = (*boundaries[1:], n)
    total, bottleneck = 0.0, 0.0
    for s, (first, end) in enumerate(zip(boundaries, ends, strict=True)):
        if end <= first:
            raise UsageError(f"stage {s} is empty (boundaries {boundaries})")
        cost = stage_cost(problem, s, first, end - 1, recompute[s])
        if not cost.feasible:
            return INFEASIBLE, INFEASIBLE
        total += cost.compute_s + cost.comm_in_s
        bottleneck = max(bottleneck, cost.compute_s)
    return total + (problem.num_microbatches - 1) * bottleneck, bottleneck
