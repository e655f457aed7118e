"""``profile_model``: measure a workload unit by unit at several micro-batch sizes -> :class:`Profile`."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import PipeplanWarning, ProfilingError, UsageError, shorten
from profiles.allocator import keep_freed_memory
from profiles.dataflow import Edge
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
from profiles.loaded_profile import measure_loaded
from profiles.measure_settings import DTYPE_NAMES, MeasureSettings
from profiles.meta import eager_on_meta
from profiles.resume import RESUME_GAPS_S
from profiles.rounds import WHOLE_PATHS, Measurements, Timing
from profiles.units import UnitChoice, attention_heads, choose_units, expert_layout
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

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


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


def _edge_key(edge: Edge) -> tuple[int, tuple[int, ...], str]:
    return (edge.producer, edge.consumers, edge.name)


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


def _timing(settings: MeasureSettings) -> Timing:
    """The rounds to time (``max_repeats`` None: ``repeats``, no adaptation)."""
    max_repeats = settings.repeats if settings.max_repeats is None else settings.max_repeats
    return Timing(settings.repeats, max_repeats, settings.warmup, settings.stable_within, settings.min_time_s)


def _check_meta(capture: str | None, on_meta: bool, sample_blocks: bool) -> None:
    """:class:`UsageError` for a choice the model's device rules out."""
    if on_meta and capture == "hooks":
        raise UsageError("a meta profile splits the model by export: capture hooks cannot feed one unit at a time")
    if sample_blocks and not on_meta:
        raise UsageError("sample_blocks needs a model built on the meta device: load_workload(spec, meta=True)")


def _prepare_model(
    workload: Workload, dev: torch.device, torch_dtype: torch.dtype, on_meta: bool
) -> tuple[Workload, nn.Module]:
    """The workload adapted to what the pipeline can split, and its model in training mode on the device."""
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
            stacklevel=3,
        )
    return workload, model


def _choose_units(
    model: nn.Module,
    units: Sequence[str] | int | None,
    workload_units: Sequence[str] | None,
    example: tuple,
    size: int,
    on_meta: bool,
) -> tuple[UnitChoice, str]:
    """Check the model's output on ``example`` (``size`` samples) and choose its units; the choice and what
    asked for it (``units``, else the workload's, else the default rules)."""
    # A meta model runs its eager checks on fake meta inputs (profiles/meta.py, eager_on_meta).
    with eager_on_meta(example) if on_meta else contextlib.nullcontext(example) as example:
        check_output(model, example, size)
        if units is not None:
            return choose_units(model, example, units), units if isinstance(units, int) else "explicit"
        if workload_units is not None:
            return choose_units(model, example, list(workload_units)), "workload"
        return choose_units(model, example), "default"


def _announce(dev: torch.device, choice: UnitChoice) -> float:
    """Warn of a busy machine and of units that may cut badly; the load average before measuring."""
    # After the checks: a model that cannot run, or bad units, get their one error line, not a warning before it.
    load_before = _warn_if_busy(dev)
    log.info("%d units (%s)", len(choice.units), choice.how)
    for warning in choice.warnings:
        warnings.warn(warning, PipeplanWarning, stacklevel=3)
    return load_before


@dataclass(frozen=True)
class _Subject:
    """The model to measure, once the options are checked and its units chosen: what the measuring and
    assembling steps read."""

    workload: Workload
    """Adapted to what the pipeline can split (:func:`profiles.workload.adapt_workload`)."""
    model: nn.Module
    device: torch.device
    dtype: str
    sizes: tuple[int, ...]
    timing: Timing
    units: tuple[str, ...]
    example: tuple
    """The inputs at the smallest size, on which the units were chosen."""

    @property
    def on_meta(self) -> bool:
        return self.workload.meta_buffers is not None

    def batch(self, b: int) -> tuple[tuple, Any]:
        """A micro-batch of ``b`` samples, inputs and target, on the device in the profile's dtype."""
        return _batch(self.workload, b, self.device, DTYPES[self.dtype])


def _measure(
    subject: _Subject, *, capture: str | None, sample_blocks: bool, progress: bool
) -> tuple[Measurements, dict[str, Any]]:
    """Time the units: a meta model's one at a time (profiles/meta_profile.py), else the model's held whole
    (profiles/loaded_profile.py); the measurements, and the settings the meta path records."""
    s = subject
    if not s.on_meta:
        measured = measure_loaded(
            s.model, s.workload, s.batch, list(s.units), s.sizes, s.device, s.timing, capture=capture, progress=progress
        )
        return measured, {}
    from profiles.meta_profile import MetaSetup, measure_on_meta

    setup = MetaSetup(
        s.model,
        s.workload.meta_buffers or {},
        s.batch,
        s.units,
        s.sizes,
        s.device,
        s.timing,
        loss_fn=s.workload.loss_fn,
        sample_blocks=sample_blocks,
        progress=progress,
    )
    return measure_on_meta(setup)


def _check_same_dataflow(measured: Measurements, sizes: tuple[int, ...]) -> None:
    """:class:`ProfilingError` when the tensors between units differ from one micro-batch size to another."""
    expected = [_edge_key(e) for e in measured.edges[0]]
    for b, edges in zip(sizes, measured.edges, strict=True):
        if [_edge_key(e) for e in edges] != expected:
            raise ProfilingError(
                f"the data flow between units differs at micro-batch size {b} from size {sizes[0]}: "
                "the model's structure depends on the batch size"
            )


def _unit_profiles(
    model: nn.Module, unit_names: Sequence[str], measured: Measurements, dev: torch.device
) -> tuple[UnitProfile, ...]:
    """Each unit's record: its parameters, and per size what it measured."""
    ownership, per_size = measured.ownership, measured.units
    return tuple(
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


def _tensor_flows(measured: Measurements) -> tuple[TensorFlow, ...]:
    """The tensors passed between units, with their bytes at each size."""
    return tuple(
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


def _run_settings(
    timing: Timing,
    measured: Measurements,
    *,
    on_meta: bool,
    kept_memory: bool,
    choice: UnitChoice,
    unit_spec: str,
    load_before: float,
) -> dict[str, Any]:
    """How the profile was measured: the rounds, the paths, the units' choice, the machine's threads and load."""
    return {
        "repeats": timing.repeats,
        "max_repeats": timing.max_repeats,
        "stable_within": timing.stable_within,
        "min_time_s": 0.0 if on_meta else timing.min_time_s,
        "repeats_used": list(measured.rounds),
        "whole_model_path": WHOLE_PATHS["meta" if on_meta else measured.mode],
        "keep_freed_memory": kept_memory,
        "warmup": timing.warmup,
        "capture": measured.mode,
        "unit_spec": unit_spec,
        "unit_choice": choice.how,
        "loss_in_last_unit": True,
        # CPU timings depend on intra-op threads: a rank of a P-process CPU pipeline gets cores / P.
        "threads": torch.get_num_threads(),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _found_settings(subject: _Subject, measured: Measurements) -> dict[str, Any]:
    """What the run found out, where there is something: the speed reference, the sequence length, why export
    failed, how the workload was adapted, what a tensor-parallel plan must divide, the experts."""
    settings: dict[str, Any] = {}
    if measured.reference_s is not None:
        settings["reference_s"] = measured.reference_s
    first = subject.example[0] if subject.example else None
    if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
        settings["seq_len"] = int(first.shape[-1])  # token ids (batch, seq_len)
    if measured.export_error:
        settings["export_error"] = measured.export_error
    if measured.unit_timing is not None:
        settings["unit_timing"] = measured.unit_timing
    if measured.unit_sum_ratio is not None:
        settings["unit_sum_ratio"] = list(measured.unit_sum_ratio)
    if measured.unit_sum_ratio_error is not None:
        settings["unit_sum_ratio_error"] = list(measured.unit_sum_ratio_error)
    if measured.rounds_s is not None:
        settings["rounds_s"] = round(measured.rounds_s, 3)
    if measured.after_rounds_s is not None:
        settings["after_rounds_s"] = round(measured.after_rounds_s, 3)
    if subject.workload.notes:
        settings["adapted"] = list(subject.workload.notes)
    settings.update(attention_heads(subject.model))  # what a tensor-parallel plan must divide
    experts = expert_layout(subject.model, list(subject.units))
    if experts:
        settings["experts"] = experts
    return settings


def _model_info(workload: Workload, model: nn.Module) -> ModelInfo:
    """The model's name, fingerprint and parameters, a shared parameter counted once."""
    distinct = {id(p): p for p in model.parameters()}.values()
    return ModelInfo(
        name=workload.name or type(workload.model).__name__,
        fingerprint=model_fingerprint(model),
        param_count=sum(p.numel() for p in distinct),
        param_bytes=sum(p.numel() * p.element_size() for p in distinct),
    )


def _resume(measured: Measurements) -> Resume | None:
    """The whole model's extras after idle gaps; None where not measured (a meta profile)."""
    if measured.resume is None:
        return None
    return Resume(RESUME_GAPS_S, tuple(f for f, _ in measured.resume), tuple(b for _, b in measured.resume))


def _thread_scaling(measured: Measurements) -> ThreadScaling | None:
    """The whole model's time at each rank's thread count; None off a CPU and for a meta profile."""
    if measured.thread_factors is None:
        return None
    factors = tuple(zip(*measured.thread_factors, strict=True))
    return ThreadScaling(measured.thread_counts, factors, measured.thread_reference_s, measured.cores)


def _loss_memory(measured: Measurements) -> LossMemory | None:
    """The target's bytes and what the loss's output keeps; None for a meta profile."""
    if measured.loss_bytes is None:
        return None
    return LossMemory(tuple(t for t, _ in measured.loss_bytes), tuple(k for _, k in measured.loss_bytes))


def _assemble(subject: _Subject, measured: Measurements, settings: dict[str, Any]) -> Profile:
    """The profile: the model, the device, each unit's and each tensor's record, the whole model and the
    measurements around the units."""
    s = subject
    return Profile(
        model=_model_info(s.workload, s.model),
        device=device_info(s.device, s.dtype),
        micro_batch_sizes=s.sizes,
        units=_unit_profiles(s.model, s.units, measured, s.device),
        tensors=_tensor_flows(measured),
        whole_model=_whole_model(measured, len(s.sizes)),
        piece_overhead=PieceOverhead(
            tuple(o.forward_s for o in measured.overhead), tuple(o.backward_s for o in measured.overhead)
        ),
        resume=_resume(measured),
        thread_scaling=_thread_scaling(measured),
        loss=_loss_memory(measured),
        settings=settings,
    )


def profile_model(workload: Workload, settings: MeasureSettings | None = None) -> Profile:
    """Measure ``workload`` unit by unit at each micro-batch size; ``settings`` (default
    ``MeasureSettings()``) says which sizes, where, how long and which units.

    ``settings.units`` overrides ``workload.units`` (a list of FQNs, or an int module depth); with neither the
    units are found by :func:`profiles.units.find_units`. ``settings.capture`` forces ``export`` or ``hooks``
    (default: export, hooks when the model cannot be traced). The model is moved to the settings' device and
    dtype in place. The loss is computed, and timed, with the last unit, as the last pipeline stage does.

    Units, the whole model (along the units' code path, :func:`profiles.rounds.whole_piece`) and the
    piece overhead are timed in round-robin rounds: at least ``repeats``, then until the standard error of
    the median of the unit sum over the whole model timed in the same round is at most ``stable_within`` of it
    (:func:`profiles.rounds.median_error`, judged
    from :data:`profiles.rounds.SPREAD_ROUNDS` rounds on), at most ``max_repeats`` (default:
    ``repeats``, no adaptation); and until they span ``min_time_s`` of wall time per size
    (:data:`profiles.measure_settings.MIN_TIME_S`: a shared machine changes speed from one second to the next).
    A round visits every size, so that a slow spell falls on every size alike
    (:func:`profiles.loaded_profile.measure_loaded`).

    A workload built on the meta device (``load_workload(spec, meta=True)``) is profiled one unit at a
    time (:func:`profiles.meta_profile.measure_on_meta`): the whole model is never held, nor measured;
    ``sample_blocks`` (meta only) measures one unit of each run of identical consecutive units.

    Raises :class:`UsageError` for bad sizes/repeats/dtype/units (the sizes, rounds, dtype and capture when the
    :class:`MeasureSettings` is made) and :class:`ProfilingError` when CUDA is missing or the model cannot be run.
    """
    s = settings or MeasureSettings()
    sizes, timing = tuple(sorted(s.micro_batch_sizes)), _timing(s)
    on_meta = workload.meta_buffers is not None
    _check_meta(s.capture, on_meta, s.sample_blocks)
    dev = _resolve_device(s.device)
    # the runtime's ranks keep freed memory too (planner/runtime/launch.py): see profiles/allocator.py
    kept_memory = keep_freed_memory() if dev.type == "cpu" else False
    workload, model = _prepare_model(workload, dev, DTYPES[s.dtype], on_meta)

    example, _ = _batch(workload, sizes[0], dev, DTYPES[s.dtype])
    choice, unit_spec = _choose_units(model, s.units, workload.units, example, sizes[0], on_meta)
    if s.sample_blocks:
        from profiles.meta_profile import check_sample_blocks

        check_sample_blocks(model, list(choice.units))
    load_before = _announce(dev, choice)

    subject = _Subject(workload, model, dev, s.dtype, sizes, timing, choice.units, example)
    measured, meta_settings = _measure(subject, capture=s.capture, sample_blocks=s.sample_blocks, progress=s.progress)
    _check_same_dataflow(measured, sizes)

    run_settings = _run_settings(
        timing,
        measured,
        on_meta=on_meta,
        kept_memory=kept_memory,
        choice=choice,
        unit_spec=unit_spec,
        load_before=load_before,
    )
    profile = _assemble(subject, measured, {**run_settings, **meta_settings, **_found_settings(subject, measured)})
    if on_meta:
        from profiles.report import meta_line

        log.info("%s", meta_line(profile))
    return profile
