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
- memory of stage ``s`` (bytes): the larger of the pipeline's peak, taken over the moments at which the
  stage may peak (``moments[s]``: the start of each backward action, with the micro-batches it then holds;
  planner/schedule/memory.py), and the step's tail ::

      pipeline_s = state_s - (0 if grads else grads_s) + buffers_s + T_s
                   + waiting * held_s + split * (held_s + split_s) + (remat_s if acting)
                   + sent_grads * in_grad_s + sent_outputs * out_s
      tail_s     = state_s + buffers_s + step_s

  with ``state_s`` the weight+gradient+optimizer bytes of its units (``param_state_bytes``), ``grads_s`` the
  gradients among them (absent before the step's first backward), ``buffers_s = buffer_microbatches *
  (in_s + out_grad_s)`` the receive buffers of every micro-batch (its input, and its output's gradient),
  ``T_s`` the largest working memory of its units' backward (``transient_bytes``), ``held_s`` what a
  micro-batch holds from its forward to its backward: the saved activations ``a_s`` (``saved_bytes``), or
  under recomputation its output (``out_s``; its input while the receive buffers are not modelled), with
  ``remat_s = a_s`` re-materialised while it is recomputed (less, on the last stage, the output and the loss's
  tensors, which the loss keeps outside the recomputed part; elsewhere less its last unit's outputs,
  ``unit_output_bytes``, let go before its backward peaks); ``split_s`` what
  the input-gradient action keeps for the weight-gradient action (``split_held_bytes``; a recomputing stage
  runs its whole backward in I and
  holds nothing past it); a stage whose input comes from the stage before it on the same rank
  (``local_inputs``) gets the tensors handed over in place of its receive buffers, which keep them (so the
  stage before it holds its output no more) and sends nothing across it; ``T_s`` is the acting action's
  largest working memory of a unit less what the units after it saved, freed by then (B, I or W:
  ``transient_bytes``, ``input_transient_bytes``, ``weight_transient_bytes``); past I the last stage no
  longer holds the model's output and the loss's saved tensors (``final_output_bytes``), but for the output of
  the rank's latest forward, which torch's schedule loop references until the next (``held_output`` of
  ``latest_output_bytes``); a send holds
  ``sent_grads`` input gradients and ``sent_outputs`` outputs of earlier micro-batches
  (planner/schedule/memory.py); a non-recomputing stage that passes on tensors made before it and read after it
  holds a copy of each (``relays``); the last stage holds
  the step's target (``target_bytes`` per micro-batch, with its buffers) and the loss of every micro-batch whose
  backward is done (``kept_loss_bytes``, ``done`` of them, with its activations); and ``step_s`` the
  optimizer step's temporaries (``step_bytes``, their largest unit or their sum). With the defaults (one moment
  of ``in_flight[s]`` micro-batches, no receive buffers, nothing split, sent or stepped) it is the textbook

      params_s + transient_s + (a_s * in_flight_s  if not r_s else  in_s * in_flight_s + a_s).

  Feasible iff ``memory_s <= capacity_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from planner.errors import PlanInfeasibleError, UsageError

__all__ = [
    "PartitionProblem",
    "PartitionSolution",
    "Moment",
    "check_pins",
    "StageMemory",
    "StageCost",
    "evaluate",
    "stage_cost",
    "stage_compute_s",
    "stage_memory_peak",
    "stage_moments",
    "local_cuts",
    "transient_arrays",
    "acting_kind",
    "relayed_bytes",
    "INFEASIBLE",
]

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
    """(unit, stage) pairs that must hold."""
    max_units_per_stage: int | None = None
    """ILP only. Upper bound on units in any stage."""
    moments: tuple[tuple[Moment, ...], ...] = ()
    """Per stage: the moments at which it may peak (:class:`Moment`). Empty = one moment per stage, ``in_flight[s]``
    micro-batches waiting, gradients present, the acting one re-materialised under recomputation."""
    grad_bytes: tuple[int, ...] = ()
    """Per unit: the part of ``param_state_bytes`` that gradients are, absent before a step's first backward."""
    split_held_bytes: tuple[int, ...] = ()
    """Per unit: what the input-gradient action keeps for the weight-gradient action, per micro-batch. Empty = 0."""
    buffer_microbatches: int = 0
    """Receive buffers kept per stage: this many micro-batches of its input and of its output's gradient (torch
    2.13 keeps one per micro-batch). 0: not modelled, and a recomputing stage holds its input per micro-batch."""
    cut_grad_bytes: tuple[int, ...] = ()
    """Per cut k: bytes of the gradients sent back across it (what the stage before it receives)."""
    output_held_bytes: int = 0
    """What the last stage holds per micro-batch under recomputation: its output and the loss's saved tensors."""
    step_bytes: tuple[int, ...] = ()
    """Per unit: the optimizer step's temporaries (and a tied weight's exchange buffer). Empty = 0."""
    step_bytes_add: bool = False
    """Whether a stage's step temporaries are its units' sum (a foreach optimizer) rather than their largest."""
    input_transient_bytes: tuple[int, ...] = ()
    """Per unit: the working memory of its I (input-gradient action), for moments acting with I. Empty:
    ``transient_bytes``."""
    weight_transient_bytes: tuple[int, ...] = ()
    """Per unit: the working memory of its W (weight-gradient action). Empty: ``transient_bytes``."""
    final_output_bytes: int = 0
    """What the last stage lets go at its input-gradient action, which a micro-batch past I holds no more: the
    model's output and the loss's saved tensors (torch detaches the loss there, freeing its graph)."""
    relays: tuple[tuple[int, int, int], ...] = ()
    """``(producer, last consumer, bytes)`` of tensors that need a gradient and skip units (a UNet's skips): a
    stage that neither makes nor last reads one passes it on, a copy per micro-batch held like its activations
    (planner/runtime/stages.py ``StageModule``: a relayed input is a view, and the split backward detaches outputs
    in place, which a view refuses)."""
    local_inputs: tuple[bool, ...] = ()
    """Per stage: its input comes from the stage before it on the same rank (the turn of a V), handed over in
    memory: neither keeps receive buffers for that cut. Empty = none."""
    target_bytes: int = 0
    """The loss's target per micro-batch: the last stage holds the step's, ``buffer_microbatches`` of them, as the
    first stage holds the step's batch."""
    kept_loss_bytes: int = 0
    """What the loss's output keeps per micro-batch once its backward is done: torch's schedules keep every
    micro-batch's loss until the step ends (the last stage's, ``Moment.done`` of them)."""
    latest_output_bytes: int = 0
    """The model's output of one micro-batch, which torch's schedule loop references from the rank's latest forward
    until its next: the last stage holds it past I where ``Moment.held_output`` says so."""
    unit_output_bytes: tuple[int, ...] = ()
    """Per unit: bytes of the tensors it makes that later units read. A recomputing stage's re-run forward keeps
    only what backward saves; its last unit's outputs, read after the stage, are let go by the time its backward
    peaks (a ReLU's result, saved by it, is freed once its backward ran), so they are not re-materialised on top
    of the output the stage holds. Empty = 0."""
    split_backward: bool = False
    """Whether a non-recomputing stage computes its input gradients with ``torch.autograd.grad`` (torch's
    ``stage_backward_input``): then a relayed tensor's gradient passes through the relaying stage as the very
    tensor it was received in (a copy's backward returns its gradient unchanged), so what the stage sends back
    for it is its receive buffer, and across a V's turn the stage before it keeps that buffer as its own."""
    recompute_unit_wise: bool = False
    """Whether a recomputing stage checkpoints each unit on its own, as Megatron's and torchtitan's full
    recomputation checkpoint each transformer layer, rather than the stage as a whole: a micro-batch then holds
    every unit's input (``unit_output_bytes`` of the unit before it) and the acting one re-materialises one unit
    at a time. Memory of a given layout only (:func:`stage_memory_peak`); the solvers take whole stages."""

    def __post_init__(self) -> None:
        n, p = len(self.forward_s), self.num_stages
        if n == 0 or len(self.backward_s) != n:
            raise UsageError(f"forward_s and backward_s need the same non-zero length ({n}, {len(self.backward_s)})")
        if p < 1 or p > n:
            raise UsageError(f"cannot cut {n} units into {p} non-empty stages")
        if self.num_microbatches < 1:
            raise UsageError(f"num_microbatches must be >= 1, got {self.num_microbatches}")
        for name in ("cut_forward_s", "cut_backward_s", "cut_bytes", "cut_grad_bytes"):
            if getattr(self, name) and len(getattr(self, name)) != n - 1:
                raise UsageError(f"{name} needs {n - 1} values (one per cut), got {len(getattr(self, name))}")
        if self.unit_output_bytes and len(self.unit_output_bytes) != n:
            raise UsageError(f"unit_output_bytes needs {n} values (one per unit), got {len(self.unit_output_bytes)}")
        for name in ("cut_grad_bytes",):
            if getattr(self, name) and len(getattr(self, name)) != n - 1:
                raise UsageError(f"{name} needs {n - 1} values (one per cut), got {len(getattr(self, name))}")
        for name in (
            "param_state_bytes",
            "saved_bytes",
            "transient_bytes",
            "grad_bytes",
            "split_held_bytes",
            "step_bytes",
        ):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise UsageError(f"{name} needs {n} values (one per unit), got {len(getattr(self, name))}")
        for name in ("in_flight", "capacity_bytes", "speed", "moments", "local_inputs"):
            if getattr(self, name) and len(getattr(self, name)) != p:
                raise UsageError(f"{name} needs {p} values (one per stage), got {len(getattr(self, name))}")
        if not self.recompute_choices:
            raise UsageError("recompute_choices must not be empty")
        if any(not stage or any(m.waiting < 0 or m.split < 0 for m in stage) for stage in self.moments):
            raise UsageError("every stage needs at least one moment, with non-negative micro-batch counts")
        if self.buffer_microbatches < 0:
            raise UsageError(f"buffer_microbatches must be >= 0, got {self.buffer_microbatches}")

    @property
    def num_units(self) -> int:
        return len(self.forward_s)

    @property
    def is_homogeneous(self) -> bool:
        """True when the DP can solve it: identical stages (no speeds) and no per-stage unit caps."""
        return (not self.speed or all(v == 1.0 for v in self.speed)) and self.max_units_per_stage is None

    @property
    def is_free(self) -> bool:
        """True when any partition into non-empty stages is allowed: homogeneous and nothing pinned."""
        return self.is_homogeneous and not self.pinned


def check_pins(problem: PartitionProblem) -> None:
    """Raise UsageError for a pin out of range, PlanInfeasibleError for a unit that no partition into non-empty
    stages puts in its stage."""
    n, p = problem.num_units, problem.num_stages
    for unit, stage in problem.pinned:
        if not (0 <= unit < n and 0 <= stage < p):
            raise UsageError(f"pin (unit {unit}, stage {stage}) is out of range ({n} units, {p} stages)")
        if not (p - n + unit <= stage <= unit):
            raise PlanInfeasibleError(
                f"unit {unit} cannot be in stage {stage}: with {n} units and {p} non-empty stages it can "
                f"only be in stages {max(0, p - n + unit)}..{min(unit, p - 1)}"
            )


class Moment(NamedTuple):
    """A moment at which a stage may peak (planner/schedule/memory.py): the start of one backward action."""

    waiting: int
    """Micro-batches forwarded whose backward has not begun (the acting one among them for B and I)."""
    split: int = 0
    """Micro-batches between their input-gradient and weight-gradient actions."""
    grads: bool = True
    """Whether the stage's gradients exist (a backward computed them earlier in the step)."""
    acting: bool = True
    """Whether the acting micro-batch is re-materialised here under recomputation (B and I, not W)."""
    kind: str = "B"
    """The acting action: B (full backward), I (input gradient) or W (weight gradient): whose working memory."""
    sent_grads: int = 0
    """Input gradients of earlier micro-batches that a send still holds (the stage's input's size each)."""
    sent_outputs: int = 0
    """Outputs of micro-batches past their backward that a send still holds (the stage's output's size each)."""
    done: int = 0
    """Micro-batches whose backward is done: the last stage holds each one's loss (``kept_loss_bytes``)."""
    held_output: int = 0
    """The last stage: 1 where the schedule's loop still references the rank's latest forward's output, its
    micro-batch past the start of its backward (``latest_output_bytes``)."""

    def covers(self, other: Moment) -> bool:
        """Whether this moment holds at least as much as ``other`` whatever the sizes: no fewer micro-batches
        waiting, split or sent, gradients and re-materialisation wherever ``other`` has them, the same action."""
        return (
            self.waiting >= other.waiting
            and self.split >= other.split
            and self.grads >= other.grads
            and self.acting >= other.acting
            and self.kind == other.kind
            and self.sent_grads >= other.sent_grads
            and self.sent_outputs >= other.sent_outputs
            and self.done >= other.done
            and self.held_output >= other.held_output
        )


@dataclass(frozen=True)
class StageMemory:
    """A stage's memory at its peak, by part (bytes)."""

    state_bytes: float
    """Weights, optimizer state and the gradients present (``grads_bytes``)."""
    grads_bytes: float
    buffers_bytes: float
    activations_bytes: float
    transient_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + self.buffers_bytes + self.activations_bytes + self.transient_bytes


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


def stage_moments(problem: PartitionProblem, stage: int) -> tuple[Moment, ...]:
    """The moments of ``stage``: ``problem.moments[stage]``, or the default one."""
    if problem.moments:
        return problem.moments[stage]
    return (Moment(problem.in_flight[stage] if problem.in_flight else problem.num_microbatches),)


def relayed_bytes(problem: PartitionProblem, first: int, last: int) -> int:
    """Bytes a stage of units ``first..last`` passes on per micro-batch (``relays`` made before it, read after)."""
    return sum(b for producer, consumer, b in problem.relays if producer < first and consumer > last)


def acting_kind(moment: Moment, recompute: bool) -> str:
    """Whose working memory a moment's action has: a recomputing stage's action that re-materialises the
    micro-batch runs its whole backward (B): its I, or the first stage's (whose I moment
    :func:`planner.cost.schedule_moments` names W, as it runs no I without recomputation)."""
    return "B" if recompute and moment.acting else moment.kind


def transient_arrays(problem: PartitionProblem) -> dict[str, tuple[int, ...]]:
    """Per acting kind (B, I, W), the per-unit working memory the solvers take the stage's largest of."""
    return {
        "B": problem.transient_bytes,
        "I": problem.input_transient_bytes or problem.transient_bytes,
        "W": problem.weight_transient_bytes or problem.transient_bytes,
    }


def local_cuts(problem: PartitionProblem, stage: int) -> tuple[bool, bool]:
    """Whether ``stage``'s input, and its output, are handed over in memory (no receive buffers there)."""
    if not problem.local_inputs:
        return False, False
    after = stage + 1 < problem.num_stages and problem.local_inputs[stage + 1]
    return problem.local_inputs[stage], after


def _span(values: tuple[float, ...] | tuple[int, ...], first: int, last: int) -> float:
    return sum(values[first : last + 1]) if values else 0


def stage_memory_peak(problem: PartitionProblem, stage: int, first: int, last: int, recompute: bool) -> StageMemory:
    """Memory of stage ``stage`` holding units ``first..last`` at its peak, by part (module docstring)."""
    state = _span(problem.param_state_bytes, first, last)
    grads = _span(problem.grad_bytes, first, last)
    saved = _span(problem.saved_bytes, first, last)
    split = _span(problem.split_held_bytes, first, last)
    # While unit u's backward runs, the acting micro-batch no longer holds what the units after it saved.
    held_after = [0] * (last - first + 1)
    if problem.saved_bytes:
        for k in range(last - first - 1, -1, -1):
            held_after[k] = held_after[k + 1] + problem.saved_bytes[first + k + 1]
    transient = {
        kind: max(v - h for v, h in zip(values[first : last + 1], held_after, strict=True)) if values else 0
        for kind, values in transient_arrays(problem).items()
    }
    stage_input = problem.input_bytes if first == 0 else _at(problem.cut_bytes, first - 1)
    last_unit = last == problem.num_units - 1
    out_grad = 0 if last_unit else _at(problem.cut_grad_bytes, last)
    local_in, local_out = local_cuts(problem, stage)
    # Across a cut on one rank torch hands the tensors over in place of the receive buffers, which keep them
    # (set_local_fwd_input / set_local_bwd_input): as many, held by the stage that receives them.
    buffers = problem.buffer_microbatches * (stage_input + out_grad + (problem.target_bytes if last_unit else 0))
    kept_loss = problem.kept_loss_bytes if last_unit else 0
    latest_output = problem.latest_output_bytes if last_unit else 0
    # A relayed tensor's gradient, under a split backward, is the receive buffer it came in: the send holds no
    # more for it, and across a V's turn the stage before keeps that buffer as its own (counted there).
    passed = relayed_bytes(problem, first, last) if problem.split_backward and not recompute else 0
    if local_in:
        buffers -= problem.buffer_microbatches * passed
    # What a send still holds: an input gradient per sent one, an output per one past its backward.
    sent_grad = 0 if first == 0 or local_in else _at(problem.cut_grad_bytes, first - 1) - passed
    sent_output = 0 if last_unit or local_out else _at(problem.cut_bytes, last)
    # Past I, the last stage no longer holds the model's output (torch detaches it; nothing saved it).
    split_held = split - (problem.final_output_bytes if last_unit else 0)
    # A stage handing its output over on its rank holds it no more: the next stage's buffers do.
    handed = _at(problem.cut_bytes, last) if local_out and not last_unit else 0
    if not recompute:
        held, remat = saved + relayed_bytes(problem, first, last) - handed, 0
    elif problem.recompute_unit_wise:
        # One checkpoint a unit: each unit's input is held, and one unit's activations re-materialised at a time.
        inputs = sum(problem.unit_output_bytes[first:last]) if problem.unit_output_bytes else 0
        held = inputs + (problem.output_held_bytes if last_unit else _at(problem.cut_bytes, last) - handed)
        remat = max(problem.saved_bytes[first : last + 1], default=0)
    elif not problem.buffer_microbatches:
        held, remat = stage_input - handed, saved
    elif last_unit:
        # The loss runs after the checkpointed stage: its output and the loss's saved tensors are held, not
        # re-materialised.
        held, remat = problem.output_held_bytes, saved - problem.output_held_bytes
    else:
        held, remat = _at(problem.cut_bytes, last) - handed, saved - _at(problem.unit_output_bytes, last)
    step = problem.step_bytes[first : last + 1] if problem.step_bytes else (0,)
    tail = StageMemory(state, grads, buffers, 0, sum(step) if problem.step_bytes_add else max(step))
    best = tail
    best_total, best_moment = best.total_bytes, None
    for m in stage_moments(problem, stage):
        # A recomputing stage runs its whole backward in I (nothing is left for W to hold).
        past_input = 0 if recompute else m.split * (held + split_held)
        activations = (
            m.waiting * held
            + past_input
            + (remat if m.acting else 0)
            + m.done * kept_loss
            + m.held_output * latest_output
        )
        kept = grads if m.grads else 0
        sends = m.sent_grads * sent_grad + m.sent_outputs * sent_output
        working = transient["B" if recompute and m.acting else m.kind]  # acting_kind, inlined: a hot loop
        total = state - grads + kept + buffers + sends + activations + working
        if total > best_total:
            best_total, best_moment = total, (kept, sends, activations, working)
    if best_moment is None:
        return best
    kept, sends, activations, working = best_moment
    return StageMemory(state - grads + kept, kept, buffers + sends, activations, working)


def stage_compute_s(problem: PartitionProblem, stage: int, first: int, last: int, recompute: bool) -> float:
    """Compute of stage ``stage`` holding units ``first..last`` per micro-batch: :func:`stage_cost`'s, without
    its memory (a solver that can rule a stage out by its time alone asks this first)."""
    fwd = math.fsum(problem.forward_s[first : last + 1])
    bwd = math.fsum(problem.backward_s[first : last + 1])
    speed = problem.speed[stage] if problem.speed else 1.0
    return (fwd + bwd + (fwd if recompute else 0.0)) / speed


_KEPT_PROBLEMS = 16
"""How many problems' stage costs :func:`stage_cost` keeps, the latest asked."""
_stage_costs: dict[int, tuple[PartitionProblem, dict[tuple[int, int, int, bool], StageCost]]] = {}


def stage_cost(problem: PartitionProblem, stage: int, first: int, last: int, recompute: bool) -> StageCost:
    """Cost of stage ``stage`` holding units ``first..last`` (inclusive). Kept per problem object (the latest
    :data:`_KEPT_PROBLEMS`): a search asks again of the same stages when it evaluates the DP's partition, starts the
    rank balance from it and evaluates where that ends (four asks in five, on the 2,000-unit cluster search)."""
    entry = _stage_costs.get(id(problem))
    if entry is None or entry[0] is not problem:
        if len(_stage_costs) >= _KEPT_PROBLEMS:
            del _stage_costs[next(iter(_stage_costs))]
        entry = _stage_costs[id(problem)] = (problem, {})
    key = (stage, first, last, recompute)
    costs = entry[1]
    if key not in costs:
        costs[key] = _stage_cost(problem, stage, first, last, recompute)
    return costs[key]


def _stage_cost(problem: PartitionProblem, stage: int, first: int, last: int, recompute: bool) -> StageCost:
    compute = stage_compute_s(problem, stage, first, last, recompute)
    comm = 0.0 if first == 0 else _at(problem.cut_forward_s, first - 1) + _at(problem.cut_backward_s, first - 1)
    memory = stage_memory_peak(problem, stage, first, last, recompute).total_bytes
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
