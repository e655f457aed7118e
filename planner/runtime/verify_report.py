"""The report of a verify run: what :func:`planner.runtime.verify.verify_plan` measured beside what the plan
predicted, per stage, per rank and for the iteration, and the numerics check; its JSON form
(:meth:`VerifyReport.to_dict`, what ``pipeplan verify --out`` writes), its table (:func:`format_report`) and the
one-line diagnosis of a mismatch (:func:`mismatch_reason`).

A module of its own so that what only reads reports (the calibration refit, tune, the benchmarks re-evaluating a
stored run) imports neither torch nor the code that runs ranks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from planner.schedule.orders import Schedule

__all__ = [
    "NUMERICS_ATOL",
    "NUMERICS_RTOL",
    "StageReport",
    "NumericsReport",
    "RankTime",
    "VerifyReport",
    "mismatch_reason",
    "format_report",
]

NUMERICS_ATOL = 1e-5
NUMERICS_RTOL = 1e-4


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
    peak_memory_bytes: int | None
    """CUDA allocator peak of the stage's device, or the process's resident peak (``memory_kind``)."""

    @property
    def error_pct(self) -> float:
        """Error of forward + backward, measured against predicted, in percent."""
        return _error_pct(
            self.measured_forward_s + self.measured_backward_s, self.predicted_forward_s + self.predicted_backward_s
        )


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


@dataclass(frozen=True)
class VerifyReport:
    mode: str
    """``processes`` or ``replay``."""
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
    """``cuda`` (allocator peak), ``rss`` (process resident peak) or ``rss-process`` (replay: all stages)."""
    numerics: NumericsReport | None = None
    optimizer: str = "adam"
    """The optimizer stepped inside each timed iteration."""
    ranks: tuple[RankTime, ...] = ()
    reference_s: float | None = None
    """The speed reference's median forward+backward (profiles/reference.py) during this run, timed after
    each timed step (processes: on every rank in turn, the median of the ranks' medians)."""
    profile_reference_s: float | None = None
    """The same while the profile was made (the plan's ``device.reference_s``; None in older plans)."""
    speed_adjusted_iteration_s: float | None = None
    """The prediction at the machine's speed during this run: the plan simulated with every compute time
    (stages, per-action overhead, step tails; not the links) times :attr:`speed_factor`. None without it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", Schedule.parse(self.schedule))

    @property
    def speed_factor(self) -> float | None:
        """How many times slower the machine ran now than while profiling (the reference's ratio); None when
        either time is missing."""
        if self.reference_s and self.profile_reference_s:
            return self.reference_s / self.profile_reference_s
        return None

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
            speed_adjusted_iteration_s=self.predicted_iteration_s,
        )

    @property
    def speed_adjusted_error_pct(self) -> float | None:
        """The error against the prediction at the machine's speed now (every compute time times
        :attr:`speed_factor`); None without it. A diagnostic, not the verdict: the reference tracked one
        gpt2-tiny stage run alone, but not every model's pipeline (docs/cost-model.md, "The machine's speed")."""
        adjusted = self.speed_adjusted_iteration_s
        return None if adjusted is None else _error_pct(self.measured_iteration_s, adjusted)

    @property
    def worst_stage(self) -> int:
        """The stage whose forward + backward time disagrees most with the plan."""
        return max(self.stages, key=lambda s: abs(s.error_pct)).index

    @property
    def ok(self) -> bool:
        timing = abs(self.iteration_error_pct) <= self.tolerance * 100.0
        return timing and (self.numerics is None or self.numerics.ok)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["schedule"] = self.schedule.value
        for stage, d in zip(self.stages, data["stages"], strict=True):
            d["error_pct"] = stage.error_pct
        data.update(iteration_error_pct=self.iteration_error_pct, worst_stage=self.worst_stage, ok=self.ok)
        data.update(speed_factor=self.speed_factor, speed_adjusted_error_pct=self.speed_adjusted_error_pct)
        data["mismatch_reason"] = mismatch_reason(self)
        data["busy_s"] = list(self.busy_s)
        data["ranks"] = [asdict(r) for r in self.ranks]
        return data


def mismatch_reason(report: VerifyReport) -> str | None:
    """Where an iteration outside the tolerance comes from, in one line; None when it is within.

    Compute is the one part measured against its own profile, so the stages' errors say which side of the
    model is off: all of them one way (the machine, or co-location, not the boundaries), none (what the
    runtime adds around compute), or some (those stages' profile).
    """
    tolerance_pct = report.tolerance * 100.0
    if abs(report.iteration_error_pct) <= tolerance_pct:
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
            machine = f"the machine runs {pace} than when the profile was made (the speed reference)"
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


def format_report(report: VerifyReport) -> str:
    """A human-readable table: predicted vs measured per stage and for the iteration."""
    mem = {"cuda": "peak mem (cuda)", "rss": "peak mem (rss)", "rss-process": "rss (process)"}[report.memory_kind]
    lines = [
        f"verify: {report.schedule}, {report.num_ranks} ranks, {report.num_microbatches} micro-batches, "
        f"mode {report.mode}, {report.steps} timed steps after {report.warmup} warm-up",
        f"{'stage':>5} {'rank':>4} {'fwd pred':>10} {'fwd meas':>10} {'bwd pred':>10} {'bwd meas':>10} "
        f"{'error':>8} {mem:>16}",
    ]
    for s in report.stages:
        peak = f"{s.peak_memory_bytes / 2**20:.1f} MiB" if s.peak_memory_bytes is not None else "-"
        lines.append(
            f"{s.index:>5} {s.rank:>4} {s.predicted_forward_s * 1e3:>8.3f}ms {s.measured_forward_s * 1e3:>8.3f}ms "
            f"{s.predicted_backward_s * 1e3:>8.3f}ms {s.measured_backward_s * 1e3:>8.3f}ms "
            f"{s.error_pct:>+7.1f}% {peak:>16}"
        )
    how = "simulated from measured stage times" if report.mode == "replay" else "measured between barriers"
    predicted_ms, measured_ms = report.predicted_iteration_s * 1e3, report.measured_iteration_s * 1e3
    lines.append(
        f"iteration: predicted {predicted_ms:.3f} ms, {how} {measured_ms:.3f} ms "
        f"({report.iteration_error_pct:+.1f}%, tolerance {report.tolerance * 100:.0f}%); "
        f"worst stage {report.worst_stage}"
    )
    adjusted = report.speed_adjusted_iteration_s
    if report.speed_factor and adjusted and report.reference_s and report.profile_reference_s:
        factor = report.speed_factor
        pace = f"{factor:.2f}x slower" if factor >= 1 else f"{1 / factor:.2f}x faster"
        lines.append(
            f"machine speed: the speed reference ran {pace} than while profiling ({report.reference_s * 1e3:.2f} vs "
            f"{report.profile_reference_s * 1e3:.2f} ms); the plan with its compute at that speed: "
            f"{adjusted * 1e3:.3f} ms ({report.speed_adjusted_error_pct:+.1f}%; a diagnostic, not the verdict)"
        )
    lines.append("busy per rank: " + ", ".join(f"{b * 1e3:.3f} ms" for b in report.busy_s))
    if report.ranks:
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
    if report.numerics is not None:
        n = report.numerics
        lines.append(
            f"numerics: {'ok' if n.ok else 'MISMATCH'} (loss diff {n.loss_abs_diff:.2e}, max grad diff "
            f"{n.max_grad_abs_diff:.2e} at {n.worst_parameter or '-'}; atol {n.atol:g}, rtol {n.rtol:g})"
        )
    reason = mismatch_reason(report)
    if reason is not None:
        lines.append(f"why: {reason}")
    lines.append("result: " + ("ok" if report.ok else "MISMATCH"))
    return "\n".join(lines)
