"""Timing a set of pieces in round-robin rounds until their medians are stable (docs/fidelity-profile.md).

A round times every piece once. Round-robin spreads a load spike of a few seconds on a shared machine
over one sample of many pieces instead of every sample of one piece. Rounds go on past the minimum
until the median of each watched total (the unit sum) is known to within ``stable_within``: its standard
error, estimated from the spread of the rounds' totals, is at most that fraction of it
(:func:`median_error`); and stop at the maximum either way.

Also here, the two reference pieces the unit sum is checked against:

- ``whole_piece``: the whole model along the units' own code path. With export capture the units are
  pieces of torch's ``pipeline()`` split of the exported graph (what ``apply_plan`` runs), so the whole
  model is the same graph exported as ONE piece (no split points); the eager model is not comparable (it runs
  other code, at another speed, than the exported pieces the runtime runs).
  With hooks capture the units are eager modules, so the whole model is the eager model.
- ``overhead_piece``: a trivial piece (one multiply) timed through the same harness: the fixed cost
  each timed piece pays once (module call, autograd launch, timers) that a stage of several units
  pays once, not once per unit.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from planner.errors import UsageError
from profiles.dataflow import Capture, Edge, Piece, capture_export
from profiles.measure import PieceMeasurement
from profiles.measure_settings import MIN_TIME_S

__all__ = [
    "WHOLE_PATHS",
    "Timing",
    "Measurements",
    "Rounds",
    "whole_piece",
    "overhead_piece",
    "median_measurement",
    "median_error",
    "measure_rounds",
    "measure_parts_in_rounds",
    "MIN_TIME_S",
    "MAX_ROUNDS",
    "SPLIT_ROUNDS",
    "SPREAD_ROUNDS",
]

WHOLE_PATHS = {
    "export": "exported as one piece",
    "hooks": "eager model",
    "meta": "not measured: a meta profile holds one unit at a time; whole_model is the unit sum",
}
"""How the whole model was run, by capture mode, or ``meta`` (recorded in ``settings.whole_model_path``)."""


@dataclass(frozen=True)
class Timing:
    """How many round-robin rounds to time (see :func:`profiles.rounds.measure_rounds`)."""

    repeats: int
    """The minimum number of rounds."""
    max_repeats: int
    """The maximum: rounds go on past ``repeats`` until the median unit sum is stable."""
    warmup: int
    """Untimed iterations of each piece before its first timed one."""
    stable_within: float
    """The median unit sum counts as stable once its standard error is at most this fraction of it."""
    min_time_s: float = 0.0
    """Rounds also go on, past ``max_repeats`` if need be, until this much wall time has passed (at most
    :data:`MAX_ROUNDS`): see :data:`MIN_TIME_S`."""


MAX_ROUNDS = 1000
"""Rounds at most, whatever the time floor: the medians of a model of tiny units need no more."""
SPLIT_ROUNDS = 3
"""Rounds that time each unit's backward split into I and W as well (the first ones): a split costs another forward
and backward, and what the profile keeps of it is its ratio to the whole backward (:func:`median_measurement`),
which moves little from round to round."""
SPREAD_ROUNDS = 5
"""Rounds before their spread may judge a median stable: the MAD of three or four values is often near 0
by chance, and would call a median known to a fraction of a percent that the next rounds move by tens."""


@dataclass(frozen=True)
class Measurements:
    """What one profiling path measured, at every micro-batch size, for the profile to be assembled from."""

    units: tuple[tuple[PieceMeasurement, ...], ...]
    """Per size, per unit."""
    flops: tuple[tuple[int, ...], ...]
    """Per size, per unit: forward multiply-adds."""
    whole: tuple[PieceMeasurement, ...] | None
    """Per size, the whole model; None when it was not measured (a meta profile never holds it whole)."""
    overhead: tuple[PieceMeasurement, ...]
    rounds: tuple[int, ...]
    """Rounds run, per size (a meta profile: the most any unit needed)."""
    edges: tuple[tuple[Edge, ...], ...]
    """Per size, the tensors passed between units."""
    ownership: tuple[tuple[int, int, tuple[str, ...], int, int], ...]
    """Per unit: :func:`profiles.dataflow.param_ownership`."""
    mode: str
    """The capture mode: ``export`` or ``hooks``."""
    export_error: str = ""
    """Why export failed, when the units were timed by hooks."""
    reference_s: float | None = None
    """Median forward+backward of the speed reference, timed once per round (profiles/reference.py); None
    for a meta profile."""
    resume: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...] | None = None
    """Per size, the whole model's (forward, backward) extras after each idle gap (profiles/resume.py); None
    for a meta profile."""
    thread_factors: tuple[tuple[float, ...], ...] | None = None
    """Per size, the whole model at each of ``thread_counts`` / as profiled (profiles/threads.py); None off a
    CPU and for a meta profile."""
    unit_sum_ratio: tuple[float, ...] | None = None
    """Per size, the median over rounds of the unit sum over the whole model timed in the same round; None where
    the two were not timed apart (a meta profile, a one-unit export) or the units' times are not the rounds'
    (timed in context)."""
    unit_sum_ratio_error: tuple[float, ...] | None = None
    """Per size, the standard error of ``unit_sum_ratio`` (:func:`median_error`), where it is given."""
    rounds_s: float | None = None
    """Wall time of the shared rounds, every size together; None for a meta profile."""
    after_rounds_s: float | None = None
    """Wall time after the rounds: the whole model after a wait and at other thread counts, every size, and the
    speed reference at those counts; None for a meta profile."""
    thread_counts: tuple[int, ...] = ()
    thread_reference_s: tuple[float, ...] = ()
    """The speed reference at each of ``thread_counts``."""
    cores: int | None = None
    """The machine's cores, where ``thread_counts`` were timed (the threads a single rank gets)."""
    unit_timing: dict[str, Any] | None = None
    """How the units' forward and backward times were measured, where not one unit at a time: on CUDA, in
    context (profiles/in_context.py), with the markers' cost per size; None: each unit alone."""
    loss_bytes: tuple[tuple[int, int], ...] | None = None
    """Per size, ``(target bytes, bytes the loss's output keeps)`` (profiles/loaded_profile.py ``loss_memory``); None
    for a meta profile."""


def whole_piece(model: nn.Module, inputs: tuple, capture: Capture, units: Sequence[str]) -> Piece:
    """The whole model as one piece measured along the units' code path (see the module docstring).

    A one-unit export capture already is the model as one piece: it is returned as it is, so unit sum
    and whole model are the same measurement.
    """
    if capture.mode == "hooks":
        return Piece("<model>", model, inputs, tuple(False for _ in inputs))
    if len(capture.pieces) == 1:
        return capture.pieces[0]
    # One unit means no split points: the whole forward as a single piece, cut from the units' own trace.
    piece = capture_export(model, inputs, list(units[:1])).pieces[0]
    return replace(piece, name="<model>")


class _Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


class _Holder(nn.Module):
    """Multiplies, then calls a child: split before the child, the first piece holds only the multiply."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = _Scale()  # names the first piece; not called
        self.unit = _Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unit(x * 1.0)


def overhead_piece(mode: str, device: torch.device) -> Piece:
    """A one-multiply piece on a 1x1 input that needs grad, built like the units of ``mode``.

    Export units are GraphModules from ``pipeline()``, hooks units eager modules: the trivial piece is
    of the same kind, so it pays the same call overhead. The export piece holds the multiply at its
    top level: a nested module call (measured here: 75 us each) is inside every unit and inside the
    whole model alike, so it is not overhead of timing a piece.
    """
    x = torch.zeros(1, 1, device=device)
    if mode == "hooks":
        return Piece("<overhead>", _Scale(), (x,), (True,))
    piece = capture_export(_Holder(), (x,), ["pre", "unit"]).pieces[0]
    return Piece("<overhead>", piece.module, (x,), (True,))


def median_measurement(samples: Sequence[PieceMeasurement]) -> PieceMeasurement:
    """Median forward and backward time over rounds; bytes from the first round (they do not vary).

    I and W are timed in the first rounds alone (:data:`SPLIT_ROUNDS`): each is the median, over the rounds that
    timed it, of its ratio to the whole backward timed seconds before it, times the backward's median over every
    round. A ratio of two times taken together holds while the machine's speed moves; their medians apart would
    carry how fast the machine ran in those rounds against the rest."""
    backward_s = statistics.median(m.backward_s for m in samples)
    split = [m for m in samples if m.backward_s > 0 and m.backward_input_s + m.backward_weight_s > 0]

    def share(part: Callable[[PieceMeasurement], float]) -> float:
        return statistics.median(part(m) / m.backward_s for m in split) * backward_s if split else 0.0

    return replace(
        samples[0],
        forward_s=statistics.median(m.forward_s for m in samples),
        backward_s=backward_s,
        backward_input_s=share(lambda m: m.backward_input_s),
        backward_weight_s=share(lambda m: m.backward_weight_s),
    )


@dataclass(frozen=True)
class Rounds:
    medians: tuple[PieceMeasurement, ...]
    """Per piece, the median over every round."""
    rounds: int
    watched: tuple[float, ...] = ()
    """Per watched group, the median over every round of its total (over piece ``per``'s, where given)."""
    watched_error: tuple[float, ...] = ()
    """Per watched group, how well ``watched`` is known: :func:`median_error` of its rounds."""
    seconds: float = 0.0
    """Wall time from the first round's start to this part's last round's end."""


def _total(row: Sequence[PieceMeasurement], group: Sequence[int], per: int | None = None) -> float:
    """The group's forward+backward in one round; over piece ``per``'s in the same round where given."""
    total = sum(row[i].forward_s + row[i].backward_s for i in group)
    if per is None:
        return total
    denominator = row[per].forward_s + row[per].backward_s
    return total / denominator if denominator > 0 else total


def median_error(samples: Sequence[float]) -> float:
    """The standard error of the samples' median, as a fraction of it: sqrt(pi / 2) * sigma / sqrt(n), the
    sample median's asymptotic standard deviation 1 / (2 f(m) sqrt(n)) for normal samples, with sigma
    estimated as 1.4826 x the median absolute deviation (Rousseeuw and Croux, JASA 1993), so that a round
    caught in a load spike widens it no more than any other outlier.

    A stop rule on how far the median moved in one round suits samples taken back to back, which share a moment
    of the machine; samples spread over the whole profile in shared rounds do not, and their median keeps moving
    round after round. The standard error says how well the median is known, whichever way the samples were
    taken.
    """
    median = statistics.median(samples)
    if median <= 0:
        return 0.0
    mad = statistics.median(abs(x - median) for x in samples)
    return math.sqrt(math.pi / 2) * 1.4826 * mad / math.sqrt(len(samples)) / median


def _stable(totals: Sequence[float], within: float) -> bool:
    return len(totals) >= SPREAD_ROUNDS and median_error(totals) <= within


def measure_rounds(
    count: int,
    measure: Callable[[int, int], PieceMeasurement],
    *,
    watch: Sequence[Sequence[int]],
    min_rounds: int,
    max_rounds: int,
    stable_within: float,
    min_time_s: float = 0.0,
    on_extra_round: Callable[[], None] = lambda: None,
    on_done: Callable[[int], None] = lambda _: None,
) -> Rounds:
    """Call ``measure(piece_index, round)`` for every piece, round after round.

    At least ``min_rounds`` rounds and at most ``max_rounds``; in between, stop once, for every index group
    in ``watch``, the median of the group's per-round totals is stable (:func:`median_error` at most
    ``stable_within``, over at least :data:`SPREAD_ROUNDS` rounds). Either way, go on until the rounds
    span ``min_time_s`` (at most :data:`MAX_ROUNDS`). A progress bar's total is known from the start as the most
    rounds, ``max_rounds``: ``on_done(rounds)`` says how many were taken (the caller shrinks its bar by the rest),
    and ``on_extra_round`` runs before each round past ``max_rounds``, which only the time floor asks for (the
    caller grows it).
    """
    (done,) = measure_parts_in_rounds(
        [count],
        lambda _, i, r: measure(i, r),
        watch=[watch],
        min_rounds=min_rounds,
        max_rounds=max_rounds,
        stable_within=stable_within,
        min_time_s=min_time_s,
        on_extra_round=lambda _: on_extra_round(),
        on_done=lambda _, rounds: on_done(rounds),
    )
    return done


def measure_parts_in_rounds(
    counts: Sequence[int],
    measure: Callable[[int, int, int], PieceMeasurement],
    *,
    watch: Sequence[Sequence[Sequence[int]]],
    min_rounds: int,
    max_rounds: int,
    stable_within: float,
    min_time_s: float = 0.0,
    on_extra_round: Callable[[int], None] = lambda _: None,
    on_done: Callable[[int, int], None] = lambda _, __: None,
    per: Sequence[int | None] | None = None,
    order: Sequence[Sequence[int]] | None = None,
) -> list[Rounds]:
    """:func:`measure_rounds` for several parts at once (a model at each micro-batch size) in shared rounds:
    ``measure(part, piece_index, round)``, ``watch[part]`` its groups, ``counts[part]`` its pieces;
    ``on_extra_round(part)`` and ``on_done(part, rounds)`` as there.

    ``per[part]``: a piece whose time in the same round divides each of the part's group totals before their
    median is judged (the units' sum over the whole model's: a ratio of two times taken seconds apart, which holds
    while the machine's speed moves, where either time alone moves with it); None: the totals themselves.
    ``order[part]``: the order a round visits the part's pieces in (None: by index), e.g. the whole model between
    the two halves of its units, so that a speed drifting steadily through the round moves both sides alike.

    Each round visits every part still going, starting one part later each round, so that a slow spell of
    the machine falls on every part alike; a part leaves the rounds once it is done by the rules above, the
    rounds spanning ``min_time_s`` counted from the first.
    """
    started = time.perf_counter()
    rows: list[list[list[PieceMeasurement]]] = [[] for _ in counts]
    per = per or [None] * len(counts)
    orders = [range(c) for c in counts] if order is None else order
    if any(sorted(o) != list(range(c)) for o, c in zip(orders, counts, strict=True)):
        raise UsageError("each part's order must visit each of its pieces once")
    totals: list[list[list[float]]] = [[[] for _ in groups] for groups in watch]
    done: list[Rounds | None] = [None] * len(counts)
    turn = 0
    while going := [p for p, d in enumerate(done) if d is None]:
        first = turn % len(going)
        turn += 1
        for p in going[first:] + going[:first]:
            r = len(rows[p])
            if r >= max_rounds:
                on_extra_round(p)
            taken = {i: measure(p, i, r) for i in orders[p]}
            row = [taken[i] for i in range(counts[p])]
            rows[p].append(row)
            for t, group in zip(totals[p], watch[p], strict=True):
                t.append(_total(row, group, per[p]))
            stable = r + 1 >= min_rounds and all(_stable(t, stable_within) for t in totals[p])
            spanned = time.perf_counter() - started >= min_time_s
            if ((r + 1 >= max_rounds or stable) and spanned) or r + 1 >= MAX_ROUNDS:
                medians = [median_measurement([row[i] for row in rows[p]]) for i in range(counts[p])]
                done[p] = Rounds(
                    tuple(medians),
                    r + 1,
                    tuple(statistics.median(t) for t in totals[p]),
                    tuple(median_error(t) for t in totals[p]),
                    time.perf_counter() - started,
                )
                on_done(p, r + 1)
    return [d for d in done if d is not None]
