"""``pipeplan calibrate --from-run``: the user's runs teach the plan.

Each run record (docs/run-record.md) is a real job's steps measured against its plan. Its report
(:func:`~planner.runtime.run_record.record_report`, the one ``verify`` builds) goes through the same refit as
``tune`` and ``calibrate --model`` (:func:`~planner.runtime.tune.refit_calibration`): the co-location factor (the
stages' compute speed in the pipeline against the profile) from the ranks' measured compute, each measured
schedule's per-action overhead from the measured iteration (the others shifted by as much), the optimizer's cost
from the measured step tails. Unlike ``tune``'s, the overhead is not capped at what the ranks measured outside
compute: the run is the plan that will run again, and what the other terms leave of its iteration (the waits of
ranks that share cores, say) is its to pay. Like ``calibrate --model``, every run is first brought to the
machine's speed while profiling (the speed reference each rank timed when the record was gathered, against the
plan's ``device.reference_s``), so that a slow hour of the machine is not learned as the model's cost.

The links (point-to-point bandwidth and latency, per mesh dimension) are not refit: a training loop's waits on
its transfers hold its bubbles too, and no sample of a run separates the two.

Each run is then checked: its plan predicted under the calibration it started from and under the refit one,
both held against what it measured at the machine's speed (verify's verdict); a run outside the tolerance says
which term moved most, by how much each refit term alone moves that plan's prediction.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.calibration import Calibration
from planner.errors import UsageError
from planner.formatting import human_seconds
from planner.plan import Plan
from planner.runtime.run_record import RunRecord, record_report
from planner.runtime.tune import refit_calibration
from planner.runtime.verify_report import VerifyReport
from planner.schedule.pipeline import RuntimeTerms

__all__ = ["TermMove", "RunCheck", "RunRefit", "refit_from_runs", "refit_terms", "under_terms", "format_run_refit"]


@dataclass(frozen=True)
class TermMove:
    """One runtime term, before and after the refit, and what the change alone does to a run's prediction."""

    name: str
    before: float
    after: float
    unit: str
    """``x`` (a factor) or ``s`` (seconds)."""
    effect_s: float
    """The run's predicted iteration with this term alone refit, less its prediction before."""


@dataclass(frozen=True)
class RunCheck:
    """One run held against its plan as predicted before the refit and after it."""

    label: str
    before: VerifyReport
    after: VerifyReport
    moves: tuple[TermMove, ...]

    @property
    def most_moved(self) -> TermMove:
        return max(self.moves, key=lambda m: abs(m.effect_s))


@dataclass(frozen=True)
class RunRefit:
    start: Calibration
    calibration: Calibration
    """``start`` refit from the runs (``source`` ``refit``, ``notes.model`` the runs' model)."""
    checks: tuple[RunCheck, ...]
    tolerance: float


def _tail_factor(after: Calibration) -> float:
    refit = after.notes.get("refit", {})
    return float(refit.get("optimizer_factor", 1.0)) if isinstance(refit, dict) else 1.0


def refit_terms(plan: Plan, after: Calibration, tail_factor: float | None = None) -> RuntimeTerms:
    """``plan``'s runtime terms with what ``after`` (refit from runs) sets for it: the per-action overhead of its
    schedule at its stages per rank and micro-batch count, the co-location factor at its micro-batch size, the
    step tails times the refit's optimizer factor (the fit scaled the measured tails as a whole)."""
    terms = plan.predicted.runtime
    factor = _tail_factor(after) if tail_factor is None else tail_factor
    return replace(
        terms,
        action_overhead_s=after.overhead_for(plan.schedule, plan.virtual_stages, plan.num_microbatches),
        compute_scale=after.colocation_for(plan.micro_batch_size),
        step_tail_s=tuple(t * factor for t in terms.step_tail_s),
    )


def under_terms(plan: Plan, terms: RuntimeTerms, label: str) -> Plan:
    """``plan`` with its prediction simulated again under ``terms`` (same stages, links and schedule)."""
    sim = plan.simulation(terms)
    predicted = replace(
        plan.predicted,
        iteration_s=sim.iteration_s,
        bubble_fraction=sim.bubble_fraction,
        samples_per_s=plan.global_batch_size / sim.iteration_s,
        bottleneck_stage=sim.bottleneck_stage,
        busy_s=tuple(sim.busy_s),
        calibration=label,
        runtime=replace(terms, step_tail_s=tuple(sim.step_tail_s)),
        overhead_s=tuple(sim.overhead_s),
        comm_wait_s=tuple(sim.comm_wait_s),
    )
    return replace(plan, predicted=predicted)


def _anchored(refit: Calibration, start: Calibration, plans: Sequence[Plan]) -> Calibration:
    """``refit`` with its per-size co-location factors moved so that the size the runs ran at gets the fitted
    factor: ``refit_calibration`` fits one absolute factor for the runs and moves the other sizes' by its ratio to
    ``start.colocation_factor``, which is the factor of the size ``start`` was learned at, not of the runs'."""
    sizes = {p.micro_batch_size for p in plans}
    if not start.colocation_factor_by_micro_batch_size or len(sizes) != 1:
        return refit
    ratio = refit.colocation_factor / start.colocation_for(sizes.pop())
    return replace(
        refit,
        colocation_factor=start.colocation_factor * ratio,
        colocation_factor_by_micro_batch_size={
            b: k * ratio for b, k in start.colocation_factor_by_micro_batch_size.items()
        },
    )


def refit_from_runs(
    records: Sequence[RunRecord],
    start: Calibration,
    *,
    warmup: int = 1,
    tolerance: float = 0.15,
    labels: Sequence[str] = (),
) -> RunRefit:
    """``start`` refit from ``records`` (module docstring), and each run checked before and after.

    Raises:
        UsageError: no record, records of different models, a calibration of another device kind, or a record
            with too few steps (:func:`~planner.runtime.run_record.rank_results`).
    """
    if not records:
        raise UsageError("--from-run needs at least one run record")
    models = {(r.plan.model_name, r.plan.model_fingerprint) for r in records}
    if len(models) > 1:
        names = ", ".join(sorted(name for name, _ in models))
        raise UsageError(f"the run records are of different models ({names}): a calibration learns one model's costs")
    for record in records:
        start.check_device(str(record.plan.device.get("kind", "cpu")))
    reports = [record_report(r, warmup=warmup, tolerance=tolerance) for r in records]
    runs = [(r.plan, rep.at_profile_speed()) for r, rep in zip(records, reports, strict=True)]
    # Uncapped (module docstring): the refit must reproduce the job's own iteration.
    refit = refit_calibration(start, runs, capped=False)
    refit = _anchored(refit, start, [r.plan for r in records])
    first = records[0].plan
    refit = refit.learned_from(
        first.model_name,
        first.model_fingerprint,
        runs=len(records),
        from_runs=[r.plan_sha256 for r in records],
        measured_s=[rep.measured_iteration_s for rep in reports],
        steps=[rep.steps for rep in reports],
    )
    names = list(labels) or [f"run {k + 1}" for k in range(len(records))]
    checks = tuple(
        _check(name, record, before, refit, warmup, tolerance)
        for name, record, before in zip(names, records, reports, strict=True)
    )
    return RunRefit(start, refit, checks, tolerance)


def _check(
    label: str, record: RunRecord, before: VerifyReport, after: Calibration, warmup: int, tolerance: float
) -> RunCheck:
    plan = record.plan
    refit = under_terms(plan, refit_terms(plan, after), "refit from runs")
    report = record_report(record, warmup=warmup, tolerance=tolerance, plan=refit)
    terms = plan.predicted.runtime
    new = refit_terms(plan, after)

    def effect(**changed: object) -> float:
        return plan.simulation(replace(terms, **changed)).iteration_s - plan.predicted.iteration_s

    factor = _tail_factor(after)
    moves = (
        TermMove("co-location", terms.compute_scale, new.compute_scale, "x", effect(compute_scale=new.compute_scale)),
        TermMove(
            f"{plan.schedule.value} overhead per action",
            terms.action_overhead_s,
            new.action_overhead_s,
            "s",
            effect(action_overhead_s=new.action_overhead_s),
        ),
        TermMove("step tail", 1.0, factor, "x", effect(step_tail_s=new.step_tail_s)),
    )
    return RunCheck(label, before, report, moves)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _move_text(m: TermMove) -> str:
    values = f"{m.before:.3f} -> {m.after:.3f}" if m.unit == "x" else f"{m.before * 1e3:.3f} -> {m.after * 1e3:.3f} ms"
    return f"{m.name} {values} ({'+' if m.effect_s >= 0 else '-'}{human_seconds(abs(m.effect_s))} on this plan)"


def format_run_refit(result: RunRefit) -> str:
    """Each run: measured against its prediction before and after the refit, the terms the refit moved, and where
    a run was outside the tolerance, which term moved most."""
    lines = []
    for check in result.checks:
        b, a = check.before, check.after
        speed = "-" if b.speed_factor is None else f"x{b.speed_factor:.2f}"
        over = abs(b.verdict_error_pct) > result.tolerance * 100
        lines.append(
            f"{check.label}: {b.schedule.value}, {b.num_ranks} ranks x {b.num_microbatches} micro-batches, "
            f"{b.steps} steps: measured {human_seconds(b.measured_iteration_s)}, predicted "
            f"{human_seconds(b.predicted_iteration_s)}: {_pct(b.verdict_error_pct)} ({b.verdict_basis}; "
            f"machine speed {speed})"
            + (f": the profile's prediction and this run disagree by more than {result.tolerance:.0%}" if over else "")
        )
        lines.append("  refit: " + "; ".join(_move_text(m) for m in check.moves))
        if over:
            lines.append(f"  the term that moved most: {check.most_moved.name}")
        lines.append(
            f"  predicted with the refit calibration: {human_seconds(a.predicted_iteration_s)}: "
            f"{_pct(a.verdict_error_pct)} ({a.verdict_basis})"
        )
    errors = [abs(c.after.verdict_error_pct) for c in result.checks]
    lines.append(f"refit error, median over {len(errors)} run(s): {statistics.median(errors):.1f}%")
    return "\n".join(lines)
