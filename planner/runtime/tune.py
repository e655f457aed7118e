"""``pipeplan tune``: close the loop. Run the planner's best candidates for real, learn, keep the fastest.

1. The planner's ``K`` best *distinct* plans (schedule, virtual stages, micro-batching, boundaries,
   recomputation) under the current calibration.
2. Each runs for real: on processes (cores or GPUs for every rank) all of them in one launch, interleaved
   round by round (:func:`planner.runtime.interleave.verify_plans`), and ranked by their ratios to the first
   candidate, the median over rounds, which hold while the machine's speed moves; otherwise one at a time
   (:func:`planner.runtime.verify.verify_plan`, the one-process replay), ranked by their medians.
3. The calibration is refit from what was measured (processes mode; replay measures compute only):
   - co-location factor: the one for which the simulated compute of every rank of every candidate adds up
     to the measured compute (bisection; the factor scales every action of the pipeline, docs/cost-model.md);
   - per-action overhead of each measured schedule: the value for which the simulator, with the refit
     factor, reproduces the measured iteration (bisection, as ``calibrate`` does), median over that
     schedule's candidates; unmeasured schedules shift by the median change of the measured ones
     (added, not multiplied: the change is the model's own per-action cost, which every schedule pays);
   - optimizer: scaled by the median measured / predicted step tail.
4. The search runs again with the refit calibration; its best plan is measured too if it is new (on
   processes, interleaved with the fastest so far).
5. The plan that *measured* fastest is written with its ``measured`` block and the refit prediction,
   and the refit calibration beside it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.calibration import Calibration, OptimizerCost
from planner.errors import UsageError
from planner.plan import Measurement, Plan
from planner.prediction import predict_plan, repredicted_plan
from planner.request import PlanRequest
from planner.runtime.calibrate import fit_overhead, solve_increasing
from planner.runtime.interleave import rounds_within, verify_plans
from planner.runtime.run_options import TuneOptions, VerifyOptions
from planner.runtime.verify import pick_mode, verify_plan
from planner.runtime.verify_report import VerifyReport
from planner.schedule.orders import Schedule
from planner.schedule.simulate import SimulationResult
from planner.search import make_plans, plan_key
from profiles.format import Profile

__all__ = [
    "TunedCandidate",
    "TuneResult",
    "tune",
    "refit_calibration",
    "format_tune_table",
    "overhead_cap",
]


INTERLEAVED_BUDGET_S = 30.0
"""About how long each interleaved launch of candidates times steps (:func:`rounds_within`; never fewer rounds
than ``steps``): a round's ratio of two of mlp's plans ranged 0.65-0.91 within a minute on the development VM,
and a median over many rounds is what holds (:mod:`planner.runtime.model_cost`)."""

INTERLEAVED_MAX_ROUNDS = 30


@dataclass(frozen=True)
class TunedCandidate:
    plan: Plan
    """As first planned (prediction under the starting calibration)."""
    report: VerifyReport
    refit_predicted_s: float
    """The same plan's prediction under the refit calibration."""
    relative: float
    """Its iteration over the first candidate's: the median over interleaved rounds of their ratio (runs on
    processes), else the ratio of their medians."""

    @property
    def measured_s(self) -> float:
        return self.report.measured_iteration_s


@dataclass(frozen=True)
class TuneResult:
    best: Plan
    """The fastest measured plan, with its refit prediction and ``measured`` block."""
    calibration: Calibration
    """The refit calibration."""
    candidates: tuple[TunedCandidate, ...]


def _label(plan: Plan) -> str:
    v = f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    recompute = "".join("r" if s.recompute else "-" for s in plan.stages)
    return f"{plan.schedule.value}{v}, b={plan.micro_batch_size} x {plan.num_microbatches}, recompute {recompute}"


def _simulate_with(plan: Plan, compute_scale: float, overhead_s: float, tail_factor: float) -> SimulationResult:
    """The plan under other runtime terms (stage times in a plan are the profiled, unscaled ones)."""
    terms = plan.predicted.runtime
    tails = tuple(t * tail_factor for t in terms.step_tail_s)
    return plan.simulation(replace(terms, action_overhead_s=overhead_s, step_tail_s=tails, compute_scale=compute_scale))


def _fit_colocation(measured: list[tuple[Plan, VerifyReport]], overheads: list[float], start: float) -> float:
    """The co-location factor whose simulated compute matches the measured compute, summed over the runs."""
    target = sum(r.measured_compute_s for _, rep in measured for r in rep.ranks)

    def simulated(k: float) -> float:
        return sum(sum(_simulate_with(p, k, o, 1.0).busy_s) for (p, _), o in zip(measured, overheads, strict=True))

    return solve_increasing(simulated, target, 1.0, 2.0, limit=1e3) if target > 0 else start


OVERHEAD_SLACK = 2.0
"""How far past what the ranks measured outside compute, waits and the step tail, per action, a refit may set the
per-action overhead (:func:`overhead_cap`)."""


def overhead_cap(plan: Plan, report: VerifyReport, start_s: float) -> float:
    """The largest per-action overhead one run can teach: :data:`OVERHEAD_SLACK` x the ranks' measured overhead
    per action (median over ranks), or the calibration's own where that is more; unbounded where the run did
    not measure it.

    The overhead is fitted to the iteration, so any miss of the model lands in it: on llama-small's 1F1B run
    (b = 4 x 4, about 0.2 s actions) a 6 % miss became 8-13 ms per action while its ranks measured about 2 ms
    outside compute and waits, and the zero-bubble plan it then predicted was 20 % off (`python
    benchmarks/bench_default_path.py`). A miss of large actions is not a per-action cost."""
    measured = [r.measured_overhead_s for r in report.ranks]
    if not any(m > 0 for m in measured):
        return math.inf
    actions = Counter(a.rank for a in plan.simulation().actions if a.kind != "S")
    per_action = statistics.median(r.measured_overhead_s / max(1, actions[r.rank]) for r in report.ranks)
    return max(start_s, OVERHEAD_SLACK * per_action)


def _fit_runtime(
    calibration: Calibration, measured: list[tuple[Plan, VerifyReport]], tail_factor: float, capped: bool = True
) -> tuple[float, list[float]]:
    """The co-location factor and each run's per-action overhead that, together, reproduce the measured runs
    (each overhead at most :func:`overhead_cap` when ``capped``)."""
    # The factor and the overheads depend on each other (overhead moves actions, hence the waits the
    # overhead fit sees): alternate the two fits; a few rounds settle them.
    per_run = [calibration.overhead_for(plan.schedule, plan.virtual_stages) for plan, _ in measured]
    caps = [
        overhead_cap(plan, report, start) if capped else math.inf
        for (plan, report), start in zip(measured, per_run, strict=True)
    ]
    scale = calibration.colocation_factor
    # A rank of a multi-stage schedule runs twice the actions on stages half as deep: what each action costs
    # beyond its compute inside torch's forward_one_chunk / backward_one_chunk (argument flattening, hooks) is
    # timed as compute there, and would read as co-location. On mlp (P = 2, b = 4) its interleaved,
    # looped-bfs, zbv and dualpipev runs measured 21-66 % more compute than profiled where its 1F1B and
    # GPipe runs measured -14..+17 %; one factor fitted to all seven put 1F1B 46 % over its run. Where there are
    # runs of one stage per rank, the factor is theirs; the overhead fit absorbs the rest.
    single = [k for k, (plan, _) in enumerate(measured) if plan.virtual_stages == 1] or list(range(len(measured)))
    for _ in range(4):
        scale = _fit_colocation([measured[k] for k in single], [per_run[k] for k in single], scale)
        per_run = [
            min(
                cap,
                fit_overhead(
                    report.measured_iteration_s,
                    lambda o, p=plan, k=scale: _simulate_with(p, k, o, tail_factor).iteration_s,
                ),
            )
            for (plan, report), cap in zip(measured, caps, strict=True)
        ]
    return scale, per_run


def _refit_overheads(
    calibration: Calibration, measured: list[tuple[Plan, VerifyReport]], per_run: list[float]
) -> Calibration:
    """``calibration`` with its per-action overheads refit from each run's: a measured schedule takes the median
    of its runs', the others shift by the measured ones' median change."""
    by_schedule: dict[str, list[float]] = {}
    by_multi: dict[str, list[float]] = {}  # the schedules whose plans with several stages a rank cost their own
    for (plan, _), overhead in zip(measured, per_run, strict=True):
        apart = plan.virtual_stages > 1 and plan.schedule.value in calibration.multi_stage_overhead_s
        (by_multi if apart else by_schedule).setdefault(plan.schedule.value, []).append(overhead)
    multi = {**calibration.multi_stage_overhead_s, **{k: statistics.median(v) for k, v in by_multi.items()}}
    # A schedule refit here has one value, from these runs; one that was not keeps its counts, shifted below.
    multi_by_count = {k: v for k, v in calibration.multi_stage_overhead_by_microbatches_s.items() if k not in by_multi}
    overheads = dict(calibration.action_overhead_s)
    shifts = []
    for name, values in by_schedule.items():
        new = statistics.median(values)
        shifts.append(new - calibration.overhead_for(Schedule(name)))
        overheads[name] = new
    # What a run adds to the calibration is mostly its model's own per-action cost (real-sized actions
    # slow down in a pipeline; the calibration's stages are one tiny Linear), which every action pays
    # whatever the schedule: shift the others by it. A ratio also multiplied interleaving's larger
    # bookkeeping and predicted its plans 26-43 % too slow from one 1F1B run (docs/BENCHMARKS.md, section 6,
    # "Fidelity"); the shift, within 15 %.
    shift = statistics.median(shifts) if shifts else 0.0
    for name in overheads:
        if name not in by_schedule:
            overheads[name] = max(overheads[name] + shift, 0.0)
    by_count = {
        name: {m: max(v + shift, 0.0) for m, v in values.items()}
        for name, values in calibration.action_overhead_by_microbatches_s.items()
        if name not in by_schedule
    }
    return replace(
        calibration,
        action_overhead_s=overheads,
        multi_stage_overhead_s=multi,
        action_overhead_by_microbatches_s=by_count,
        multi_stage_overhead_by_microbatches_s=multi_by_count,
    )


def refit_calibration(
    calibration: Calibration, runs: list[tuple[Plan, VerifyReport]], *, capped: bool = True
) -> Calibration:
    """Refit ``calibration`` from measured runs (module docstring, step 3); replay runs change nothing.

    ``capped``: no run's per-action overhead past :func:`overhead_cap`, which keeps a miss of large actions out of
    what the other schedules are shifted by. Without it (``calibrate --from-run``: a job's own plan, which the
    refit must reproduce) the overhead takes whatever of the iteration the other terms leave."""
    measured = [(p, r) for p, r in runs if r.mode == "processes" and r.ranks]
    if not measured:
        return calibration
    tails = [r.measured_tail_s / r.predicted_tail_s for _, rep in measured for r in rep.ranks if r.predicted_tail_s > 0]
    tail_factor = statistics.median(tails) if tails else 1.0
    scale, per_run = _fit_runtime(calibration, measured, tail_factor, capped)
    optimizer = {
        k: OptimizerCost(v.per_param_s * tail_factor, v.per_step_s * tail_factor, v.per_tensor_s * tail_factor)
        for k, v in calibration.optimizer.items()
    }
    notes = dict(calibration.notes)
    notes["refit"] = {
        "runs": len(measured),
        "colocation_factor_was": calibration.colocation_factor,
        "action_overhead_s_was": dict(calibration.action_overhead_s),
        "optimizer_factor": tail_factor,
    }
    return replace(
        _refit_overheads(calibration, measured, per_run),
        colocation_factor=scale,
        # The other sizes' factors move with the one refit here (they were learned as ratios to it).
        colocation_factor_by_micro_batch_size={
            b: k * scale / calibration.colocation_factor
            for b, k in calibration.colocation_factor_by_micro_batch_size.items()
        },
        optimizer=optimizer,
        units_together_ratio=_units_together_ratio(measured) or calibration.units_together_ratio,
        source="refit",
        notes=notes,
    )


def _units_together_ratio(runs: list[tuple[Plan, VerifyReport]]) -> float | None:
    """The median over ``runs`` of their units timed together over alone: the contention the refit factor holds."""
    ratios = [r.units_together_ratio for _, r in runs if r.units_together_ratio is not None]
    return statistics.median(ratios) if ratios else None


@dataclass
class _Runs:
    """The candidates run so far, each with its iteration relative to the first candidate's."""

    model: str
    steps: int
    warmup: int
    mode: str
    device: str
    timeout_s: float
    interleaved: bool
    """All on processes, in one launch, interleaved round by round (module docstring, step 2)."""
    progress: Callable[[str], None]
    runs: list[tuple[Plan, VerifyReport]] = field(default_factory=list)
    relative: list[float] = field(default_factory=list)

    def measure(self, batch: list[Plan], versus: int | None = None) -> None:
        """Run ``batch`` (with the candidate ``versus`` first, when given) and add each plan's run and its
        iteration relative to the first candidate."""
        if self.interleaved:
            self._measure_interleaved(batch, versus)
        else:
            self._measure_each(batch)

    def _measure_each(self, batch: list[Plan]) -> None:
        """One launch per plan, ranked by the ratio of medians."""
        for plan in batch:
            self.progress(f"running {_label(plan)}")
            report = verify_plan(
                plan,
                self.model,
                VerifyOptions(
                    steps=self.steps,
                    warmup=self.warmup,
                    mode=self.mode,
                    device=self.device,
                    timeout_s=self.timeout_s,
                    tolerance=0.25,
                ),
            )
            self.runs.append((plan, report))
            first = self.runs[0][1].measured_iteration_s
            self.relative.append(report.measured_iteration_s / first)

    def _measure_interleaved(self, batch: list[Plan], versus: int | None) -> None:
        """One launch for the batch and the anchor, ranked by the median over rounds of their ratios."""
        anchor = [] if versus is None else [self.runs[versus][0]]
        launch = [*anchor, *batch]
        rounds = rounds_within(launch, INTERLEAVED_BUDGET_S, at_least=self.steps, at_most=INTERLEAVED_MAX_ROUNDS)
        for _ in batch:
            self.progress(f"running {len(launch)} plans interleaved, {rounds} rounds")
        timeout = self.timeout_s * len(launch)  # the budget is per candidate
        run = verify_plans(launch, self.model, rounds=rounds, warmup=self.warmup, device=self.device, timeout_s=timeout)
        scale = 1.0 if versus is None else self.relative[versus]
        for k, plan in enumerate(batch, start=len(anchor)):
            self.runs.append((plan, run.reports[k]))
            self.relative.append(scale * run.ratio(k, 0))

    def fastest(self) -> int:
        """The index of the run that measured fastest."""
        return min(range(len(self.runs)), key=self.relative.__getitem__)


def _with_measurement(best: Plan, measured: VerifyReport) -> Plan:
    """``best`` with its ``measured`` block: the run's times and their error against its prediction."""
    error = (measured.measured_iteration_s - best.predicted.iteration_s) / best.predicted.iteration_s * 100.0
    return replace(
        best,
        measured=Measurement(
            mode=measured.mode,
            iteration_s=measured.measured_iteration_s,
            forward_s=tuple(s.measured_forward_s for s in measured.stages),
            backward_s=tuple(s.measured_backward_s for s in measured.stages),
            steps=measured.steps,
            error_pct=error,
            speed_factor=measured.speed_factor,
        ),
    )


def tune(
    profile: Profile,
    request: PlanRequest,
    model: str,
    options: TuneOptions | None = None,
    *,
    sha256: str,
    on_progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Measure the ``options.candidates`` best distinct plans, refit the calibration, re-plan, keep the fastest
    measured (``options``: :class:`~planner.runtime.run_options.TuneOptions`, ``pipeplan tune``'s; None: its
    defaults).

    ``request.settings.calibration`` is the starting point (the shipped one when None is given by the CLI).

    Raises:
        UsageError: ``candidates < 1`` or no calibration to start from.
        ExecutionError / ModelMismatchError: a run failed or the model is not the profile's.
    """
    options = options or TuneOptions()
    candidates, steps, warmup, mode = options.candidates, options.steps, options.warmup, options.mode
    device, timeout_s = options.device, options.timeout_s
    if candidates < 1:
        raise UsageError(f"--candidates must be >= 1, got {candidates}")
    start = request.settings.calibration
    if start is None:
        raise UsageError("tune needs a calibration to start from (--calibration auto or a file)")
    plans = make_plans(profile, request, sha256=sha256, count=candidates)
    interleaved = all(pick_mode(mode, p, device) == "processes" and p.mesh is None for p in plans)
    progress = on_progress or (lambda _text: None)
    measured = _Runs(model, steps, warmup, mode, device, timeout_s, interleaved, progress)
    measured.measure(plans)
    refit = refit_calibration(start, measured.runs)
    if refit is not start:
        refit = refit.learned_from(profile.model.name, profile.model.fingerprint, runs=len(measured.runs))
    refit_settings = replace(request.settings, calibration=refit, calibration_label="refit by tune")
    replanned = make_plans(profile, replace(request, settings=refit_settings), sha256=sha256, count=1)[0]
    if plan_key(replanned) not in {plan_key(p) for p, _ in measured.runs}:
        measured.measure([replanned], versus=measured.fastest())
    fastest_plan, report = measured.runs[measured.fastest()]
    best = _with_measurement(repredicted_plan(profile, fastest_plan, refit_settings), report)
    tuned = tuple(
        TunedCandidate(plan, report, predict_plan(profile, plan, refit_settings).iteration_s, r)
        for (plan, report), r in zip(measured.runs, measured.relative, strict=True)
    )
    return TuneResult(best=best, calibration=refit, candidates=tuned)


def format_tune_table(result: TuneResult) -> str:
    """Candidates with predicted (before and after the refit), measured, and the two errors."""
    rows = [
        f"{'#':>2}  {'candidate':<52} {'predicted':>10} {'refit':>10} {'measured':>10} {'vs #0':>6} {'err':>7} "
        f"{'err refit':>9} {'speed':>6}"
    ]
    best_key = plan_key(result.best)
    for i, c in enumerate(result.candidates):
        before = c.plan.predicted.iteration_s
        after = c.refit_predicted_s
        err = (c.measured_s - before) / before * 100
        err_after = f"{(c.measured_s - after) / after * 100:+8.1f}%"
        mark = "  <- fastest measured" if plan_key(c.plan) == best_key else ""
        factor = c.report.speed_factor
        speed = "-" if factor is None else f"x{factor:.2f}"
        rows.append(
            f"{i:>2}  {_label(c.plan):<52} {before * 1e3:>8.2f}ms "
            f"{after * 1e3:>8.2f}ms {c.measured_s * 1e3:>8.2f}ms {c.relative:>6.3f} {err:>+6.1f}% "
            f"{err_after} {speed:>6}{mark}"
        )
    rows.append(
        "vs #0: each candidate's iteration over the first's (interleaved runs: the median over rounds of their "
        "ratio); the fastest is the lowest"
    )
    if any(c.report.speed_factor is not None for c in result.candidates):
        rows.append(
            "speed: how much slower the speed reference ran during the candidate's run than while profiling "
            "(information: a shared machine's speed moves for minutes; the times are as measured)"
        )
    cal = result.calibration
    rows.append(
        f"refit calibration: co-location {cal.colocation_factor:.3f}, overhead per action "
        + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(cal.action_overhead_s.items()))
    )
    return "\n".join(rows)
