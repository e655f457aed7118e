"""``profile_model``: measure a workload unit by unit at several micro-batch sizes -> :class:`Profile`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from planner.errors import PipeplanWarning, ProfilingError, UsageError, shorten
from profiles.allocator import keep_freed_memory
from profiles.dataflow import Capture, Edge, Piece, capture_export, capture_hooks, param_ownership
from profiles.fingerprint import model_fingerprint
from profiles.format import (
    DeviceInfo,
    LossMemory,
    ModelInfo,
    PieceOverhead,
    Profile,
    Resume,
    TensorFlow,
    ThreadScaling,
    UnitProfile,
    WholeModel,
)
from profiles.measure import PieceMeasurement, count_flops, measure_piece
from profiles.meta import eager_on_meta
from profiles.reference import SpeedReference
from profiles.resume import RESUME_GAPS_S, measure_resume
from profiles.rounds import (
    MIN_TIME_S,
    WHOLE_PATHS,
    Measurements,
    Rounds,
    Timing,
    measure_parts_in_rounds,
    overhead_piece,
    whole_piece,
)
from profiles.threads import measure_reference_at, measure_thread_scaling, rank_thread_counts
from profiles.units import attention_heads, choose_units, expert_layout
from profiles.workload import (
    Workload,
    active_dropout,
    adapt_workload,
    as_tuple,
    check_batch,
    check_model_signature,
    check_output,
)

__all__ = ["profile_model", "device_info", "DTYPES"]

log = logging.getLogger("pipeplan")

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info(device: torch.device, dtype: str) -> DeviceInfo:
    """What a profile records of the device it was measured on."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return DeviceInfo("cuda", props.name, int(props.total_memory), dtype, torch.__version__)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceInfo("cpu", _cpu_name(), int(memory), dtype, torch.__version__)


def _resolve_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"unknown device {device!r}: use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device {device!r} is not supported: use cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfilingError(
            f"CUDA is not available on this machine: torch {torch.__version__} sees no GPU; use --device cpu"
        )
    return dev


def _to_device(value: Any, device: torch.device, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device, dtype) for v in value)
    return value


def _batch(workload: Workload, size: int, device: torch.device, dtype: torch.dtype) -> tuple[tuple, Any]:
    try:
        inputs, target = workload.make_batch(size)
    except SystemExit as exc:
        raise ProfilingError(f"make_batch({size}) called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise ProfilingError(f"make_batch({size}) failed: {shorten(f'{type(exc).__name__}: {exc}', 200)}") from None
    check_batch(size, inputs, target)
    return _to_device(as_tuple(inputs), device, dtype), _to_device(target, device, dtype)


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


def busy_cores(sample_s: float = 0.5) -> float | None:
    """Cores busy right now, from two reads of ``/proc/stat`` ``sample_s`` apart (this process sleeps
    between them, so it is everything else); None where there is no ``/proc/stat``."""

    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = read()
        time.sleep(sample_s)
        total1, idle1 = read()
    except (OSError, ValueError, IndexError):
        return None
    elapsed = total1 - total0
    if elapsed <= 0:
        return None
    return (os.cpu_count() or 1) * (1.0 - (idle1 - idle0) / elapsed)


def _warn_if_busy(dev: torch.device) -> float:
    """The 1-minute load average; on CPU, a warning when other work competes for the cores.

    Other processes on the same cores inflate unit times unevenly (measured: identical GPT-2 blocks
    differing by several times under load), and the plan follows what the profile says. The load average
    lags a minute, so it is confirmed by the cores busy right now: profiling one model after another,
    the previous run's own load set it off every time (the fidelity benchmark: 1.5-1.8 on 2 idle cores).
    """
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if dev.type == "cpu" and load > 0.5 * cores:
        now = busy_cores()
        if now is None or now > 0.5 * cores:
            busy = "" if now is None else f" ({now:.1f} busy now)"
            warnings.warn(
                f"load average {load:.1f} on {cores} cores{busy}: other work competes for "
                "the CPU, so unit times will be noisy; profile on a quiet machine",
                PipeplanWarning,
                stacklevel=2,
            )
    return load


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


def _size_run(cap: Capture, model: nn.Module, inputs: tuple, target: Any, b: int, dev: torch.device) -> SizeRun:
    n = len(cap.pieces)
    whole = whole_piece(model, inputs, cap, [p.name for p in cap.pieces])
    shared = whole is cap.pieces[0] and n == 1  # a one-unit export: the unit is the whole model
    pieces = (*cap.pieces, *(() if shared else (whole,)), overhead_piece(cap.mode, dev))
    return SizeRun(b, cap, target, pieces, n - 1 if shared else n)


def _time_sizes(
    runs: Sequence[SizeRun],
    workload: Workload,
    dev: torch.device,
    bar: Any,
    timing: Timing,
    reference: SpeedReference,
) -> list[Rounds]:
    """Time every size's pieces in shared round-robin rounds (:func:`profiles.rounds.measure_parts_in_rounds`:
    each round visits every size still going, starting one size later each round); the speed reference once per
    size per round.

    A slow spell of the machine then falls on every size alike, and the ratio between sizes, which picks the
    micro-batch size, holds. Timed one size after another, gpt2-small's b = 2 came out 1.3-1.6x slower per sample
    than b = 1 and 4 (2026-12-02, a slow spell over its 4 rounds) and the plan took a size its run did not bear
    out (docs/fidelity-profile.md). A size leaves the rounds once its median unit sum is known to within
    ``timing.stable_within`` (:func:`profiles.rounds.median_error`).
    """
    bar.total = sum(len(run.pieces) for run in runs) * timing.repeats
    bar.refresh()

    def measure(s: int, i: int, r: int) -> PieceMeasurement:
        run = runs[s]
        piece = run.pieces[i]
        n = run.units
        with_loss = i == n - 1 or i == run.whole_index  # the last unit and the whole model
        bar.set_description(f"b={run.b} {'whole model' if i == run.whole_index >= n else piece.name}")
        if i == 0:
            reference.time_once()
        try:
            result = measure_piece(
                piece,
                device=dev,
                repeats=1,
                warmup=timing.warmup if r == 0 else 0,
                loss_fn=workload.loss_fn if with_loss else None,
                target=run.target if with_loss else None,
                track_memory=r == 0 and i < n,  # bytes do not vary: the first round's stand (rounds.py)
            )
        except Exception as exc:
            raise ProfilingError(
                f"measuring unit {piece.name} at micro-batch size {run.b} failed: {type(exc).__name__}: {exc}"
            ) from None
        bar.update()
        return result

    def extra_round(s: int) -> None:
        bar.total += len(runs[s].pieces)
        bar.refresh()

    return measure_parts_in_rounds(
        [len(run.pieces) for run in runs],
        measure,
        # The unit sum, which plans are made of; the whole model, a check on it (report.py), is timed alike.
        watch=[[range(run.units)] for run in runs],
        min_rounds=timing.repeats,
        max_rounds=timing.max_repeats,
        stable_within=timing.stable_within,
        min_time_s=timing.min_time_s * len(runs),
        on_extra_round=extra_round,
    )


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


def _edge_key(edge: Edge) -> tuple[int, tuple[int, ...], str]:
    return (edge.producer, edge.consumers, edge.name)


def _measure_loaded(
    model: nn.Module,
    workload: Workload,
    unit_names: list[str],
    sizes: tuple[int, ...],
    dev: torch.device,
    torch_dtype: torch.dtype,
    timing: Timing,
    capture: str | None,
    progress: bool,
) -> Measurements:
    """The model held whole on the device: units, whole model and overhead piece in round-robin rounds."""
    from tqdm import tqdm

    bar = tqdm(total=0, disable=not progress, file=sys.stderr, unit="step", leave=False)
    flops: list[tuple[int, ...]] = []
    edges_by_size: list[tuple[Edge, ...]] = []
    runs: list[SizeRun] = []
    ownership = None
    mode: str | None = capture
    fallback_reason = ""
    reference = SpeedReference(dev)
    reference.warm_up()
    # A CPU rank of a P-rank pipeline gets cores // P threads: the profile carries its times at each such count.
    counts = rank_thread_counts(os.cpu_count() or 1) if dev.type == "cpu" else ()
    losses: list[tuple[int, int]] = []
    try:
        for b in sizes:
            inputs, target = _batch(workload, b, dev, torch_dtype)
            losses.append(loss_memory(model, workload, inputs, target))
            bar.set_description(f"split b={b}")
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
        timed = _time_sizes(runs, workload, dev, bar, timing, reference)
        after = [_after_rounds(run, t, workload, dev, bar, timing, counts) for run, t in zip(runs, timed, strict=True)]
        thread_reference = measure_reference_at(dev, counts, rounds=15 if timing.min_time_s > 0 else 3)
    finally:
        bar.close()
    assert ownership is not None and mode is not None
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
        thread_reference_s=thread_reference,
        loss_bytes=tuple(losses),
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


def _whole_model(measured: Measurements, n_sizes: int) -> WholeModel:
    """The measured whole model; for a meta profile, the unit sum (settings say it was not measured).

    Kept as the unit sum rather than left out so that the field stays what version 1 requires and an
    older reader's unit-sum check reads 0 %, not a division by zero (docs/profile-format.md).
    """
    if measured.whole is not None:
        return WholeModel(tuple(w.forward_s for w in measured.whole), tuple(w.backward_s for w in measured.whole))
    return WholeModel(
        tuple(sum(m.forward_s for m in measured.units[j]) for j in range(n_sizes)),
        tuple(sum(m.backward_s for m in measured.units[j]) for j in range(n_sizes)),
    )


def _all_measured(values: Iterable[int | None]) -> tuple[int, ...] | None:
    """A per-size memory figure, or None when any size lacks it."""
    got = tuple(values)
    return None if any(v is None for v in got) else tuple(int(v) for v in got)  # type: ignore[arg-type]


def _largest_param_bytes(module: nn.Module) -> int:
    return max((p.numel() * p.element_size() for p in module.parameters()), default=0)


def profile_model(
    workload: Workload,
    *,
    micro_batch_sizes: Sequence[int] = (1, 2, 4),
    device: str = "cpu",
    dtype: str = "float32",
    repeats: int = 5,
    max_repeats: int | None = None,
    stable_within: float = 0.02,
    warmup: int = 2,
    units: Sequence[str] | int | None = None,
    progress: bool = True,
    capture: str | None = None,
    sample_blocks: bool = False,
    min_time_s: float = MIN_TIME_S,
) -> Profile:
    """Measure ``workload`` unit by unit at each micro-batch size.

    ``units`` overrides ``workload.units`` (a list of FQNs, or an int module depth); with neither the
    units are found by :func:`profiles.units.find_units`. ``capture`` forces ``export`` or ``hooks``
    (default: export, hooks when the model cannot be traced). The model is moved to ``device``/``dtype``
    in place. The loss is computed, and timed, with the last unit, as the last pipeline stage does.

    Units, the whole model (along the units' code path, :func:`profiles.rounds.whole_piece`) and the
    piece overhead are timed in round-robin rounds: at least ``repeats``, then until the standard error of
    the median unit sum is at most ``stable_within`` of it (:func:`profiles.rounds.median_error`, judged
    from :data:`profiles.rounds.SPREAD_ROUNDS` rounds on), at most ``max_repeats`` (default:
    ``repeats``, no adaptation); and until they span ``min_time_s`` of wall time per size
    (:data:`profiles.rounds.MIN_TIME_S`: a shared machine changes speed from one second to the next). A round
    visits every size, so that a slow spell falls on every size alike (``_time_sizes``).

    A workload built on the meta device (``load_workload(spec, meta=True)``) is profiled one unit at a
    time (:func:`profiles.meta_profile.measure_on_meta`): the whole model is never held, nor measured;
    ``sample_blocks`` (meta only) measures one unit of each run of identical consecutive units.

    Raises :class:`UsageError` for bad sizes/repeats/dtype/units and :class:`ProfilingError` when CUDA
    is missing or the model cannot be run.
    """
    sizes = tuple(micro_batch_sizes)
    if not sizes or any(not isinstance(b, int) or b <= 0 for b in sizes):
        raise UsageError(f"micro-batch sizes must be positive integers, got {list(sizes)}")
    if len(set(sizes)) != len(sizes):
        raise UsageError(f"micro-batch sizes have duplicates: {list(sizes)}")
    sizes = tuple(sorted(sizes))
    if repeats < 1 or warmup < 0:
        raise UsageError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    max_repeats = repeats if max_repeats is None else max_repeats
    if max_repeats < repeats:
        raise UsageError(f"max repeats must be >= repeats, got max_repeats={max_repeats}, repeats={repeats}")
    if not (math.isfinite(min_time_s) and min_time_s >= 0):
        raise UsageError(f"min_time_s must be a finite number of seconds >= 0, got {min_time_s}")
    if not 0 < stable_within < 1:
        raise UsageError(f"stable_within must be between 0 and 1 (a fraction), got {stable_within}")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if capture not in (None, "export", "hooks"):
        raise UsageError(f"unknown capture {capture!r}: use export or hooks")
    on_meta = workload.meta_buffers is not None
    if on_meta and capture == "hooks":
        raise UsageError("a meta profile splits the model by export: capture hooks cannot feed one unit at a time")
    if sample_blocks and not on_meta:
        raise UsageError("sample_blocks needs a model built on the meta device: load_workload(spec, meta=True)")
    dev = _resolve_device(device)
    # the runtime's ranks keep freed memory too (planner/runtime/launch.py): see profiles/allocator.py
    kept_memory = keep_freed_memory() if dev.type == "cpu" else False
    torch_dtype = DTYPES[dtype]
    workload = adapt_workload(workload)  # keyword inputs, a ModelOutput: what the pipeline can split
    for note in workload.notes:
        log.info("%s", note)
    # A meta model stays on meta: only its dtype changes (its pieces are materialised on the device).
    model = workload.model.to(dtype=torch_dtype) if on_meta else workload.model.to(device=dev, dtype=torch_dtype)
    model.train()
    check_model_signature(model)
    dropout = active_dropout(model)
    if dropout:
        warnings.warn(
            f"{len(dropout)} dropout modules are active in training mode (e.g. {dropout[0]}): "
            "every run differs, and so do the profile and verify's numerics; set their p to 0 to compare runs",
            PipeplanWarning,
            stacklevel=2,
        )

    example, _ = _batch(workload, sizes[0], dev, torch_dtype)
    # A meta model runs its eager checks on fake meta inputs (profiles/meta.py, eager_on_meta).
    with eager_on_meta(example) if on_meta else contextlib.nullcontext(example) as example:
        check_output(model, example, sizes[0])
        if units is not None:
            choice, unit_spec = choose_units(model, example, units), units if isinstance(units, int) else "explicit"
        elif workload.units is not None:
            choice, unit_spec = choose_units(model, example, list(workload.units)), "workload"
        else:
            choice, unit_spec = choose_units(model, example), "default"
    unit_names = list(choice.units)
    if sample_blocks:
        from profiles.meta_profile import check_sample_blocks

        check_sample_blocks(model, unit_names)
    # After the checks: a model that cannot run, or bad units, get their one error line, not a warning before it.
    load_before = _warn_if_busy(dev)
    log.info("%d units (%s)", len(unit_names), choice.how)
    for warning in choice.warnings:
        warnings.warn(warning, PipeplanWarning, stacklevel=2)

    timing = Timing(repeats, max_repeats, warmup, stable_within, min_time_s)
    meta_settings: dict[str, Any] = {}
    if on_meta:
        from profiles.meta_profile import measure_on_meta

        def on_device(b: int) -> tuple[tuple, Any]:
            return _batch(workload, b, dev, torch_dtype)

        measured, meta_settings = measure_on_meta(
            model,
            workload.meta_buffers or {},
            on_device,
            unit_names,
            sizes,
            dev,
            timing,
            loss_fn=workload.loss_fn,
            sample_blocks=sample_blocks,
            progress=progress,
        )
    else:
        measured = _measure_loaded(model, workload, unit_names, sizes, dev, torch_dtype, timing, capture, progress)

    expected = [_edge_key(e) for e in measured.edges[0]]
    for b, edges in zip(sizes, measured.edges, strict=True):
        if [_edge_key(e) for e in edges] != expected:
            raise ProfilingError(
                f"the data flow between units differs at micro-batch size {b} from size {sizes[0]}: "
                "the model's structure depends on the batch size"
            )
    ownership, per_size = measured.ownership, measured.units
    unit_profiles = tuple(
        UnitProfile(
            name=name,
            type=type(model.get_submodule(name)).__name__,
            param_count=ownership[i][0],
            param_bytes=ownership[i][1],
            forward_s=tuple(m[i].forward_s for m in per_size),
            backward_s=tuple(m[i].backward_s for m in per_size),
            flops=tuple(f[i] for f in measured.flops),
            output_bytes=tuple(m[i].output_bytes for m in per_size),
            saved_bytes=tuple(m[i].saved_bytes for m in per_size),
            peak_bytes=tuple(int(m[i].peak_bytes or 0) for m in per_size) if dev.type == "cuda" else None,
            tied_params=ownership[i][2],
            tied_param_count=ownership[i][3],
            param_tensor_count=ownership[i][4],
            backward_input_s=tuple(m[i].backward_input_s for m in per_size),
            backward_weight_s=tuple(m[i].backward_weight_s for m in per_size),
            weight_grad_bytes=tuple(m[i].weight_grad_bytes for m in per_size),
            held_bytes=_all_measured(m[i].memory and m[i].memory.held_bytes for m in per_size),
            transient_bytes=_all_measured(m[i].memory and m[i].memory.transient_bytes for m in per_size),
            input_transient_bytes=_all_measured(m[i].memory and m[i].memory.input_transient_bytes for m in per_size),
            weight_transient_bytes=_all_measured(m[i].memory and m[i].memory.weight_transient_bytes for m in per_size),
            largest_param_bytes=_largest_param_bytes(model.get_submodule(name)),
        )
        for i, name in enumerate(unit_names)
    )
    tensors = tuple(
        TensorFlow(
            producer=e.producer,
            consumers=e.consumers,
            bytes=tuple(edges[j].nbytes for edges in measured.edges),
            dtype=e.dtype,
            needs_grad=e.needs_grad,
            name=e.name,
        )
        for j, e in enumerate(measured.edges[0])
    )
    distinct = {id(p): p for p in model.parameters()}.values()
    settings: dict[str, Any] = {
        "repeats": repeats,
        "max_repeats": max_repeats,
        "stable_within": stable_within,
        "min_time_s": 0.0 if on_meta else min_time_s,
        "repeats_used": list(measured.rounds),
        "whole_model_path": WHOLE_PATHS["meta" if on_meta else measured.mode],
        "keep_freed_memory": kept_memory,
        "warmup": warmup,
        "capture": measured.mode,
        "unit_spec": unit_spec,
        "unit_choice": choice.how,
        "loss_in_last_unit": True,
        # CPU timings depend on intra-op threads: a rank of a P-process CPU pipeline gets cores / P.
        "threads": torch.get_num_threads(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **meta_settings,
    }
    if measured.reference_s is not None:
        settings["reference_s"] = measured.reference_s
    first = example[0] if example else None
    if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
        settings["seq_len"] = int(first.shape[-1])  # token ids (batch, seq_len)
    if measured.export_error:
        settings["export_error"] = measured.export_error
    if workload.notes:
        settings["adapted"] = list(workload.notes)
    settings.update(attention_heads(model))  # what a tensor-parallel plan must divide
    experts = expert_layout(model, unit_names)
    if experts:
        settings["experts"] = experts
    profile = Profile(
        model=ModelInfo(
            name=workload.name or type(workload.model).__name__,
            fingerprint=model_fingerprint(model),
            param_count=sum(p.numel() for p in distinct),
            param_bytes=sum(p.numel() * p.element_size() for p in distinct),
        ),
        device=device_info(dev, dtype),
        micro_batch_sizes=sizes,
        units=unit_profiles,
        tensors=tensors,
        whole_model=_whole_model(measured, len(sizes)),
        piece_overhead=PieceOverhead(
            tuple(o.forward_s for o in measured.overhead), tuple(o.backward_s for o in measured.overhead)
        ),
        resume=None
        if measured.resume is None
        else Resume(RESUME_GAPS_S, tuple(f for f, _ in measured.resume), tuple(b for _, b in measured.resume)),
        thread_scaling=None
        if measured.thread_factors is None
        else ThreadScaling(
            measured.thread_counts,
            tuple(zip(*measured.thread_factors, strict=True)),
            measured.thread_reference_s,
        ),
        loss=None
        if measured.loss_bytes is None
        else LossMemory(tuple(t for t, _ in measured.loss_bytes), tuple(k for _, k in measured.loss_bytes)),
        settings=settings,
    )
    if on_meta:
        from profiles.report import meta_line

        log.info("%s", meta_line(profile))
    return profile
