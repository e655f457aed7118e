"""What an action costs after its rank has waited: the whole model's forward and backward after an idle gap.

The profiler times every piece back to back, as a warm loop runs it. A pipeline rank runs each action after
a wait for its input or gradient, and an action after a wait runs longer, by an amount that grows with the wait
and levels off within about 10 ms (``python benchmarks/bench_runtime_probes.py --only resume`` measures it). A
sleep and a busy wait of the same length cost about the same, and so does a large memory write before the step:
that points at caches and predictors refilled, not at a core waking up. It is measured here on the whole model,
once per size: the refill is mostly the code path (the model's units run the same kernels), so a stage pays
about the whole model's extra, not the sum of its units' (which is several times larger).

The simulator adds, to each action, the extra interpolated at the idle time before it on its rank
(docs/cost-model.md, "Resuming after a wait").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from profiles.dataflow import Piece
from profiles.measure import backward_roots, fresh_args, sync_device

__all__ = ["RESUME_GAPS_S", "MAX_STEP_S", "measure_resume"]

RESUME_GAPS_S = (0.001, 0.003, 0.01)
"""Idle gaps measured: below 1 ms the extra is small next to an action; by 10 ms it has levelled off."""
MAX_STEP_S = 0.5
"""A step longer than this is not measured (its extras are recorded as 0): an extra of about a millisecond is
under 0.2 % of such a step, and the rounds would cost seconds each."""
_MIN_ROUNDS = 5
_MIN_TIME_S = 0.5
_MAX_ROUNDS = 40


def measure_resume(
    piece: Piece,
    *,
    device: torch.device,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None,
    target: torch.Tensor | None,
    step_s: float,
    gaps_s: tuple[float, ...] = RESUME_GAPS_S,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per gap in ``gaps_s``: how much longer ``piece``'s forward and its backward take after that long
    idle than back to back (medians over interleaved rounds, never below 0). ``step_s``: its forward +
    backward as profiled, to skip a step over :data:`MAX_STEP_S`."""
    zeros = tuple(0.0 for _ in gaps_s)
    if step_s > MAX_STEP_S:
        return zeros, zeros
    args = fresh_args(piece)

    def forward() -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        return backward_roots(piece.module(*args, **piece.kwargs), loss_fn, target)

    def timed_pair(gap: float) -> tuple[float, float]:
        if gap:
            time.sleep(gap)
        sync_device(device)
        t0 = time.perf_counter()
        roots, grads = forward()
        sync_device(device)
        forward_s = time.perf_counter() - t0
        if gap:
            time.sleep(gap)
        t1 = time.perf_counter()
        if roots:
            torch.autograd.backward(roots, grads)
        sync_device(device)
        return forward_s, time.perf_counter() - t1

    all_gaps = (0.0, *gaps_s)
    samples: dict[float, list[tuple[float, float]]] = {g: [] for g in all_gaps}
    timed_pair(0.0)  # warm: the profiler ran other pieces just before
    started, rounds = time.perf_counter(), 0
    while rounds < _MAX_ROUNDS and (rounds < _MIN_ROUNDS or time.perf_counter() - started < _MIN_TIME_S):
        for gap in all_gaps:
            samples[gap].append(timed_pair(gap))
        rounds += 1
    base_f = statistics.median(f for f, _ in samples[0.0])
    base_b = statistics.median(b for _, b in samples[0.0])
    forward_extra = tuple(max(0.0, statistics.median(f for f, _ in samples[g]) - base_f) for g in gaps_s)
    backward_extra = tuple(max(0.0, statistics.median(b for _, b in samples[g]) - base_b) for g in gaps_s)
    return forward_extra, backward_extra
