"""The report of a verify run: what :func:`planner.runtime.verify.verify_plan` measured beside what the plan
predicted, per stage, per rank and for the iteration, and the numerics check; its JSON form
(:meth:`VerifyReport.to_dict`, what ``pipeplan verify --out`` writes, and :func:`report_from_dict`, which reads it
back), its table (:func:`format_report`) and the one-line diagnosis of a mismatch (:func:`mismatch_reason`).

A module of its own so that what only reads reports (the calibration refit, tune, the benchmarks re-evaluating a
stored run) imports neither torch nor the code that runs ranks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, cast

from planner.cost import MemoryBreakdown
from planner.formatting import format_table, human_bytes
from planner.runtime.job_report import JobReport, format_job
from planner.schedule.orders import Schedule

__all__ = [
    "memory_mismatch",
    "format_memory",
    "NUMERICS_ATOL",
    "NUMERICS_RTOL",
    "MEMORY_TOLERANCE",
    "StageReport",
    "NumericsReport",
    "RankTime",
    "VerifyReport",
    "contention_change",
    "mismatch_reason",
    "format_report",
    "report_from_dict",
    "VERIFY_REPORT_FORMAT",
]

VERIFY_REPORT_FORMAT = "pipeplan.verify-report"
"""The ``format`` a report's JSON names (a report without it is known by its fields)."""

NUMERICS_ATOL = 1e-5
NUMERICS_RTOL = 1e-4
MEMORY_TOLERANCE = 0.10
"""Largest accepted relative error of a stage's measured memory peak against its prediction (0.10 = 10 %)."""


def _error_pct(measured: float, predicted: float) -> float:
    return (measured - predicted) / predicted * 100.0 if predicted > 0 else math.inf


@dataclass(frozen=True)
class StageReport:
    index: int
    rank: int
    predicted_forward_s: float
    predicted_backward_s: float
    measured_forward_s: float
    """Median over micro-batches and timed steps."""
    measured_backward_s: float
    predicted_memory: MemoryBreakdown | None = None
    """The plan's memory of the stage at its peak, by part (``StagePlan.memory_bytes``)."""
    measured_memory: MemoryBreakdown | None = None
    """The stage's peak of live tensor bytes in one training step, by the same parts, at the moment of the peak
    (:mod:`planner.runtime.stage_memory`); None where the report does not hold it."""
    capacity_bytes: float | None = None
    """The memory the plan was made for, the stage's share: its rank's device memory (``--memory``) over the
    stages the rank holds; None if unknown."""

    def __post_init__(self) -> None:
        # Read back from JSON (to_dict), the breakdowns are objects: the plan's parts again.
        for name in ("predicted_memory", "measured_memory"):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, MemoryBreakdown(**value))

    @property
    def error_pct(self) -> float:
        """Error of forward + backward, measured against predicted, in percent."""
        return _error_pct(
            self.measured_forward_s + self.measured_backward_s, self.predicted_forward_s + self.predicted_backward_s
        )

    @property
    def predicted_memory_bytes(self) -> int | None:
        return None if self.predicted_memory is None else self.predicted_memory.peak

    @property
    def measured_memory_bytes(self) -> int | None:
        return None if self.measured_memory is None else self.measured_memory.peak

    @property
    def memory_error_pct(self) -> float | None:
        """Measured peak against predicted, in percent; None without both (a plan written by hand predicts 0)."""
        if self.predicted_memory is None or self.measured_memory is None or self.predicted_memory.peak <= 0:
            return None
        return _error_pct(self.measured_memory.peak, self.predicted_memory.peak)

    @property
    def over_capacity(self) -> bool:
        """Whether the measured peak exceeds what the plan gave the stage."""
        measured = self.measured_memory_bytes
        return measured is not None and self.capacity_bytes is not None and measured > self.capacity_bytes


@dataclass(frozen=True)
class NumericsReport:
    ok: bool
    loss_abs_diff: float
    max_grad_abs_diff: float
    worst_parameter: str
    atol: float = NUMERICS_ATOL
    rtol: float = NUMERICS_RTOL


@dataclass(frozen=True)
class RankTime:
    """Where one rank's iteration went, predicted and measured (seconds, medians over steps)."""

    rank: int
    predicted_compute_s: float
    predicted_wait_s: float
    """Idle: the schedule's bubble plus link time."""
    predicted_tail_s: float
    predicted_overhead_s: float
    measured_compute_s: float
    measured_wait_s: float
    """Inside torch's waits on point-to-point transfers (bubble and link alike)."""
    measured_tail_s: float
    measured_overhead_s: float
    """The rest of the iteration: Python dispatch, posting transfers, the loss, barriers."""


def contention_change(together_now: float, together_then: float) -> float:
    """How much more the ranks slow each other now than when the co-location factor was learned, from the ratios
    of their units timed together over alone. Each ratio counts as at least 1: sharing the machine cannot make
    compute faster, so a ratio below 1 is noise, as for the co-location factor (planner/runtime/calibrate.py;
    docs/cost-model.md, "The machine's speed")."""
    return max(together_now, 1.0) / max(together_then, 1.0)


@dataclass(frozen=True)
class VerifyReport:
    mode: str
    """``processes``, ``replay``, or ``torchrun`` (each rank a process of a ``torchrun`` job it joined)."""
    schedule: Schedule
    """The plan's schedule (a name is parsed: reports read back from JSON hold one); ``to_dict`` writes its value."""
    num_ranks: int
    num_microbatches: int
    steps: int
    warmup: int
    tolerance: float
    """Largest accepted relative iteration error (0.25 = 25 %)."""
    predicted_iteration_s: float
    measured_iteration_s: float
    """processes: median wall time between barriers; replay: simulated from the measured stage times."""
    busy_s: tuple[float, ...]
    """Per rank: measured compute time in one iteration (median over steps)."""
    stages: tuple[StageReport, ...]
    memory_kind: str
    """How memory was measured: ``live-tensors`` (every stage's peak of live tensor bytes, by torch's dispatcher:
    planner/runtime/stage_memory.py); a report read from a file may also name ``cuda``, ``rss`` or ``rss-process``."""
    numerics: NumericsReport | None = None
    optimizer: str = "adam"
    """The optimizer stepped inside each timed iteration."""
    ranks: tuple[RankTime, ...] = ()
    reference_s: float | None = None
    """The speed reference's median forward+backward during this run, timed after each timed step (processes: on
    every rank in turn; the sum of the ranks' medians for ``units``, the median of their medians for ``layer``)."""
    profile_reference_s: float | None = None
    """The same while the profile was made (the plan's ``device.reference_s``, or ``device.unit_sum_s`` for
    the units; None in older plans)."""
    reference: str = "layer"
    """What the speed reference was: ``layer``, the fixed transformer layer (profiles/reference.py), or
    ``units``, the model's units at the plan's micro-batch size, each timed as its profile timed it, added up
    (profiles/model_reference.py; on real processes each rank times those of its own stages, alone)."""
    speed_adjusted_iteration_s: float | None = None
    """The prediction at the machine's speed during this run: the plan simulated with every compute time
    (stages, per-action overhead, step tails; not the links) times :attr:`speed_factor`, and on real processes
    times :attr:`colocation_change` where it is known. None without a speed."""
    reference_together_s: float | None = None
    """Real processes, ``units``: the same units timed once more after each timed step with every rank at once
    (planner/runtime/rank_timing.py, :func:`time_units_together`), the sum of the ranks' medians; None otherwise."""
    learned_together_ratio: float | None = None
    """The same ratio of the units together to alone while the plan's co-location factor was learned (the plan's
    ``device.units_together_ratio``); None where it was not (a machine calibration, older plans)."""
    memory_tolerance: float = MEMORY_TOLERANCE
    """Largest accepted relative error of any stage's measured memory peak (0.10 = 10 %)."""
    rank_memory_bytes: tuple[int, ...] = ()
    """Per rank (processes mode): the peak of live tensor bytes of all its stages together."""
    device_allocated_bytes: tuple[int, ...] = ()
    """Per rank, CUDA: the allocator's peak of allocated bytes over the timed steps (``max_memory_allocated``)."""
    device_reserved_bytes: tuple[int, ...] = ()
    """Per rank, CUDA: the allocator's peak of reserved bytes (``max_memory_reserved``)."""
    world_size: int | None = None
    """The processes that ran the plan: the job's under ``torchrun``, those started under ``processes``, 1 in a
    replay; None where the report does not record it."""
    job: JobReport | None = None
    """``torchrun`` only: each rank's node and local rank, each replica's slowest rank, each node's links and the
    gradient all-reduce per mesh dimension (planner/runtime/job_report.py)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", Schedule.parse(self.schedule))
        if isinstance(self.job, dict):
            object.__setattr__(self, "job", JobReport.from_dict(self.job))

    @property
    def speed_factor(self) -> float | None:
        """How many times slower the machine ran now than while profiling (the reference's ratio); None when
        either time is missing."""
        if self.reference_s and self.profile_reference_s:
            return self.reference_s / self.profile_reference_s
        return None

    @property
    def units_together_ratio(self) -> float | None:
        """How many times slower the ranks' units ran timed together than alone in this run; None unless both."""
        if self.reference_together_s and self.reference_s and self.reference == "units":
            return self.reference_together_s / self.reference_s
        return None

    @property
    def colocation_change(self) -> float | None:
        """:attr:`units_together_ratio` over the same while the co-location factor was learned: how much more the
        ranks slow each other now than then (1.0: as much). None unless both were measured."""
        now, then = self.units_together_ratio, self.learned_together_ratio
        return contention_change(now, then) if now is not None and then else None

    @property
    def iteration_error_pct(self) -> float:
        return _error_pct(self.measured_iteration_s, self.predicted_iteration_s)

    def at_profile_speed(self) -> VerifyReport:
        """This measurement brought to the machine's speed while profiling: every measured time divided by
        :attr:`speed_factor` (link time too, which does not scale: an approximation where links take a large
        share of the iteration). ``self`` when the speed was not measured both times. The fidelity benchmark
        reports its errors this way beside the errors as timed."""
        f = self.speed_factor
        if f is None:
            return self
        stages = tuple(
            replace(s, measured_forward_s=s.measured_forward_s / f, measured_backward_s=s.measured_backward_s / f)
            for s in self.stages
        )
        ranks = tuple(
            replace(
                r,
                measured_compute_s=r.measured_compute_s / f,
                measured_wait_s=r.measured_wait_s / f,
                measured_tail_s=r.measured_tail_s / f,
                measured_overhead_s=r.measured_overhead_s / f,
            )
            for r in self.ranks
        )
        return replace(
            self,
            measured_iteration_s=self.measured_iteration_s / f,
            busy_s=tuple(b / f for b in self.busy_s),
            stages=stages,
            ranks=ranks,
            reference_s=self.profile_reference_s,
            reference_together_s=None if self.reference_together_s is None else self.reference_together_s / f,
            speed_adjusted_iteration_s=self.predicted_iteration_s,
        )

    @property
    def speed_adjusted_error_pct(self) -> float | None:
        """The error against the prediction at the machine's speed now (every compute time times
        :attr:`speed_factor`); None without it. The verdict uses it where it is the smaller (:attr:`verdict_basis`)."""
        adjusted = self.speed_adjusted_iteration_s
        return None if adjusted is None else _error_pct(self.measured_iteration_s, adjusted)

    @property
    def verdict_basis(self) -> str:
        """Which iteration error the verdict uses: ``as timed`` or ``at the machine's speed``.

        The prediction is the plan at the machine's speed while profiling. A run passes when it matches that
        as timed, or when the speed reference, timed in the same ranks between the same steps, shows the
        machine moved by what separates them: the error that is left at the measured speed is then the
        model's. Both errors are printed; an error the reference does not explain fails both ways
        (docs/cost-model.md, "The machine's speed").

        Where the reference was the model's own units (a replay, or ranks that each timed their own), the error
        at their speed decides alone: the same computation timed the same way then and now leaves only what the
        plan composes (units into stages, the schedule, the ranks side by side, memory held), and an error as
        timed that happens to be small while the units ran at another speed hides one of those."""
        at_speed = self.speed_adjusted_error_pct
        if at_speed is not None and (self.reference == "units" or abs(at_speed) < abs(self.iteration_error_pct)):
            return "at the machine's speed"
        return "as timed"

    @property
    def verdict_error_pct(self) -> float:
        """The iteration error the verdict holds to the tolerance (:attr:`verdict_basis`)."""
        if self.verdict_basis == "as timed":
            return self.iteration_error_pct
        return cast(float, self.speed_adjusted_error_pct)

    @property
    def worst_stage(self) -> int:
        """The stage whose forward + backward time disagrees most with the plan."""
        return max(self.stages, key=lambda s: abs(s.error_pct)).index

    @property
    def worst_memory_stage(self) -> int | None:
        """The stage whose measured memory disagrees most with the plan; None when memory was not measured."""
        measured = [s for s in self.stages if s.memory_error_pct is not None]
        return max(measured, key=lambda s: abs(s.memory_error_pct or 0.0)).index if measured else None

    @property
    def memory_ok(self) -> bool:
        """Every measured stage within :attr:`memory_tolerance` of its prediction and under its capacity."""
        return all(
            abs(s.memory_error_pct) <= self.memory_tolerance * 100.0 and not s.over_capacity
            for s in self.stages
            if s.memory_error_pct is not None
        )

    @property
    def ok(self) -> bool:
        timing = abs(self.verdict_error_pct) <= self.tolerance * 100.0
        return timing and self.memory_ok and (self.numerics is None or self.numerics.ok)

    def to_dict(self) -> dict[str, Any]:
        data = {"format": VERIFY_REPORT_FORMAT, **asdict(self)}
        data["schedule"] = self.schedule.value
        for stage, d in zip(self.stages, data["stages"], strict=True):
            d["error_pct"] = stage.error_pct
            d["predicted_memory_bytes"] = stage.predicted_memory_bytes
            d["measured_memory_bytes"] = stage.measured_memory_bytes
            d["memory_error_pct"] = stage.memory_error_pct
            d["over_capacity"] = stage.over_capacity
        data.update(iteration_error_pct=self.iteration_error_pct, worst_stage=self.worst_stage, ok=self.ok)
        data.update(worst_memory_stage=self.worst_memory_stage, memory_ok=self.memory_ok)
        data.update(speed_factor=self.speed_factor, speed_adjusted_error_pct=self.speed_adjusted_error_pct)
        data.update(units_together_ratio=self.units_together_ratio, colocation_change=self.colocation_change)
        data.update(verdict_basis=self.verdict_basis, verdict_error_pct=self.verdict_error_pct)
        data["mismatch_reason"] = mismatch_reason(self)
        data["busy_s"] = list(self.busy_s)
        data["ranks"] = [asdict(r) for r in self.ranks]
        return data


def _fields_of(cls: type, data: Any) -> dict[str, Any]:
    """``data``'s entries that are ``cls``'s fields, lists as tuples: what ``to_dict`` derived is left out."""
    if not isinstance(data, dict):
        raise ValueError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}


def report_from_dict(data: Any) -> VerifyReport:
    """A report read back from its JSON (:meth:`VerifyReport.to_dict`); raises ValueError where it is not one."""
    try:
        found = _fields_of(VerifyReport, data)
        found["stages"] = tuple(StageReport(**_fields_of(StageReport, s)) for s in data["stages"])
        found["ranks"] = tuple(RankTime(**_fields_of(RankTime, r)) for r in data.get("ranks", ()))
        if isinstance(data.get("numerics"), dict):
            found["numerics"] = NumericsReport(**_fields_of(NumericsReport, data["numerics"]))
        return VerifyReport(**found)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a verify report: {exc}") from exc


def mismatch_reason(report: VerifyReport) -> str | None:
    """Where an iteration outside the tolerance comes from, in one line; None when it is within.

    Compute is the one part measured against its own profile, so the stages' errors say which side of the
    model is off: all of them one way (the machine, or co-location, not the boundaries), none (what the
    runtime adds around compute), or some (those stages' profile).
    """
    tolerance_pct = report.tolerance * 100.0
    if abs(report.verdict_error_pct) <= tolerance_pct:
        return None
    errors = [s.error_pct for s in report.stages]
    if all(e > tolerance_pct for e in errors) or all(e < -tolerance_pct for e in errors):
        low, high = min(abs(e) for e in errors), max(abs(e) for e in errors)
        span = f"{low:.0f} %" if round(low) == round(high) else f"{low:.0f}-{high:.0f} %"
        direction = "slower" if errors[0] > 0 else "faster"
        factor = report.speed_factor
        machine = "this machine runs at another speed than when the profile was made"
        if factor is not None:
            pace = f"{factor:.2f}x slower" if factor >= 1 else f"{1 / factor:.2f}x faster"
            what = "the model's units" if report.reference == "units" else "the speed reference"
            machine = f"the machine runs {pace} than when the profile was made ({what})"
        return (
            f"every stage computed {span} {direction} than profiled: {machine}, or this model's actions run "
            "slower in a pipeline than the calibration's co-location factor says; profile again on a quiet "
            "machine, or learn the model's own cost with `pipeplan calibrate --model` or `pipeplan tune`"
        )
    if all(abs(e) <= tolerance_pct for e in errors):
        where = " (see where the time went)" if report.ranks else ""
        return (
            f"the stages computed as profiled: the rest is outside compute, in waits, overhead or the step "
            f"tail{where}; `pipeplan calibrate --model` learns what this model's actions cost beyond compute"
        )
    worst = report.stages[report.worst_stage]
    return f"stage {worst.index} is off most ({worst.error_pct:+.1f} %): its profile does not describe how it runs here"


def memory_mismatch(report: VerifyReport) -> str | None:
    """What is wrong with the measured memory, in one line; None when every measured stage holds."""
    if report.memory_ok:
        return None
    over = [s for s in report.stages if s.over_capacity]
    if over:
        worst = max(over, key=lambda s: (s.measured_memory_bytes or 0) - (s.capacity_bytes or 0))
        return (
            f"stage {worst.index} peaked at {human_bytes(worst.measured_memory_bytes or 0)}, over the "
            f"{human_bytes(worst.capacity_bytes or 0)} the plan gave it"
        )
    worst_index = report.worst_memory_stage
    assert worst_index is not None
    worst = report.stages[worst_index]
    return (
        f"stage {worst.index} peaked at {human_bytes(worst.measured_memory_bytes or 0)} against "
        f"{human_bytes(worst.predicted_memory_bytes or 0)} predicted ({worst.memory_error_pct:+.1f} %, tolerance "
        f"{report.memory_tolerance * 100:.0f} %)"
    )


def _memory_parts(m: MemoryBreakdown) -> tuple[int, ...]:
    return (m.params, m.grads, m.optimizer, m.activations, m.transient, m.buffers, m.peak)


def format_memory(report: VerifyReport) -> list[str]:
    """The memory table: per stage, predicted / measured bytes by part and the peak's error; per rank, measured."""
    stages = [s for s in report.stages if s.memory_error_pct is not None]
    if not stages:
        return []
    headers = ["stage", "rank", "weights", "grads", "optimizer", "activations", "transient", "buffers", "peak", "error"]
    rows: list[list[object]] = []
    for s in stages:
        assert s.predicted_memory is not None and s.measured_memory is not None
        pairs = zip(_memory_parts(s.predicted_memory), _memory_parts(s.measured_memory), strict=True)
        cells = [f"{human_bytes(p)} / {human_bytes(m)}" for p, m in pairs]
        error = f"{s.memory_error_pct or 0.0:+.1f}%"
        if s.over_capacity:
            error += f" over {human_bytes(s.capacity_bytes or 0)}"
        rows.append([s.index, s.rank, *cells, error])
    lines = [
        f"memory per stage (predicted / measured; measured: peak of live tensor bytes in one step, by part at "
        f"that moment; tolerance {report.memory_tolerance * 100:.0f}%):",
        format_table(headers, rows, align=">>>>>>>>>>"),
    ]
    if report.rank_memory_bytes:
        lines.append("peak per rank (all its stages): " + ", ".join(human_bytes(b) for b in report.rank_memory_bytes))
    if report.device_allocated_bytes:
        lines.append(
            "cuda allocator per rank (allocated / reserved peak over the timed steps): "
            + ", ".join(
                f"{human_bytes(a)} / {human_bytes(r)}"
                for a, r in zip(report.device_allocated_bytes, report.device_reserved_bytes, strict=True)
            )
        )
    return lines


def _verdict_line(report: VerifyReport) -> str:
    """Which iteration error decides, and why (:attr:`VerifyReport.verdict_basis`)."""
    error, tolerance, at_speed = report.verdict_error_pct, report.tolerance * 100.0, report.speed_adjusted_error_pct
    if at_speed is None:
        return f"verdict: the error as timed, {error:+.1f}% (no speed reference was timed to set beside it)"
    if report.reference == "units":
        within = "within" if abs(error) <= tolerance else "outside"
        return (
            f"verdict: the error at the machine's speed, {error:+.1f}%, {within} {tolerance:.0f}% (as timed "
            f"{report.iteration_error_pct:+.1f}%): the model's units, timed between the same steps as the profile "
            "timed them, measured the machine's speed on this model's own work"
            + (" and the ranks' contention" if report.colocation_change is not None else "")
        )
    if abs(error) > tolerance:
        return (
            f"verdict: neither error is within {tolerance:.0f}% (as timed {report.iteration_error_pct:+.1f}%, at the "
            f"machine's speed {at_speed:+.1f}%): the machine's speed does not explain it"
        )
    if report.verdict_basis == "as timed":
        return f"verdict: the error as timed, {error:+.1f}%, within {tolerance:.0f}%"
    return (
        f"verdict: the error at the machine's speed, {error:+.1f}%, within {tolerance:.0f}% (as timed "
        f"{report.iteration_error_pct:+.1f}%): the speed reference, timed in the ranks between the same steps, "
        f"explains the rest"
    )


def _seconds(value: float) -> str:
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"


def _stage_lines(report: VerifyReport) -> list[str]:
    """The header and one row per stage: predicted and measured times and memory."""
    lines = [
        f"verify: {report.schedule}, {report.num_ranks} ranks, {report.num_microbatches} micro-batches, "
        f"mode {report.mode}, {report.steps} timed steps after {report.warmup} warm-up",
        f"{'stage':>5} {'rank':>4} {'fwd pred':>10} {'fwd meas':>10} {'bwd pred':>10} {'bwd meas':>10} "
        f"{'error':>8} {'mem pred':>10} {'mem meas':>10} {'mem err':>8}",
    ]
    for s in report.stages:
        pred = human_bytes(s.predicted_memory_bytes) if s.predicted_memory_bytes is not None else "-"
        meas = human_bytes(s.measured_memory_bytes) if s.measured_memory_bytes is not None else "-"
        err = f"{s.memory_error_pct:+.1f}%" if s.memory_error_pct is not None else "-"
        lines.append(
            f"{s.index:>5} {s.rank:>4} {s.predicted_forward_s * 1e3:>8.3f}ms {s.measured_forward_s * 1e3:>8.3f}ms "
            f"{s.predicted_backward_s * 1e3:>8.3f}ms {s.measured_backward_s * 1e3:>8.3f}ms "
            f"{s.error_pct:>+7.1f}% {pred:>10} {meas:>10} {err:>8}"
        )
    return lines


def _iteration_lines(report: VerifyReport) -> list[str]:
    """The iteration predicted and measured, and what the machine's speed and the ranks' contention say of it."""
    how = "simulated from measured stage times" if report.mode == "replay" else "measured between barriers"
    predicted_ms, measured_ms = report.predicted_iteration_s * 1e3, report.measured_iteration_s * 1e3
    lines = [
        f"iteration: predicted {predicted_ms:.3f} ms, {how} {measured_ms:.3f} ms "
        f"({report.iteration_error_pct:+.1f}%, tolerance {report.tolerance * 100:.0f}%); "
        f"worst stage {report.worst_stage}"
    ]
    adjusted = report.speed_adjusted_iteration_s
    if report.speed_factor and adjusted and report.reference_s and report.profile_reference_s:
        factor = report.speed_factor
        pace = f"{factor:.2f}x slower" if factor >= 1 else f"{1 / factor:.2f}x faster"
        what = (
            "the model's units (one micro-batch forward+backward each, added up)"
            if report.reference == "units"
            else "the speed reference"
        )
        lines.append(
            f"machine speed: {what} ran {pace} than while profiling ({_seconds(report.reference_s)} vs "
            f"{_seconds(report.profile_reference_s)}); the plan with its compute at that speed: "
            f"{adjusted * 1e3:.3f} ms ({report.speed_adjusted_error_pct:+.1f}%)"
        )
    together = report.units_together_ratio
    if together is not None:
        then = report.learned_together_ratio
        lines.append(
            f"ranks side by side: the same units timed with every rank at once ran {together:.2f}x their time alone"
            + (
                f" ({then:.2f}x when the co-location factor was learned): the prediction above is at that"
                f" co-location too ({report.colocation_change:.2f}x)"
                if then
                else " (the plan's co-location factor was not learned with it: not applied)"
            )
        )
    return lines


def _rank_lines(report: VerifyReport) -> list[str]:
    """Each rank's busy time, and where its time went (real processes only)."""
    lines = ["busy per rank: " + ", ".join(f"{b * 1e3:.3f} ms" for b in report.busy_s)]
    if not report.ranks:
        return lines
    lines.append(
        f"where the time went (ms, predicted / measured; step tail = gradient scaling + tied-gradient sum + "
        f"{report.optimizer} step + zero_grad, inside the timed iteration):"
    )
    lines.append(f"{'rank':>4} {'compute':>17} {'waiting':>17} {'overhead':>17} {'step tail':>17}")
    for r in report.ranks:
        pairs = (
            (r.predicted_compute_s, r.measured_compute_s),
            (r.predicted_wait_s, r.measured_wait_s),
            (r.predicted_overhead_s, r.measured_overhead_s),
            (r.predicted_tail_s, r.measured_tail_s),
        )
        lines.append(f"{r.rank:>4} " + " ".join(f"{p * 1e3:>8.2f} / {m * 1e3:<6.2f}" for p, m in pairs))
    return lines


def format_report(report: VerifyReport) -> str:
    """A human-readable table: predicted vs measured per stage and for the iteration."""
    lines = [*_stage_lines(report), *_iteration_lines(report), _verdict_line(report), *_rank_lines(report)]
    if report.numerics is not None:
        n = report.numerics
        lines.append(
            f"numerics: {'ok' if n.ok else 'MISMATCH'} (loss diff {n.loss_abs_diff:.2e}, max grad diff "
            f"{n.max_grad_abs_diff:.2e} at {n.worst_parameter or '-'}; atol {n.atol:g}, rtol {n.rtol:g})"
        )
    lines.extend(format_memory(report))
    if report.job is not None:
        lines.extend(format_job(report.job, report.world_size or len(report.job.places)))
    reason = mismatch_reason(report)
    if reason is not None:
        lines.append(f"why: {reason}")
    memory = memory_mismatch(report)
    if memory is not None:
        lines.append(f"memory: {memory}")
    lines.append("result: " + ("ok" if report.ok else "MISMATCH"))
    return "\n".join(lines)
