"""Profiling a model held whole on the device: at every micro-batch size its units, the whole model and
the overhead piece are captured (:mod:`profiles.dataflow`), then timed together in shared round-robin rounds.

The counterpart of :mod:`profiles.meta_profile`, which holds one unit at a time; both return the
:class:`profiles.rounds.Measurements` that :func:`profiles.profiler.profile_model` assembles into a profile.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from planner.errors import ProfilingError
from profiles.cores import untimed_on_every_core
from profiles.dataflow import Capture, Edge, Piece, capture_export, capture_hooks, param_ownership
from profiles.in_context import time_in_context
from profiles.measure import WARM_BELOW_S, PieceMeasurement, count_flops, measure_piece
from profiles.reference import SpeedReference
from profiles.resume import measure_resume
from profiles.rounds import (
    SPLIT_ROUNDS,
    Measurements,
    Rounds,
    Timing,
    measure_parts_in_rounds,
    overhead_piece,
    whole_piece,
)
from profiles.threads import measure_reference_at, measure_thread_scaling, profiled_thread_counts
from profiles.workload import Workload

__all__ = ["measure_loaded", "loss_memory", "SizeRun"]

log = logging.getLogger("pipeplan")

IN_CONTEXT_DEVICES = ("cuda",)
"""Where the units' times are taken in context (profiles/in_context.py). On a CPU, timed one at a time, the units
of gpt2-small sum to within 2.2 % of the whole model, and a pipeline stage there runs at the threads the profile
timed each unit with: the CPU keeps that."""

Batch = Callable[[int], tuple[tuple[Any, ...], Any]]
"""``batch(b)``: a micro-batch of ``b`` samples, inputs and target, on the profiling device."""


def _capture(model: nn.Module, inputs: tuple, units: list[str], mode: str | None) -> tuple[Capture, str]:
    """Split by export unless it already failed; returns the capture and why export failed (or "")."""
    if mode != "hooks":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return capture_export(model, inputs, units), ""
        except ProfilingError:
            raise
        except Exception as exc:  # untraceable model: fall back to hooks, and say so
            if mode == "export":
                raise ProfilingError(f"splitting the model failed: {type(exc).__name__}: {exc}") from None
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            log.info("torch.export cannot split this model (%s); timing units by hooks", reason)
            return capture_hooks(model, inputs, units), reason
    return capture_hooks(model, inputs, units), ""


@dataclass(frozen=True)
class SizeRun:
    """One micro-batch size, captured and ready to time: each round times ``pieces`` (the units, the whole
    model unless a one-unit export already is it, the overhead piece) in order."""

    b: int
    cap: Capture
    target: Any
    pieces: tuple[Piece, ...]
    whole_index: int

    @property
    def units(self) -> int:
        return len(self.cap.pieces)

    @property
    def whole_apart(self) -> bool:
        """Whether the whole model is a piece of its own (not a one-unit export, whose unit is the whole model)."""
        return self.whole_index >= self.units


def _size_run(cap: Capture, model: nn.Module, inputs: tuple, target: Any, b: int, dev: torch.device) -> SizeRun:
    n = len(cap.pieces)
    whole = whole_piece(model, inputs, cap, [p.name for p in cap.pieces])
    shared = whole is cap.pieces[0] and n == 1  # a one-unit export: the unit is the whole model
    pieces = (*cap.pieces, *(() if shared else (whole,)), overhead_piece(cap.mode, dev))
    return SizeRun(b, cap, target, pieces, n - 1 if shared else n)


def _whole_in_the_middle(run: SizeRun, flops: Sequence[int]) -> list[int]:
    """The order a round times ``run``'s pieces in: the units up to half their FLOPs, the whole model, the other
    units, the overhead piece. A speed that drifts steadily through the round then moves the unit sum and the
    whole model alike, and their ratio holds; timed after all the units, the whole model alone takes the drift."""
    n = run.units
    if not run.whole_apart:
        return list(range(len(run.pieces)))
    half, total, k = 0, sum(flops), 0
    while k < n and 2 * (half + flops[k]) <= total:
        half += flops[k]
        k += 1
    return [*range(k), run.whole_index, *range(k, n), *range(run.whole_index + 1, len(run.pieces))]


def _time_sizes(
    runs: Sequence[SizeRun],
    workload: Workload,
    dev: torch.device,
    bar: Any,
    timing: Timing,
    reference: SpeedReference,
    flops: Sequence[Sequence[int]],
) -> list[Rounds]:
    """Time every size's pieces in shared round-robin rounds (:func:`profiles.rounds.measure_parts_in_rounds`:
    each round visits every size still going, starting one size later each round); the speed reference once per
    size per round.

    A slow spell of the machine then falls on every size alike, and the ratio between sizes, which picks the
    micro-batch size, holds. Timed one size after another, a slow spell over gpt2-small's 4 rounds at b = 2 made
    it 1.3-1.6x slower per sample than b = 1 and 4, and the plan took a size its run did not bear out
    (docs/fidelity-profile.md). A size leaves the rounds once the median of its unit sum over the whole model,
    paired in each round, is known to within ``timing.stable_within`` (:func:`profiles.rounds.median_error`).
    Only the first round measures bytes (an untimed probe of each piece); each later round times every piece
    once, right after an untimed iteration of it where the piece is short (:data:`profiles.measure.WARM_BELOW_S`),
    else at once, as a stage runs each unit after the one before.
    """
    # The most rounds from the start, shrunk as each size ends sooner: a total that only grows would make an ETA
    # that only lengthens. Its clock starts here: the splits before took seconds no round step costs.
    bar.bar_format = None  # a bar with its count and ETA from here on
    bar.reset(total=sum(len(run.pieces) for run in runs) * timing.max_repeats)
    order = [_whole_in_the_middle(run, f) for run, f in zip(runs, flops, strict=True)]
    first_s: dict[tuple[int, int], float] = {}  # each piece's forward+backward in the first round

    def measure(s: int, i: int, r: int) -> PieceMeasurement:
        run = runs[s]
        piece = run.pieces[i]
        n = run.units
        with_loss = i == n - 1 or i == run.whole_index  # the last unit and the whole model
        bar.set_description(f"b={run.b} {'whole model' if i == run.whole_index >= n else piece.name}")
        if i == order[s][0]:
            reference.time_once()
        # Past the first round, a short piece is warmed by an untimed iteration right before (WARM_BELOW_S).
        warm = r > 0 and first_s[s, i] < WARM_BELOW_S
        try:
            result = measure_piece(
                piece,
                device=dev,
                repeats=1,
                warmup=timing.warmup if r == 0 else int(warm),
                loss_fn=workload.loss_fn if with_loss else None,
                target=run.target if with_loss else None,
                track_memory=r == 0 and i < n,  # bytes do not vary: the first round's stand (rounds.py)
                # The whole model's and the overhead piece's I/W split is not in the profile, and a unit's is kept
                # as its ratio to the whole backward, which the first rounds know well enough.
                split=i < n and r < SPLIT_ROUNDS,
                probe=r == 0,
            )
        except Exception as exc:
            raise ProfilingError(
                f"measuring unit {piece.name} at micro-batch size {run.b} failed: {type(exc).__name__}: {exc}"
            ) from None
        if r == 0:
            first_s[s, i] = result.forward_s + result.backward_s
        bar.update()
        return result

    def extra_round(s: int) -> None:  # past the most rounds, for the time floor alone (a model of tiny units)
        bar.total += len(runs[s].pieces)
        bar.refresh()

    def done(s: int, rounds: int) -> None:
        bar.total -= len(runs[s].pieces) * max(0, timing.max_repeats - rounds)
        bar.refresh()

    return measure_parts_in_rounds(
        [len(run.pieces) for run in runs],
        measure,
        # The unit sum, which plans are made of, over the whole model in the same round, the check on it
        # (report.py): their ratio holds while the machine's speed moves, which the speed references follow.
        watch=[[range(run.units)] for run in runs],
        per=[run.whole_index if run.whole_apart else None for run in runs],
        order=order,
        min_rounds=timing.repeats,
        max_rounds=timing.max_repeats,
        stable_within=timing.stable_within,
        min_time_s=timing.min_time_s * len(runs),
        on_extra_round=extra_round,
        on_done=done,
    )


def _in_context(
    runs: Sequence[SizeRun],
    timed: list[Rounds],
    model: nn.Module,
    workload: Workload,
    batch: Batch,
    unit_names: list[str],
    dev: torch.device,
    bar: Any,
    timing: Timing,
) -> tuple[list[Rounds], dict[str, Any]]:
    """On a GPU, each size's units timed again inside whole-model steps (profiles/in_context.py): their forward
    and backward become those, the I/W split keeps the proportion measured alone, and the rest (bytes, the
    whole model, the resume term) stays as measured alone. A model whose units cannot be marked keeps its alone
    times, and the profile says why."""
    markers: list[float] = []
    out: list[Rounds] = []
    for run, rounds in zip(runs, timed, strict=True):
        bar.set_description(f"b={run.b} units in context")
        inputs, target = batch(run.b)
        try:
            times = time_in_context(
                model, inputs, target, workload.loss_fn, unit_names, dev, steps=max(5, timing.repeats)
            )
        except ProfilingError as exc:
            return list(timed), {"units": "alone", "in_context_error": str(exc)}
        medians = list(rounds.medians)
        for k in range(run.units):
            alone = medians[k]
            scale = times.backward_s[k] / alone.backward_s if alone.backward_s > 0 else 1.0
            medians[k] = replace(
                alone,
                forward_s=times.forward_s[k],
                backward_s=times.backward_s[k],
                backward_input_s=alone.backward_input_s * scale,
                backward_weight_s=alone.backward_weight_s * scale,
            )
        out.append(replace(rounds, medians=tuple(medians)))
        markers.append(times.markers_s)
    return out, {"units": f"in context ({times.method})", "markers_s": markers, "alone": ["memory", "I/W split"]}


def _after_rounds(
    run: SizeRun,
    timed: Rounds,
    workload: Workload,
    dev: torch.device,
    bar: Any,
    timing: Timing,
    thread_counts: tuple[int, ...],
) -> tuple[tuple[tuple[float, ...], tuple[float, ...]], tuple[float, ...]]:
    """At one size, after the rounds: the whole model's extras after idle gaps (profiles/resume.py) and its
    time at each of ``thread_counts`` / as profiled (profiles/threads.py)."""
    whole, whole_timed = run.pieces[run.whole_index], timed.medians[run.whole_index]
    step_s = whole_timed.forward_s + whole_timed.backward_s
    bar.set_description(f"b={run.b} after a wait")
    try:
        resume = measure_resume(whole, device=dev, loss_fn=workload.loss_fn, target=run.target, step_s=step_s)
    except Exception as exc:
        raise ProfilingError(
            f"measuring the model after a wait at micro-batch size {run.b} failed: {type(exc).__name__}: {exc}"
        ) from None
    if not thread_counts:
        return resume, ()
    if set(thread_counts) == {torch.get_num_threads()}:  # every pipeline's rank gets the profiled threads
        return resume, (1.0,)
    bar.set_description(f"b={run.b} at {', '.join(map(str, thread_counts))} threads")
    factors = measure_thread_scaling(
        whole,
        device=dev,
        loss_fn=workload.loss_fn,
        target=run.target,
        step_s=step_s,
        thread_counts=thread_counts,
        min_time_s=min(0.5, timing.min_time_s),
    )
    return resume, factors


def measure_loaded(
    model: nn.Module,
    workload: Workload,
    batch: Batch,
    unit_names: list[str],
    sizes: tuple[int, ...],
    dev: torch.device,
    timing: Timing,
    *,
    capture: str | None,
    progress: bool,
) -> Measurements:
    """The model held whole on the device: units, whole model and overhead piece in round-robin rounds.

    ``capture`` forces ``export`` or ``hooks`` (None: export, hooks when the model cannot be traced).
    """
    from tqdm import tqdm

    # The ETA from the average rate since the rounds began (smoothing 0): a round visits pieces from a few
    # milliseconds to seconds long in turn, so a recent-rate average would swing with whichever came last.
    # Until the rounds, a status line (what is being split, for how long): no step count to show yet.
    bar = tqdm(
        total=0,
        disable=not progress,
        file=sys.stderr,
        unit="step",
        leave=False,
        smoothing=0,
        bar_format="{desc}[{elapsed}]",
    )
    flops: list[tuple[int, ...]] = []
    edges_by_size: list[tuple[Edge, ...]] = []
    runs: list[SizeRun] = []
    ownership = None
    mode: str | None = capture
    fallback_reason = ""
    reference = SpeedReference(dev)
    reference.warm_up()
    # A CPU rank of a P-rank pipeline gets cores // P threads: the profile carries its times at each such count.
    cores = os.cpu_count() or 1
    counts = profiled_thread_counts(cores, torch.get_num_threads()) if dev.type == "cpu" else ()
    losses: list[tuple[int, int]] = []
    try:
        for b in sizes:
            bar.set_description(f"splitting the model at b={b}")
            # Nothing here is timed (the splits, the forwards that record and count them): on every idle core.
            with untimed_on_every_core(dev.type):
                inputs, target = batch(b)
                losses.append(loss_memory(model, workload, inputs, target))
                cap, reason = _capture(model, inputs, unit_names, mode)
                mode, fallback_reason = cap.mode, fallback_reason or reason
                if ownership is None:
                    ownership = param_ownership(model, cap)
                try:
                    counted = tuple(count_flops(piece.module, piece.args, piece.kwargs) for piece in cap.pieces)
                except Exception as exc:
                    raise ProfilingError(
                        f"counting FLOPs at micro-batch size {b} failed: {type(exc).__name__}: {exc}"
                    ) from None
                flops.append(counted)
                edges_by_size.append(cap.edges)
                runs.append(_size_run(cap, model, inputs, target, b, dev))
        timed = _time_sizes(runs, workload, dev, bar, timing, reference, flops)
        rounds_s = max(t.seconds for t in timed)
        unit_timing = None
        if dev.type in IN_CONTEXT_DEVICES:
            timed, unit_timing = _in_context(runs, timed, model, workload, batch, unit_names, dev, bar, timing)
        started = time.perf_counter()
        after = [_after_rounds(run, t, workload, dev, bar, timing, counts) for run, t in zip(runs, timed, strict=True)]
        thread_reference = measure_reference_at(dev, counts, rounds=15 if timing.min_time_s > 0 else 3)
        after_rounds_s = time.perf_counter() - started
    finally:
        bar.close()
    assert ownership is not None and mode is not None
    paired = unit_timing is None and all(run.whole_apart for run in runs)
    return Measurements(
        units=tuple(t.medians[: run.units] for run, t in zip(runs, timed, strict=True)),
        flops=tuple(flops),
        whole=tuple(t.medians[run.whole_index] for run, t in zip(runs, timed, strict=True)),
        overhead=tuple(t.medians[-1] for t in timed),
        rounds=tuple(t.rounds for t in timed),
        edges=tuple(edges_by_size),
        ownership=tuple(ownership),
        mode=mode,
        export_error=fallback_reason,
        reference_s=reference.median_s,
        resume=tuple(resume for resume, _ in after),
        thread_factors=tuple(f for _, f in after) if counts else None,
        thread_counts=counts,
        cores=cores if counts else None,
        thread_reference_s=thread_reference,
        loss_bytes=tuple(losses),
        unit_timing=unit_timing,
        # The rounds' watched ratio (_time_sizes), where the units' times are the rounds' and the whole model apart.
        unit_sum_ratio=tuple(t.watched[0] for t in timed) if paired else None,
        unit_sum_ratio_error=tuple(t.watched_error[0] for t in timed) if paired else None,
        rounds_s=rounds_s,
        after_rounds_s=after_rounds_s,
    )


def loss_memory(model: nn.Module, workload: Workload, inputs: tuple[Any, ...], target: Any) -> tuple[int, int]:
    """``(target bytes, bytes the loss's output keeps)`` for one micro-batch: the target's tensors, and the storage
    behind the loss ``loss_fn(model(*inputs), target)`` returns, which torch's schedules keep for every micro-batch
    until the step ends (a CPU ``mse_loss`` returns a 0-d view of its elementwise loss: the output's size)."""
    target_bytes = sum(t.numel() * t.element_size() for t in tree_leaves(target) if isinstance(t, torch.Tensor))
    with torch.no_grad():
        loss = workload.loss_fn(model(*inputs), target)
    kept = loss.untyped_storage().nbytes() if isinstance(loss, torch.Tensor) else 0
    return target_bytes, kept
