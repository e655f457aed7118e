"""How a CPU profile's times change with the threads a rank gets, so that a plan for P ranks uses them.

On a CPU each of P ranks on one machine runs with ``cores // P`` intra-op threads (planner/runtime/launch.py),
while a profile is timed with however many threads its process had. A unit's time depends on its threads
(with half the cores it can take nearly twice as long), so a profile timed with every core would predict each
stage of a 2-rank pipeline, whose ranks have half the cores each, too fast.

The profiler therefore also times the whole model, and the speed reference, at every thread count a rank of a
pipeline on this machine can get (``cores // P`` for P = 2, 4, ...), interleaved with the profiled count in one run
(a ratio measured in one run holds while the machine's speed moves), and records the ratio per micro-batch size.
``Profile.at_threads`` scales the units by it: one factor for every unit, since the units run the same kernels as
the model they make up. A single rank's count (all the cores) is timed only where it is the profiled one: a single
rank is no pipeline, and on 2 cores its count took gpt2-small's profile about 40 s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from profiles.cores import intra_op_threads
from profiles.dataflow import Piece
from profiles.measure import backward_roots, fresh_args, sync_device
from profiles.reference import SpeedReference

__all__ = [
    "rank_thread_counts",
    "profiled_thread_counts",
    "measure_thread_scaling",
    "measure_reference_at",
    "plausible",
    "MAX_STEP_S",
    "SLACK",
]

MAX_STEP_S = 2.0
"""A whole-model step longer than this is timed fewer times (3 rounds): its ratio needs no more."""
_MIN_ROUNDS = 3
_MIN_TIME_S = 0.5
_MAX_ROUNDS = 20


def rank_thread_counts(cores: int, max_ranks: int = 64, *, fewest_ranks: int = 1) -> tuple[int, ...]:
    """The intra-op threads a rank of a P-rank pipeline on ``cores`` cores gets, for P = ``fewest_ranks``, twice
    that, ... up to ``max_ranks``: ``cores // P`` (at least 1), largest first."""
    counts, ranks = [], fewest_ranks
    while ranks <= max_ranks:
        counts.append(max(1, cores // ranks))
        if counts[-1] == 1:
            break
        ranks *= 2
    return tuple(sorted(set(counts), reverse=True))


def profiled_thread_counts(cores: int, profiled: int) -> tuple[int, ...]:
    """The counts a CPU profile times the whole model at: each rank's of a pipeline of 2 ranks or more
    (:func:`rank_thread_counts`), and the profiled one, largest first."""
    return tuple(sorted({*rank_thread_counts(cores, fewest_ranks=2), profiled}, reverse=True))


def measure_thread_scaling(
    piece: Piece,
    *,
    device: torch.device,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None,
    target: torch.Tensor | None,
    step_s: float,
    thread_counts: Sequence[int],
    min_time_s: float = _MIN_TIME_S,
) -> tuple[float, ...]:
    """Per count in ``thread_counts``: ``piece``'s forward + backward with that many threads / with the threads
    it has now (medians over rounds that visit every count in turn; 1.0 for the current count)."""
    profiled = torch.get_num_threads()
    args = fresh_args(piece)

    def step() -> float:
        sync_device(device)
        started = time.perf_counter()
        roots, grads = backward_roots(piece.module(*args, **piece.kwargs), loss_fn, target)
        if roots:
            torch.autograd.backward(roots, grads)
        sync_device(device)
        return time.perf_counter() - started

    counts = [profiled, *(c for c in thread_counts if c != profiled)]
    samples: dict[int, list[float]] = {c: [] for c in counts}
    long = step_s > MAX_STEP_S
    for count in counts if not long else ():
        # One untimed step at each count: thread pools resize on first use, which a long step does not notice.
        with intra_op_threads(count):
            step()
    enough = _MIN_ROUNDS if long else _MAX_ROUNDS
    started, rounds = time.perf_counter(), 0
    while rounds < enough and (rounds < _MIN_ROUNDS or time.perf_counter() - started < min_time_s):
        for count in counts:
            with intra_op_threads(count):
                samples[count].append(step())
        rounds += 1
    base = statistics.median(samples[profiled])
    return tuple(
        plausible(statistics.median(samples[c]) / base, c, profiled) if c != profiled else 1.0 for c in thread_counts
    )


SLACK = 1.25
"""How far past perfect scaling (or no scaling at all) a measured ratio may go before it is taken for noise."""


def plausible(ratio: float, threads: int, profiled: int) -> float:
    """``ratio`` (time with ``threads`` / with ``profiled`` threads) within what threads can do: with fewer, at
    least as slow (less ``SLACK``) and at most ``profiled / threads`` slower (more ``SLACK``); with more, the
    mirror. On a busy machine threads that spin for a core can make a step many times slower with more threads
    than with fewer: such a ratio is clamped, not believed."""
    if threads < profiled:
        low, high = 1.0 / SLACK, SLACK * profiled / threads
    else:
        low, high = profiled / threads / SLACK, SLACK
    return min(high, max(low, ratio))


def measure_reference_at(device: torch.device, thread_counts: Sequence[int], rounds: int = 15) -> tuple[float, ...]:
    """The speed reference's median at each of ``thread_counts`` (interleaved rounds), so that a run on ranks
    with those threads compares with the profile at equal threads."""
    references = {c: SpeedReference(device) for c in thread_counts}
    for count, reference in references.items():
        with intra_op_threads(count):
            reference.warm_up()
    for _ in range(rounds):
        for count, reference in references.items():
            with intra_op_threads(count):
                reference.time_once()
    medians = [references[c].median_s for c in thread_counts]
    return tuple(float(m) if m is not None else 0.0 for m in medians)
