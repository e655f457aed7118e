"""Replay a plan in one process: every stage's forward and backward actions, timed one by one.

For one device holding several stages, or a CPU with fewer cores than the plan has ranks, where
running the ranks side by side would measure contention rather than the plan. The real stage modules
run on real tensors handed from stage to stage; actions follow each rank's order from
:func:`planner.schedule.orders.rank_orders`, interleaved across ranks as their dependencies allow. A
zero-bubble ``I`` action runs the full backward and its ``W`` is skipped (the split does not change
the sum). The caller turns the measured per-stage times into an iteration with the simulator.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import ExecutionError
from planner.plan import Plan
from planner.runtime.apply import microbatch_inputs, schedule_microbatches, split_stages, tied_parameter_groups
from planner.schedule.orders import Step, rank_orders
from profiles.reference import SpeedReference
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
    loss: float | None = None
    """Loss of the first step (mean over micro-batches), when ``keep_grads`` was asked."""
    grads: dict[str, torch.Tensor] | None = None
    """Gradients of the first step by original FQN, tied copies summed."""
    reference_s: float | None = None
    """Median forward+backward of the speed reference (profiles/reference.py), timed after each step."""


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
    """Run ``warmup + steps`` iterations of ``plan`` in this process and time every stage's actions.

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
    restored after. A profile made with ``--ranks 2`` on 2 cores times each unit on 1 thread; replayed on 2,
    gpt2-small's stages ran 43-45 % under their prediction."""
    threads = plan.profile_threads
    if dev.type != "cpu" or threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _replay(
    plan: Plan, workload: Workload, steps: int, warmup: int, dev: torch.device, keep_grads: bool
) -> ReplayResult:
    n = plan.num_stages
    m = schedule_microbatches(plan)
    inputs, target = workload.make_batch(plan.global_batch_size)
    modules = [
        s.to(dev)
        for s in split_stages(
            workload.model, microbatch_inputs(plan, inputs), plan.split_points, [s.recompute for s in plan.stages]
        )
    ]
    mb_inputs = list(zip(*(t.to(dev).chunk(m) for t in as_tuple(inputs)), strict=True))
    mb_targets = target.to(dev).chunk(m)
    order = merged_order(rank_orders(plan.schedule, n, m, plan.num_ranks), n)

    def one_step(times: dict[str, list[list[float]]] | None) -> torch.Tensor:
        for module in modules:
            module.zero_grad(set_to_none=True)
        ins: dict[tuple[int, int], tuple[Any, ...]] = {}
        outs: dict[tuple[int, int], Any] = {}
        losses: list[torch.Tensor] = []
        for step in order:
            s, mb = step.stage, step.microbatch
            if step.kind == "F":
                args = mb_inputs[mb] if s == 0 else tuple(_leaf(v) for v in as_tuple(outs[s - 1, mb]))
                ins[s, mb] = args
                # The last stage's forward includes the loss, as the profile's last unit and torch's schedule
                # (right after the forward) have it: a 50k-word LM head's loss is 5-10 % of a GPT-2 step.
                if s == n - 1:
                    out, dt = _timed(lambda: workload.loss_fn(modules[s](*args), mb_targets[mb]), dev)  # noqa: B023
                    losses.append(out.detach())
                else:
                    out, dt = _timed(lambda: modules[s](*args), dev)  # noqa: B023 - run at once
                outs[s, mb] = out
            elif step.kind in "BI":
                if s == n - 1:
                    pairs = [(outs[s, mb] / m, None)]
                else:
                    nxt = ins[s + 1, mb]
                    pairs = [
                        (o, g.grad)
                        for o, g in zip(as_tuple(outs[s, mb]), nxt, strict=True)
                        if isinstance(o, torch.Tensor) and o.requires_grad and g.grad is not None
                    ]
                tensors = [o for o, _ in pairs]
                grads = [g for _, g in pairs]
                _, dt = _timed(lambda: torch.autograd.backward(tensors, grads if s < n - 1 else None), dev)  # noqa: B023
            else:
                continue
            if times is not None:
                times["F" if step.kind == "F" else "B"][s].append(dt)
        return torch.stack(losses).mean()

    loss = grads = None
    if keep_grads:
        loss = one_step(None).item()
        grads = _gathered_grads(workload.model, modules)
    for _ in range(warmup):
        one_step(None)
    times: dict[str, list[list[float]]] = {"F": [[] for _ in range(n)], "B": [[] for _ in range(n)]}
    step_s = []
    reference = SpeedReference(dev)
    reference.warm_up()
    for _ in range(steps):
        _, dt = _timed(lambda: one_step(times), dev)
        step_s.append(dt)
        reference.time_once()
    return ReplayResult(
        forward_s=tuple(statistics.median(t) for t in times["F"]),
        backward_s=tuple(statistics.median(t) for t in times["B"]),
        step_s=tuple(step_s),
        loss=loss,
        grads=grads,
        reference_s=reference.median_s,
    )


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
