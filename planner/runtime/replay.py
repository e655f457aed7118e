"""Replay a plan in one process: every stage's forward and backward actions, timed one by one.

For one device holding several stages, or a CPU with fewer cores than the plan has ranks, where
running the ranks side by side would measure contention rather than the plan. The real stage modules
run on real tensors handed from stage to stage; actions follow each rank's order from
:func:`planner.schedule.orders.rank_orders`, interleaved across ranks as their dependencies allow. A
split backward runs as torch's does, ``I`` then ``W`` (``stage_backward_input``, ``stage_backward_weight``),
and a micro-batch's backward time is the two added. Each step ends as training does: tied copies summed,
the plan's optimizer stepped, the gradients let go (untimed). What each stage holds follows torch's
``PipelineStage`` (:class:`_Stages`), and a warm-up step measures each stage's memory
(:class:`profiles.memory.LiveBytes`). The caller turns the measured per-stage times into an iteration with
the simulator.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from planner.errors import ExecutionError
from planner.plan import Plan
from planner.runtime.apply import (
    backward_whole,
    microbatch_inputs,
    schedule_microbatches,
    stage_io_examples,
    tied_parameter_groups,
)
from planner.runtime.progress import Phases, ProgressBar
from planner.runtime.run_setup import captured_units, make_optimizer
from planner.runtime.stages import split_stages
from planner.schedule.orders import Schedule, Step, rank_orders
from profiles.cores import intra_op_threads, untimed_on_every_core
from profiles.memory import LiveBytes, MemorySample
from profiles.model_reference import UnitReference
from profiles.reference import SpeedReference
from profiles.weight_groups import split_input_backward
from profiles.workload import Workload, as_tuple

__all__ = ["ReplayResult", "replay_plan", "merged_order", "profiled_threads"]


@dataclass(frozen=True)
class ReplayResult:
    forward_s: tuple[float, ...]
    """Per stage: median forward time of one micro-batch over the timed steps."""
    backward_s: tuple[float, ...]
    """Per stage: median backward time of one micro-batch (re-run forward included under recompute)."""
    step_s: tuple[float, ...]
    """Wall time of each timed step, all stages back to back (not an iteration of the pipeline)."""
    warmup_steps: int = 1
    """Untimed steps before the timed ones, the memory step among them."""
    loss: float | None = None
    """Loss of the first step (mean over micro-batches), when ``keep_grads`` was asked."""
    grads: dict[str, torch.Tensor] | None = None
    """Gradients of the first step by original FQN, tied copies summed."""
    reference_s: float | None = None
    """Median forward+backward of the speed reference, timed after each step: the model's units added up where
    the plan recorded their profiled sum (profiles/model_reference.py), the reference layer otherwise
    (profiles/reference.py)."""
    reference: str = "layer"
    """Which reference: ``units`` or ``layer``."""
    stage_memory: tuple[MemorySample, ...] = ()
    """Per stage: its peak of live tensor bytes in a step of the warm-up, by category (as verify measures a rank's)."""


def merged_order(orders: list[list[Step]], num_stages: int) -> list[Step]:
    """One sequence holding every rank's actions in that rank's order, each after what it depends on."""
    done: set[tuple[int, int, str]] = set()
    pos = [0] * len(orders)
    out: list[Step] = []

    def ready(step: Step) -> bool:
        if step.kind == "F":
            return step.stage == 0 or (step.stage - 1, step.microbatch, "F") in done
        if step.kind == "W":
            return (step.stage, step.microbatch, "I") in done
        after = step.stage == num_stages - 1 or any((step.stage + 1, step.microbatch, k) in done for k in "BI")
        return (step.stage, step.microbatch, "F") in done and after

    while any(p < len(o) for p, o in zip(pos, orders, strict=True)):
        progressed = False
        for r, order in enumerate(orders):
            while pos[r] < len(order) and ready(order[pos[r]]):
                step = order[pos[r]]
                done.add((step.stage, step.microbatch, step.kind))
                out.append(step)
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = [str(o[p]) for p, o in zip(pos, orders, strict=True) if p < len(o)]
            raise ExecutionError(f"the schedule's actions cannot be ordered (stuck at {stuck})")
    return out


def _leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    return value


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def replay_plan(
    plan: Plan, workload: Workload, *, steps: int = 5, warmup: int = 2, device: str = "cpu", keep_grads: bool = False
) -> ReplayResult:
    """Run ``plan`` in this process: untimed steps, one of which measures each stage's memory (at least
    ``warmup``: :meth:`_Replayer.warmup_steps`), then ``steps`` steps timing every stage's actions.

    With ``keep_grads`` an extra first step (not timed) records the loss and every gradient, for a
    numerics check against a single-process run.
    """
    dev = torch.device(device)
    if dev.type == "cpu":
        # As the profiler and every rank do (profiles/allocator.py): the measured process must match.
        from profiles.allocator import keep_freed_memory

        keep_freed_memory()
    with profiled_threads(plan, dev):
        return _replay(plan, workload, steps, warmup, dev, keep_grads)


@contextmanager
def profiled_threads(plan: Plan, dev: torch.device) -> Iterator[None]:
    """On a CPU, torch's intra-op threads as the plan's profile had them (``plan.device["threads"]``),
    restored after. A profile made with ``--ranks 2`` on 2 cores times each unit on 1 thread: replayed on both
    threads, the stages would run faster than the plan predicts them."""
    threads = plan.profile_threads
    if dev.type != "cpu" or threads is None:
        yield
        return
    with intra_op_threads(threads):
        yield


class _Stages:
    """Every stage of the plan in this process, holding what torch 2.13's ``PipelineStage`` holds.

    So that a replayed stage's memory is the one a rank's would be (torch/distributed/pipelining/stage.py):
    receive buffers for every micro-batch of a stage's input and of its output's gradient, made once and kept
    (none across a cut between two stages of one rank: torch hands those tensors over); the forward's outputs
    and inputs kept until the micro-batch's backward (``fwd_cache``); every micro-batch's loss until the step ends
    (the schedule's ``_internal_losses``); past a split backward's I, the graph and
    what I keeps for W until W (``backward_state``); an input's gradient let go once handed to the stage before.
    """

    def __init__(self, plan: Plan, modules: list[Any], mb_inputs: list[tuple[Any, ...]], dev: torch.device) -> None:
        self.plan, self.modules, self.mb_inputs = plan, modules, mb_inputs
        self.n, self.m = plan.num_stages, len(mb_inputs)
        ranks = [st.rank for st in plan.stages]
        self.local = [s > 0 and ranks[s - 1] == ranks[s] for s in range(self.n)]
        self.recv: list[dict[int, tuple[torch.Tensor, ...]]] = [{} for _ in range(self.n)]
        self.grad_recv: list[dict[int, list[torch.Tensor | None]]] = [{} for _ in range(self.n)]
        self.fwd: dict[tuple[int, int], tuple[Any, tuple[Any, ...]]] = {}
        self.split: dict[tuple[int, int], tuple[Any, tuple[Any, ...], Any]] = {}
        self.loss: dict[int, torch.Tensor] = {}
        self.kept_losses: list[torch.Tensor] = []
        self.whole_in_input = self._whole_in_input()
        # What torch's sends still hold (planner/schedule/memory.py): the multi-stage runtime and GPipe keep every
        # send's work (and its tensor) to the end of the step; 1F1B's last backward send stays referenced until the
        # next backward's replaces it, and its warm-up's second-to-last forward send until its cool-down begins.
        self.sent: list[list[Any]] = [[] for _ in range(self.n)]
        self.warmup_sent: list[list[Any]] = [[] for _ in range(self.n)]
        self.keeps_outputs = plan.schedule.multi_stage or plan.schedule in (Schedule.GPIPE, Schedule.NAIVE)
        self.one_pending = plan.schedule is Schedule.ONE_F_ONE_B
        self.handed: Callable[[Any, int], None] = lambda tensors, owner: None
        """Told of tensors handed to a stage across a cut on one rank (the memory tracker makes them its buffers)."""

    def _whole_in_input(self) -> list[bool]:
        """Per stage, whether it runs its whole backward at I, as ``apply_plan`` has a rank run it
        (:func:`~planner.runtime.apply.backward_whole`, from one micro-batch's forward through the stages)."""
        if not self.plan.schedule.splits_backward:
            return [False] * self.n
        _, alone = stage_io_examples(self.modules, self.mb_inputs[0])
        return [backward_whole(self.plan, s, m, a) for s, (m, a) in enumerate(zip(self.modules, alone, strict=True))]

    def make_buffers(self) -> None:
        """Every receive buffer of a cut between ranks, made before the first step's actions as torch makes them,
        so that a first step holds what a later one does: their shapes from one micro-batch's forward through the
        stages."""
        if any(self.recv) or any(self.grad_recv):
            return
        args = self.mb_inputs[0]
        for s in range(self.n - 1):
            sent = tuple(v for v in as_tuple(self.modules[s](*args)) if isinstance(v, torch.Tensor))
            args = tuple(v.detach().requires_grad_(v.requires_grad) for v in sent)
            if self.local[s + 1]:  # the tensors handed over themselves, which only a step leaves behind
                continue
            for mb in range(self.m):
                self.recv[s + 1][mb] = tuple(torch.empty_like(v) for v in sent)
                self.grad_recv[s][mb] = [torch.empty_like(v) if v.requires_grad else None for v in sent]

    def buffers(self) -> list[torch.Tensor]:
        """Every receive buffer (for the memory tracker)."""
        out = [t for per_mb in self.recv for ts in per_mb.values() for t in ts]
        return out + [t for per_mb in self.grad_recv for ts in per_mb.values() for t in ts if t is not None]

    def forward(self, s: int, mb: int) -> tuple[Any, ...]:
        """The stage's inputs for micro-batch ``mb``: the batch's slice, the previous stage's output handed over,
        or that output copied into this stage's receive buffer (made at the first step, as torch does)."""
        if s == 0:
            return self.mb_inputs[mb]
        sent = tuple(v for v in as_tuple(self.fwd[s - 1, mb][0]) if isinstance(v, torch.Tensor))
        if self.local[s]:
            # torch's set_local_fwd_input: the tensors take the receive buffers' place, kept until replaced.
            self.recv[s][mb] = tuple(_leaf(v) for v in sent)
            self.handed(self.recv[s][mb], s)
            return self.recv[s][mb]
        if mb not in self.recv[s]:
            self.recv[s][mb] = tuple(torch.empty_like(v) for v in sent)
        bufs = self.recv[s][mb]
        with torch.no_grad():
            for b, v in zip(bufs, sent, strict=True):
                b.copy_(v)
        return tuple(b.requires_grad_(v.requires_grad) for b, v in zip(bufs, sent, strict=True))

    def finished(self, s: int, out: Any, mb: int) -> None:
        """A micro-batch's backward is done: a send of its output may still hold it.

        The multi-stage runtime and GPipe keep every send's work to the end of the step. torch 2.13's 1F1B keeps
        the work of its warm-up's second-to-last forward send (``send_work``, micro-batch ``w - 2`` of ``w``
        warm-up forwards) until its cool-down reassigns it, after the backward of micro-batch ``M - w``."""
        if s == self.n - 1 or self.local[s + 1]:
            return
        if self.keeps_outputs:
            self.sent[s].append(out)
        elif self.one_pending:
            warmup = min(self.m, self.n - s)
            if mb == warmup - 2:
                self.warmup_sent[s].append(out)
            if mb == self.m - warmup:
                self.warmup_sent[s].clear()

    def step_ended(self) -> None:
        for sent in (*self.sent, *self.warmup_sent):
            sent.clear()
        self.kept_losses.clear()

    def received_grads(self, s: int, mb: int) -> list[torch.Tensor | None]:
        return self.grad_recv[s][mb]

    def hand_back(self, s: int, mb: int, args: tuple[Any, ...]) -> None:
        """Give the gradients of stage ``s``'s inputs to stage ``s - 1``: its receive buffers, or across a cut on
        one rank the tensors themselves; the inputs' ``.grad`` is let go, as torch's ``stage_backward`` does."""
        grads = [a.grad if isinstance(a, torch.Tensor) else None for a in args]
        for a in args:
            if isinstance(a, torch.Tensor):
                a.grad = None
        if s == 0:
            return
        if self.local[s]:
            self.grad_recv[s - 1][mb] = grads  # set_local_bwd_input: in place of the receive buffers
            self.handed([g for g in grads if g is not None], s - 1)
            return
        if self.one_pending:
            # 1F1B's ``bwd_sends``: the previous backward's send, let go once this backward's replaces it.
            self.sent[s].clear()
        self.sent[s].append(grads)
        if mb not in self.grad_recv[s - 1]:
            self.grad_recv[s - 1][mb] = [None if g is None else torch.empty_like(g) for g in grads]
        for b, g in zip(self.grad_recv[s - 1][mb], grads, strict=True):
            if b is not None and g is not None:
                b.copy_(g)


def _backward_pairs(stages: _Stages, s: int, mb: int, out: Any) -> tuple[list[torch.Tensor], list[Any]]:
    """What a stage's backward starts from: the loss on the last stage, else its outputs and their gradients."""
    if s == stages.n - 1:
        return [stages.loss.pop(mb)], [None]
    grads = stages.received_grads(s, mb)
    pairs = [
        (o, g)
        for o, g in zip(as_tuple(out), grads, strict=False)
        if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
    ]
    return [o for o, _ in pairs], [g for _, g in pairs]


def _replay(
    plan: Plan, workload: Workload, steps: int, warmup: int, dev: torch.device, keep_grads: bool
) -> ReplayResult:
    """Warm up, measuring memory on one of its steps, then time ``steps`` steps and the speed reference after each."""
    # Before the model is split into stages: its units are captured as the profile captured them.
    reference: SpeedReference | UnitReference = _unit_reference(plan, workload, dev) or SpeedReference(dev)
    replayer = _Replayer(plan, workload, dev)
    bar = ProgressBar()
    try:
        warmup_steps = replayer.warmup_steps(warmup)
        phases = Phases(int(keep_grads) + warmup_steps + steps, "verify (replay)", bar)
        loss = grads = None
        if keep_grads:  # before the warm-up, without the step's tail: the weights stay those of a fresh model
            loss = replayer.step(None, tail=False).item()
            grads = _gathered_grads(workload.model, replayer.modules)
            replayer.optimizer.zero_grad(set_to_none=True)
            phases.end()
        stage_memory = replayer.warm_up(warmup_steps, phases.end)
        times: dict[str, list[list[float]]] = {k: [[] for _ in range(plan.num_stages)] for k in "FB"}
        step_s = []
        reference.warm_up()
        for _ in range(steps):
            _, dt = _timed(lambda: replayer.step(times), dev)
            step_s.append(dt)
            reference.time_once()
            phases.end()
    finally:
        bar.close()
    return ReplayResult(
        forward_s=tuple(statistics.median(t) for t in times["F"]),
        backward_s=tuple(statistics.median(t) for t in times["B"]),
        step_s=tuple(step_s),
        warmup_steps=warmup_steps,
        loss=loss,
        grads=grads,
        reference_s=reference.median_s,
        reference="units" if isinstance(reference, UnitReference) else "layer",
        stage_memory=stage_memory,
    )


class _Replayer:
    """The plan's stage modules in this process, its batch, optimizer and tied copies, and the step that runs
    every rank's actions in one order (:func:`merged_order`), one action at a time."""

    def __init__(self, plan: Plan, workload: Workload, dev: torch.device) -> None:
        self.plan, self.dev, self.loss_fn = plan, dev, workload.loss_fn
        self.n = n = plan.num_stages
        self.m = m = schedule_microbatches(plan)
        inputs, target = workload.make_batch(plan.global_batch_size)
        self.modules = [
            s.to(dev)
            for s in split_stages(
                workload.model, microbatch_inputs(plan, inputs), plan.split_points, [s.recompute for s in plan.stages]
            )
        ]
        self.batch = tuple(t.to(dev) for t in as_tuple(inputs))
        self.target = target.to(dev)
        mb_inputs = list(zip(*(t.chunk(m) for t in self.batch), strict=True))
        self.mb_targets = self.target.chunk(m)
        self.order = merged_order(rank_orders(plan.schedule, n, m, plan.num_ranks), n)
        params = list({id(p): p for module in self.modules for p in module.parameters()}.values())
        self.optimizer = make_optimizer(str(plan.constraints.get("optimizer", "adam")), params)
        self.stages = _Stages(plan, self.modules, mb_inputs, dev)
        self.tied = [
            [p for module in self.modules for name, p in module.original_named_parameters() if name in names]
            for names in tied_parameter_groups(workload.model)
        ]
        self.act: Callable[[int, str], Any] = lambda s, kind: contextlib.nullcontext()
        """Each action runs inside ``act(stage, category)``: the memory tracker's, in :meth:`tracked_step`."""
        self.last_raw_loss: torch.Tensor | None = None
        self.last_loss: torch.Tensor | None = None
        """The latest last-stage forward's loss and its share of the step's (over M), held until the next last-stage
        forward replaces them or the step ends: the measured memory counts them that long, and past a split
        backward's I the loss function's graph with them (cross-entropy's log-probabilities; torch's I lets it go)."""

    def step(self, times: dict[str, list[list[float]]] | None, tail: bool = True) -> torch.Tensor:
        """One step; ``times`` gets every stage's forward times (``F``) and each micro-batch's whole backward
        (``B``: its B, or its I and W added); without ``tail`` no tied sum, optimizer step or ``zero_grad``.
        Returns the step's loss (mean over micro-batches)."""
        losses: list[torch.Tensor] = []
        backward_s: dict[tuple[int, int], float] = {}
        for action in self.order:
            s, mb = action.stage, action.microbatch
            if action.kind == "F":
                dt = self._forward(s, mb, losses)
                if times is not None:
                    times["F"][s].append(dt)
                continue
            if action.kind == "B" or (action.kind == "I" and self.stages.whole_in_input[s]):
                dt = self._backward(s, mb)
            elif action.kind == "I":
                dt = self._input_gradient(s, mb)
            else:
                dt = self._weight_gradient(s, mb)
            backward_s[s, mb] = backward_s.get((s, mb), 0.0) + dt
        if times is not None:
            for (s, _), dt in sorted(backward_s.items()):
                times["B"][s].append(dt)
        self.stages.step_ended()
        if tail:
            self._tail()
        mean = torch.stack(losses).mean()
        self.last_raw_loss = self.last_loss = None
        return mean

    @property
    def memory_step(self) -> int:
        """Which warm-up step runs under the memory tracker: the first, as early as it holds what a later step
        holds; the second where tensors cross a cut on one rank, which only a step before it leaves behind."""
        return int(any(self.stages.local))

    def warmup_steps(self, warmup: int) -> int:
        """How many untimed steps :meth:`warm_up` runs for ``warmup`` asked: the memory step among them."""
        return max(warmup, self.memory_step + 1)

    def warm_up(self, count: int, ended: Callable[[], None]) -> tuple[MemorySample, ...]:
        """``count`` untimed steps (:meth:`warmup_steps`), step :attr:`memory_step` under the memory tracker;
        ``ended()`` after each. Returns :meth:`tracked_step`'s memory."""
        memory: tuple[MemorySample, ...] = ()
        for k in range(count):
            if k == self.memory_step:
                with untimed_on_every_core(self.dev.type):  # the timed steps run at the profile's threads
                    memory = self.tracked_step()
            else:
                self.step(None)
            ended()
        return memory

    def tracked_step(self) -> tuple[MemorySample, ...]:
        """One step under the memory tracker, untimed (its bookkeeping slows it): each stage's peak of live tensor
        bytes. The optimizer's state is made first where no step has made it, as a later step finds it."""
        _make_optimizer_state(self.optimizer)
        self.stages.make_buffers()
        tracker = _tracker(self.plan, self.modules, self.stages, self.optimizer, self.batch, self.target)
        act, handed = self.act, self.stages.handed
        self.act = tracker.acting
        self.stages.handed = lambda tensors, owner: [tracker.classify(t, "buffers", owner) for t in tensors]
        try:
            with tracker:
                self.step(None)
        finally:
            self.act, self.stages.handed = act, handed
        return tuple(tracker.peak(s) for s in range(self.n))

    def _forward(self, s: int, mb: int, losses: list[torch.Tensor]) -> float:
        """Stage ``s``'s forward of micro-batch ``mb``, the last stage's with its loss (added to ``losses``);
        returns its time."""
        stages, module = self.stages, self.modules[s]
        with self.act(s, "activations"):
            args = stages.forward(s, mb)
            out, dt = _timed(lambda: module(*args), self.dev)
            # The last stage's forward includes the loss, as the profile's last unit and torch's schedule
            # (right after the forward) have it: a large vocabulary's loss is a sizeable part of a step.
            if s == self.n - 1:
                raw, dl = _timed(lambda: self.loss_fn(out, self.mb_targets[mb]), self.dev)
                self.last_raw_loss = raw
                # torch's schedules keep every micro-batch's loss until the step ends (_internal_losses);
                # its split backward detaches it in place at I, so the loss keeps its storage, not its graph.
                stages.kept_losses.append(raw.detach())
                loss = raw / self.m
                self.last_loss = loss
                stages.loss[mb] = loss
                losses.append(loss.detach() * self.m)
                dt += dl
        stages.fwd[s, mb] = (out, args)
        return dt

    def _backward(self, s: int, mb: int) -> float:
        """Stage ``s``'s whole backward of micro-batch ``mb`` (its B, or the I of a stage that runs its whole
        backward there); returns its time."""
        stages = self.stages
        with self.act(s, "transient"):
            # The outputs stay referenced through the backward, as in torch's backward_one_chunk.
            out, args = stages.fwd.pop((s, mb))
            roots, grads = _backward_pairs(stages, s, mb, out)
            _, dt = _timed(partial(torch.autograd.backward, roots, grads if s < self.n - 1 else None), self.dev)
            stages.finished(s, out, mb)
            del out, roots, grads
            stages.hand_back(s, mb, args)
        return dt

    def _input_gradient(self, s: int, mb: int) -> float:
        """Stage ``s``'s input-gradient action I of micro-batch ``mb`` (torch's ``stage_backward_input``, its groups
        mended as a rank's are: profiles/weight_groups.py), what its W needs kept in ``stages.split``; returns its
        time."""
        stages = self.stages
        with self.act(s, "transient"):
            out, args = stages.fwd.pop((s, mb))
            roots, grads = _backward_pairs(stages, s, mb, out)
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if s == 0 or not leaves:  # torch's first stage runs no I: its W is the whole backward
                stages.split[s, mb] = (None, args, (roots, grads))
                dt = 0.0
            else:
                roots = [r.clone() if r._is_view() else r for r in roots]
                params = self.modules[s].parameters()
                groups, dt = _timed(partial(split_input_backward, roots, grads, leaves, params), self.dev)
                stages.split[s, mb] = (groups, args, (roots, grads) if s < self.n - 1 else None)
                stages.hand_back(s, mb, args)
            del out, roots, grads
        return dt

    def _weight_gradient(self, s: int, mb: int) -> float:
        """Stage ``s``'s weight-gradient action W of micro-batch ``mb`` (torch's ``stage_backward_weight``; the
        first stage's whole backward, which its I left to it); returns its time."""
        from torch.distributed.pipelining._backward import stage_backward_weight

        stages = self.stages
        with self.act(s, "transient"):
            groups, args, pending = stages.split.pop((s, mb), (None, (), None))
            if groups is not None:
                _, dt = _timed(partial(stage_backward_weight, self.modules[s].parameters(), groups), self.dev)
                if pending is not None:
                    stages.finished(s, pending[0], mb)
            elif pending is not None:
                roots, grads = pending
                _, dt = _timed(partial(torch.autograd.backward, roots, grads if s < self.n - 1 else None), self.dev)
                stages.finished(s, roots, mb)
                stages.hand_back(s, mb, args)
                del roots, grads
            else:
                dt = 0.0  # a recomputing stage ran its whole backward in I
            del groups, args, pending
        return dt

    def _tail(self) -> None:
        """The step's tail, untimed: the tied copies summed, the optimizer stepped, the gradients let go."""
        with torch.no_grad():
            for copies in self.tied:
                held = [p for p in copies if p.grad is not None]
                if len(held) > 1:
                    total = held[0].grad
                    for p in held[1:]:
                        total.add_(p.grad)
                    for p in held[1:]:
                        p.grad.copy_(total)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _unit_reference(plan: Plan, workload: Workload, dev: torch.device) -> UnitReference | None:
    """The model's units (:func:`captured_units`) as the replay's speed reference; None without them."""
    captured = captured_units(plan, workload, dev)
    return None if captured is None else UnitReference(captured[0], dev, workload.loss_fn, captured[1])


def _tracker(
    plan: Plan,
    modules: list[Any],
    stages: _Stages,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, ...],
    target: torch.Tensor,
) -> LiveBytes:
    """The memory tracker of a replayed step, with what exists before it registered stage by stage."""
    tracker = LiveBytes()
    owner: dict[int, int] = {}
    for s, module in enumerate(modules):
        tracker.register(module.parameters(), s, "weights")
        tracker.register(module.buffers(), s, "weights")
        for p in module.parameters():
            owner.setdefault(id(p), s)
    for s in range(plan.num_stages):
        tracker.register([t for ts in stages.recv[s].values() for t in ts], s, "buffers")
        tracker.register([t for ts in stages.grad_recv[s].values() for t in ts if t is not None], s, "buffers")
    tracker.register(batch, 0, "buffers")
    tracker.register([target], plan.num_stages - 1, "buffers")
    params = [p for module in modules for p in module.parameters()]
    tracker.watch_grads(params, lambda p: owner.get(id(p)))
    tracker.watch_optimizer(optimizer, lambda p: owner.get(id(p)))
    return tracker


def _make_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give ``optimizer`` the state a step makes (Adam's moments, SGD's momentum) without moving a weight: one
    step on zero gradients, which both optimizers as :func:`make_optimizer` builds them (no weight decay) leave
    every parameter unchanged by."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if all(p in optimizer.state for p in params):
        return
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _gathered_grads(model: nn.Module, modules: list[Any]) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}
    for module in modules:
        for name, p in module.original_named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().cpu().clone()
    # Copies of a tied parameter each hold their stage's share: the model's gradient is their sum.
    for names in tied_parameter_groups(model):
        present = {id(g): g for n, g in grads.items() if n in names}
        total = torch.stack(list(present.values())).sum(0) if present else None
        for name in names:
            if total is not None:
                grads[name] = total
    return grads
