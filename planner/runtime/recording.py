"""Record a training loop's actions, cheaply enough to leave on: the rank side of a run record.

:class:`ActionRecorder` wraps, on the instances, the methods torch's schedules call by name on each
``PipelineStage`` (``forward_one_chunk`` F, ``backward_one_chunk`` B, ``backward_weight_one_chunk`` W,
``perform_reduce_grad`` R) and the schedule's ``_compute_loss`` (counted in the last stage's forward, as the
profile's last unit counts it), as verify's rank side does (planner/runtime/rank_timing.py); it also wraps
torch's ``schedules._wait_batch_p2p`` (the waits on sends and receives) and hooks ``optimizer.step()`` (the end
of the step tail). Each action costs a pair of clock readings and an append: ``time.perf_counter`` on CPU, and
on CUDA a pair of CUDA events read once they have completed (never a synchronize, which would stall the
stream the recording is meant to watch). ``python benchmarks/bench_recording.py`` measures what it costs.

Everything here is this rank's; gathering the ranks' samples into one record is
:mod:`planner.runtime.recorded`, the record's format :mod:`planner.runtime.run_record`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = ["ActionRecorder", "StepSample", "STAGE_METHODS"]

STAGE_METHODS = (
    ("forward_one_chunk", "F"),
    ("backward_one_chunk", "B"),
    ("backward_weight_one_chunk", "W"),
    ("perform_reduce_grad", "R"),
)
"""The ``PipelineStage`` methods torch's schedules call by name, and the kind each is recorded as."""


@dataclass
class StepSample:
    """One step of the training loop on this rank, as recorded (seconds; ``start_s`` on this rank's clock)."""

    start_s: float
    """When ``run.step`` (or ``schedule_step``) was entered, from the recording's start."""
    schedule_s: float = 0.0
    """From entering the step to torch's ``schedule.step`` returning."""
    own_s: float = 0.0
    """From entering the step to the end of its tail: the optimizer's step where one ran, else the tied-gradient sum."""
    tail_s: float = 0.0
    """The gradient scaling (R), plus from the schedule's return to the tail's end."""
    wait_s: float = 0.0
    """Inside torch's waits on point-to-point transfers."""
    optimizer: bool = False
    """Whether an optimizer of this run's parameters stepped in the tail."""
    segment: int = 0
    """Which stretch of recording the step belongs to (one per :meth:`ActionRecorder.start`): the time from one
    step to the next is a step's period only within one stretch."""
    actions: list[list[tuple[str, float]]] = field(default_factory=list)
    """Per stage of this rank, every action in order: ``(kind, seconds)``."""
    waits: list[float] = field(default_factory=list)
    """Every wait on point-to-point work, in order."""

    @property
    def busy_s(self) -> float:
        """The stages' compute: every action but the gradient scaling."""
        return sum(d for stage in self.actions for kind, d in stage if kind != "R")


class _Clock:
    """Marks on the host's clock (CPU), or CUDA events on the current stream: their differences, in seconds."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: Any) -> bool:
        return not self.cuda or bool(mark.query())

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return float(end - start)
        end.synchronize()  # only reached once query() said it completed, or when the recording is read
        return float(start.elapsed_time(end)) / 1e3


@dataclass
class _OpenStep:
    """A step whose marks may still be CUDA events in flight."""

    sample: StepSample
    begin: Any
    scheduled: Any = None
    tail_end: Any = None
    actions: list[list[tuple[str, Any, Any]]] = field(default_factory=list)


class ActionRecorder:
    """Records this rank's actions of each step of ``stages`` under ``schedule``; off until :meth:`start`.

    ``stages``: torch's ``PipelineStage`` of each of this rank's stages; ``last``: the position among them of the
    plan's last stage (None: the rank does not hold it); ``parameters``: the run's, to tell its optimizer's steps
    from another optimizer's.
    """

    def __init__(
        self,
        stages: Sequence[Any],
        schedule: Any,
        device: torch.device,
        parameters: Sequence[torch.nn.Parameter],
        last: int | None,
    ) -> None:
        self.stages, self.schedule, self.last = tuple(stages), schedule, last
        self.clock = _Clock(device)
        self.param_ids = {id(p) for p in parameters}
        self.steps: list[StepSample] = []
        self.active = False
        self._origin = 0.0
        self._open: _OpenStep | None = None
        self._pending: list[_OpenStep] = []
        self._undo: list[Callable[[], None]] = []
        self._ours: dict[int, bool] = {}
        self._segment = -1
        self.gathers = 0
        """How many times the samples were gathered into a record: each gather's rendezvous needs a new tag."""

    def start(self) -> None:
        """Install the wrappers and hooks; steps from now on are recorded (again after :meth:`stop`)."""
        if self.active:
            return
        self.active = True
        self._segment += 1
        self._origin = time.perf_counter() if not self.steps else self._origin
        for k, stage in enumerate(self.stages):
            for method, kind in STAGE_METHODS:
                original = getattr(stage, method, None)
                if original is not None:
                    self._replace(stage, method, self._timed(original, kind, k))
        if self.last is not None and hasattr(self.schedule, "_compute_loss"):
            self._replace(self.schedule, "_compute_loss", self._timed(self.schedule._compute_loss, "L", self.last))
        self._wrap_waits()
        handle = register_optimizer_step_post_hook(self._optimizer_stepped)
        self._undo.append(handle.remove)

    def stop(self) -> None:
        """Remove every wrapper and hook (the stages run as if never recorded); the samples stay."""
        self._close(None)
        while self._undo:
            self._undo.pop()()
        self.active = False

    def samples(self) -> list[StepSample]:
        """Every step recorded so far, its times read (on CUDA this waits for the steps' events). A step whose
        optimizer has not stepped yet ends with its tied-gradient sum."""
        self._close(None)
        self._resolve(wait=True)
        return list(self.steps)

    def begin_step(self) -> None:
        if not self.active:
            return
        self._close(None)
        self._resolve(wait=False)
        start = time.perf_counter() - self._origin
        self._open = _OpenStep(
            StepSample(start, segment=self._segment), self.clock.mark(), actions=[[] for _ in self.stages]
        )

    def schedule_done(self) -> None:
        if self._open is not None:
            self._open.scheduled = self.clock.mark()

    def tail_done(self) -> None:
        """The tied-gradient sum ended: the tail's end unless an optimizer steps next."""
        if self._open is not None:
            self._open.tail_end = self.clock.mark()

    def _replace(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner)
        previous = vars(owner).get(name)
        setattr(owner, name, value)

        def undo() -> None:
            if had:
                setattr(owner, name, previous)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def _timed(self, fn: Callable[..., Any], kind: str, stage: int) -> Callable[..., Any]:
        clock = self.clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            step = self._open
            if step is None:
                return fn(*args, **kwargs)
            start = clock.mark()
            out = fn(*args, **kwargs)
            step.actions[stage].append((kind, start, clock.mark()))
            return out

        return timed

    def _wrap_waits(self) -> None:
        from torch.distributed.pipelining import schedules

        original = schedules._wait_batch_p2p

        def timed(work: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(work)
            finally:
                if self._open is not None:
                    self._open.sample.waits.append(time.perf_counter() - t0)

        schedules._wait_batch_p2p = timed  # the schedules look it up by name at each call

        def undo() -> None:
            if schedules._wait_batch_p2p is timed:
                schedules._wait_batch_p2p = original

        self._undo.append(undo)

    def _optimizer_stepped(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        step = self._open
        if step is None or step.scheduled is None:
            return
        ours = self._ours.get(id(optimizer))
        if ours is None:
            params = (p for group in optimizer.param_groups for p in group["params"])
            ours = self._ours[id(optimizer)] = any(id(p) in self.param_ids for p in params)
        if ours:
            step.sample.optimizer = True
            self._close(self.clock.mark())

    def _close(self, end: Any) -> None:
        """Close the open step at ``end`` (None: where its tied-gradient sum or its schedule ended)."""
        step = self._open
        if step is None:
            return
        self._open = None
        step.tail_end = end if end is not None else step.tail_end or step.scheduled or step.begin
        step.scheduled = step.scheduled or step.tail_end
        self._pending.append(step)

    def _resolve(self, wait: bool) -> None:
        """Read the times of the closed steps whose marks have completed (all of them with ``wait``)."""
        while self._pending and (wait or self.clock.ready(self._pending[0].tail_end)):
            step = self._pending.pop(0)
            seconds = self.clock.seconds
            sample = step.sample
            sample.schedule_s = seconds(step.begin, step.scheduled)
            sample.own_s = seconds(step.begin, step.tail_end)
            sample.actions = _merged_loss([[(k, seconds(a, b)) for k, a, b in stage] for stage in step.actions])
            scaling = sum(d for stage in sample.actions for kind, d in stage if kind == "R")
            sample.tail_s = seconds(step.scheduled, step.tail_end) + scaling
            sample.wait_s = sum(sample.waits)
            self.steps.append(sample)


def _merged_loss(actions: list[list[tuple[str, float]]]) -> list[list[tuple[str, float]]]:
    """Each loss (L) counted in the forward right before it, as the profile's last unit counts it; a loss with no
    forward right before it stays its own record."""
    out = []
    for stage in actions:
        merged: list[tuple[str, float]] = []
        for kind, d in stage:
            if kind == "L" and merged and merged[-1][0] == "F":
                merged[-1] = ("F", merged[-1][1] + d)
            else:
                merged.append((kind, d))
        out.append(merged)
    return out
