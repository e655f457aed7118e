"""A pipeline as the simulator sees it: one value, whoever made it (a plan, a search candidate, a replay, a what-if).

A :class:`Pipeline` holds the per-stage times, the links between stages, the schedule, the rank count and the
runtime terms (:class:`RuntimeTerms`), checked together on construction; :func:`~planner.schedule.simulate.simulate`
takes it whole.
``Plan.pipeline()`` makes one from a plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from planner.errors import UsageError
from planner.schedule.orders import Schedule, default_ranks, stage_to_rank

__all__ = ["Pipeline", "RuntimeTerms", "resume_gaps_valid"]


@dataclass(frozen=True)
class RuntimeTerms:
    """What a real runtime adds to the compute of a schedule (all zero: the textbook model)."""

    action_overhead_s: float = 0.0
    """Per compute action, on its rank: torch's Python dispatch, posting and waiting on P2P ops."""
    step_tail_s: tuple[float, ...] = ()
    """Per rank, after its last action: tied-gradient sum, ``optimizer.step()``, ``zero_grad``."""
    compute_scale: float = 1.0
    """Co-location factor: compute inside a running pipeline / compute profiled alone. Applied to every
    action of a pipeline of two or more ranks (planner.schedule.simulate says why)."""
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


def _times(name: str, values: Sequence[float], length: int | None, *, allow_zero: bool) -> tuple[float, ...]:
    """``values`` as floats, each finite and positive (or >= 0 with ``allow_zero``), ``length`` of them if given."""
    out = tuple(float(x) for x in values)
    if length is not None and len(out) != length:
        raise UsageError(f"{name} has {len(out)} values, expected {length}")
    for i, x in enumerate(out):
        ok = math.isfinite(x) and (x >= 0 if allow_zero else x > 0)
        if not ok:
            need = ">= 0" if allow_zero else "> 0"
            raise UsageError(f"{name}[{i}] = {x} must be finite and {need} (seconds)")
    return out


@dataclass(frozen=True)
class Pipeline:
    """Per-stage times of one micro-batch, the links between stages and what the runtime adds.

    The fields come in the order a caller thinks of them: ``Pipeline([1, 1], [2, 2], 4, "1f1b")`` is two stages
    of F = 1 and B = 2 running four micro-batches under 1F1B. Every list is checked on construction (times finite
    and positive, lengths per stage or per cut), and the schedule's name parsed.
    """

    forward_s: tuple[float, ...]
    """Per stage, forward time of one micro-batch (``R * v`` stages for looped schedules)."""
    backward_s: tuple[float, ...]
    """Per stage, full backward time of one micro-batch (input + weight gradients)."""
    num_microbatches: int
    schedule: Schedule
    """A :class:`Schedule`, or its name (parsed on construction)."""
    num_ranks: int | None = None
    """``R``; None: one stage per rank, or half the stages for interleaved-1f1b, zbv and dualpipev (set on
    construction, so a made pipeline always holds the count)."""
    comm_forward_s: tuple[float, ...] = ()
    """Per cut ``s`` (between stage ``s`` and ``s+1``), the delay of sending the activations; empty: 0. It delays
    ``F(s+1, m)`` but occupies no compute."""
    comm_backward_s: tuple[float, ...] = ()
    """Per cut ``s``, the delay of sending the gradient back to stage ``s``; empty: 0."""
    weight_s: tuple[float, ...] = ()
    """Per stage, the weight-gradient part ``W`` of ``backward_s`` (torch's ``stage_backward_weight``), used by
    the schedules that split the backward (zero-bubble, zbv, dualpipev; a full ``B`` still costs ``backward_s``).
    Empty: the backward stays unsplit (``I = backward_s``, ``W = 0``; no guess of the split)."""
    input_s: tuple[float, ...] = ()
    """Per stage, the input-gradient action ``I`` as measured apart (torch's ``stage_backward_input``); empty:
    ``backward_s - weight_s``. Given with ``weight_s``, the split may cost more than ``backward_s`` (torch walks
    the autograd graph to split it)."""
    runtime: RuntimeTerms | None = None
    """Overhead per action, step tail per rank, co-location factor, the compute a byte sent costs; None: the
    textbook model (all zero)."""
    cut_forward_bytes: tuple[int, ...] = ()
    """Per cut, the activation bytes of one micro-batch sent across it (what a transfer costs in compute:
    ``RuntimeTerms.transfer_compute_s_per_byte``)."""
    cut_backward_bytes: tuple[int, ...] = ()
    """Per cut, the gradient bytes sent back across it."""

    def __post_init__(self) -> None:
        schedule = Schedule.parse(self.schedule)
        m = self.num_microbatches
        if not isinstance(m, int) or m < 1:
            raise UsageError(f"num_microbatches = {m!r} must be an integer >= 1")
        n = len(self.forward_s)
        if n < 1:
            raise UsageError("forward_s is empty: give one forward time per stage")
        # (field, length, optional): the stage times are needed and > 0, the others may be empty and hold zeros.
        fields = (
            ("forward_s", None, False),
            ("backward_s", n, False),
            ("comm_forward_s", n - 1, True),
            ("comm_backward_s", n - 1, True),
            ("weight_s", n, True),
            ("input_s", n, True),
        )
        for name, length, optional in fields:
            values = getattr(self, name)
            checked = _times(name, values, length, allow_zero=optional) if values or not optional else ()
            object.__setattr__(self, name, checked)
        if self.input_s and not self.weight_s:
            raise UsageError("input_s needs weight_s: give both parts of the split backward")
        for s, (w, b) in enumerate(zip(self.weight_s, self.backward_s, strict=False)):
            if w > b and not self.input_s:
                raise UsageError(f"weight_s[{s}] = {w} must be at most backward_s[{s}] = {b} (W is a part of B)")
        ranks = default_ranks(schedule, n) if self.num_ranks is None else self.num_ranks
        if not isinstance(ranks, int) or ranks < 1:
            raise UsageError(f"num_ranks = {ranks!r} must be an integer >= 1")
        for name in ("cut_forward_bytes", "cut_backward_bytes"):
            object.__setattr__(self, name, tuple(int(b) for b in getattr(self, name)))
        object.__setattr__(self, "schedule", schedule)
        object.__setattr__(self, "num_ranks", ranks)

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)

    @property
    def placement(self) -> tuple[int, ...]:
        """The rank of each stage, as torch places the schedule's stages."""
        return stage_to_rank(self.schedule, self.num_stages, self.num_ranks)

    def at_speed(self, speed: float) -> Pipeline:
        """The stages' compute ``speed`` times slower (the runtime terms as they are; see
        ``RuntimeTerms.at_speed`` for theirs)."""
        if speed == 1.0:
            return self
        return self._restaged(lambda times: tuple(t * speed for t in times), keep_links=True)

    def with_runtime(self, runtime: RuntimeTerms | None) -> Pipeline:
        return replace(self, runtime=runtime)

    def with_backward(self, backward_s: Sequence[float]) -> Pipeline:
        """Other full backward times (e.g. measured whole), a split backward cut in this one's proportions, so
        the schedule's W still fills its bubble."""
        backward = tuple(float(b) for b in backward_s)
        if not self.weight_s:
            return replace(self, backward_s=backward)
        # Without a measured I, the simulator's: the backward less its W.
        own_inputs = self.input_s or tuple(b - w for b, w in zip(self.backward_s, self.weight_s, strict=True))
        inputs, weights = [], []
        for i, w, b in zip(own_inputs, self.weight_s, backward, strict=True):
            share = w / (i + w) if i + w > 0 else 0.0
            inputs.append(b * (1 - share))
            weights.append(b * share)
        return replace(self, backward_s=backward, input_s=tuple(inputs), weight_s=tuple(weights))

    def as_schedule(
        self, schedule: Schedule, virtual_stages: int | None = None, *, action_overhead_s: float | None = None
    ) -> Pipeline:
        """The same per-rank work under another schedule: each rank's stages as one, cut into the schedule's
        ``v`` equal chunks placed as torch places them (looped or V); chunks inside a rank have no transfer
        time, so the given links no longer apply (stages already placed as the schedule places them stay).
        Runtime terms stay (every rank holds the same units, so its step tail is the same), with the
        schedule's own ``action_overhead_s`` if given."""
        v = schedule.default_virtual_stages if virtual_stages is None or schedule.v_shape else virtual_stages
        if not schedule.multi_stage:
            v = 1
        runtime = self.runtime
        if runtime is not None and action_overhead_s is not None:
            runtime = replace(runtime, action_overhead_s=action_overhead_s)
        moved = replace(self, schedule=schedule, runtime=runtime)
        same_stages = self.num_stages == self.num_ranks * v
        if same_stages and (v == 1 or self.placement == stage_to_rank(schedule, self.num_stages, self.num_ranks)):
            return moved
        if self.num_stages != self.num_ranks:
            # Other stages per rank, or the same count placed otherwise: the rank's work is what carries over.
            moved = replace(self._one_stage_per_rank(), schedule=schedule, runtime=runtime)
        if v == 1:
            return moved
        chunks = stage_to_rank(schedule, self.num_ranks * v, self.num_ranks)
        return moved._restaged(lambda times: tuple(times[rank] / v for rank in chunks), keep_links=False)

    def _one_stage_per_rank(self) -> Pipeline:
        """Each rank's stages as one (their times summed); the links between them no longer apply."""
        placement = self.placement

        def merged(times: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(sum(t for t, r in zip(times, placement, strict=True) if r == k) for k in range(self.num_ranks))

        return self._restaged(merged, keep_links=False)

    def _restaged(self, per_stage: Callable[[tuple[float, ...]], tuple[float, ...]], *, keep_links: bool) -> Pipeline:
        """The per-stage times (F, B, I, W; an empty list stays empty) through ``per_stage``; the links between
        stages kept, or dropped where the stages are no longer the ones they joined."""

        def apply(times: tuple[float, ...]) -> tuple[float, ...]:
            return per_stage(times) if times else ()

        links = (
            {}
            if keep_links
            else {"comm_forward_s": (), "comm_backward_s": (), "cut_forward_bytes": (), "cut_backward_bytes": ()}
        )
        return replace(
            self,
            forward_s=apply(self.forward_s),
            backward_s=apply(self.backward_s),
            input_s=apply(self.input_s),
            weight_s=apply(self.weight_s),
            **links,
        )
