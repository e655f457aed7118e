"""What a model's own actions cost in a pipeline, learned from measured runs of it.

``pipeplan calibrate`` measures the runtime with stages of one tiny ``Linear``. Real stages pay more per
action once they run in a pipeline, beyond what they cost alone, by an amount that differs from model to model
and that neither the other rank's compute nor a pause alone explains. No per-action constant of the runtime
fits every model, so a calibration that is to predict a given model's plans has to see that model run.

``pipeplan calibrate --model MODEL --profile PROFILE`` does so once: it plans the model for the
calibration's ranks under the 1F1B schedule, runs that plan on real processes
(:func:`planner.runtime.verify.verify_plan`) and refits the calibration from the run
(:func:`planner.runtime.tune.refit_calibration`: the co-location factor from the measured compute, the
1F1B overhead from the measured iteration, every other schedule shifted by the same per-action change,
the optimizer by the measured step tail). How well such a calibration predicts the model's other plans, against
the machine's constants alone, is measured by ``python benchmarks/bench_fidelity.py`` (docs/BENCHMARKS.md,
"Fidelity").

Where the model's 1F1B plan is short (:data:`EVERY_SCHEDULE_BELOW_S`), the best plan of every other schedule
runs too (zero-bubble's with one stage per rank and with several), in the same launch and interleaved with it
(:func:`planner.runtime.interleave.verify_plans`), and each schedule's overhead is learned from its plan's
measured ratio to the 1F1B plan (:func:`learn_from_runs`). A small model's actions are a few milliseconds, and
there what a schedule's bookkeeping costs per action differs from model to model as much as from schedule to
schedule, so the machine's constants can rank the schedules of a small model wrongly. It differs from one
micro-batch count to another too, so every schedule runs at two counts, the global batch's and as many
micro-batches as ranks (same micro-batch size), and keeps an overhead for each
(``Calibration.action_overhead_by_microbatches_s``). And 1F1B runs at each other profiled micro-batch size,
whose ratio to the first run sets that size's co-location factor
(``Calibration.colocation_factor_by_micro_batch_size``: the factor at which the calibration predicts the ratio,
:func:`_colocation_to_ratios`): how much slower compute runs beside the other rank depends on the size.
Where actions are long, their overhead is a few percent of the step, and one 1F1B run, its change shifted onto
the other schedules, is enough for what the extra runs would cost; but the co-location factor still moves with
the size, so a long model's 1F1B plan runs at each profiled size too, at the same global batch (by default as many
micro-batches of the largest size as ranks), in one launch of a few rounds (:data:`LEARNING_SIZE_ROUNDS`) that
tracks no memory, and each size's compute over its profile, relative to the first run's, sets its factor.

The result is the model's: ``notes.model`` names it, and ``pipeplan plan`` warns when a profile of another
model is planned with it.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.calibration import Calibration, shipped_calibration
from planner.cost import CostSettings, default_settings
from planner.errors import PipeplanError, PipeplanWarning, UsageError
from planner.plan import Plan
from planner.prediction import repredicted_plan
from planner.request import PlanRequest
from planner.runtime.calibrate import fit_overhead, solve_increasing
from planner.runtime.interleave import rounds_within, verify_plans
from planner.runtime.run_options import VerifyOptions
from planner.runtime.tune import overhead_cap, refit_calibration
from planner.runtime.verify import verify_plan
from planner.runtime.verify_report import VerifyReport
from planner.schedule.orders import Schedule
from planner.search import make_plan, make_plans
from profiles.format import Profile

__all__ = [
    "ModelRun",
    "learning_plan",
    "learning_plans",
    "learn_from_run",
    "learn_from_runs",
    "EVERY_SCHEDULE_BELOW_S",
    "LEARNING_ROUNDS",
    "LEARNING_SIZE_ROUNDS",
    "LEARNING_MAX_ROUNDS",
    "LEARNING_BUDGET_S",
    "LEARNING_SIZE_BUDGET_S",
    "LEARNING_LAUNCHES",
    "learn_model_cost",
    "learn_model_cost_on_ranks",
    "learn_while_profiling",
    "can_learn_while_profiling",
    "default_global_batch",
    "format_learned",
    "with_learned",
    "learn_after_profile",
]

log = logging.getLogger("pipeplan")

EVERY_SCHEDULE_BELOW_S = 0.5
"""Every schedule's plan runs to learn its own overhead when the 1F1B plan is predicted to step in less than
this; 1F1B's alone otherwise. Under it a rank's actions are tens of milliseconds or less (2 ranks, 4
micro-batches: 16 actions a step), where a millisecond of bookkeeping per action is several percent of the step,
and the other plans' runs take about two and a half minutes (:data:`LEARNING_BUDGET_S`, module docstring)."""

LEARNING_BUDGET_S = 90.0
"""About how long the interleaved launches that learn schedule ratios (a short model's every schedule) time
steps, together (:func:`~planner.runtime.interleave.rounds_within`): for a small model's seventeen or so plans,
two launches of a few dozen rounds of 0.1 s blocks. A learned ratio's error is mostly the rounds' own: one
round's ratio spreads by more than ten percent, and the median's spread from launch to launch falls as the rounds
grow (``python benchmarks/bench_learning.py --budgets 45,90`` measures it at this budget and at half of it)."""

LEARNING_SIZE_BUDGET_S = 45.0
"""The same for a launch that learns co-location factors alone (a long model's 1F1B plan at each profiled size):
each factor is compute summed over every action of its rounds, not a median of per-round ratios."""

LEARNING_ROUNDS = 7
"""The fewest rounds of each interleaved learning launch: its ratios are medians over them, and one round's ratio
of two plans can move by tens of percent within a minute on a shared machine."""

LEARNING_SIZE_ROUNDS = 2
"""The fewest rounds of a launch that learns co-location factors alone (a long model's 1F1B plan at each profiled
micro-batch size): each factor is a ratio of compute summed over every action of its rounds, not a median of
per-round ratios: two rounds of a long model already span about :data:`LEARNING_SIZE_BUDGET_S`, where a third would
take half as long again."""

LEARNING_MAX_ROUNDS = 30
"""The most rounds of each interleaved learning launch, however short its plans."""

LEARNING_LAUNCHES = 2
"""The learning rounds are split over this many launches, and each plan's ratio to the 1F1B plan is the geometric
mean of the launches': a launch as a whole can favour one schedule (its 1F1B copies running fast throughout,
say), moving every ratio of that launch by more than two copies of one plan differ within it."""


@dataclass(frozen=True)
class ModelRun:
    calibration: Calibration
    """The calibration refit from the runs (``source`` ``refit``, ``notes.model`` set)."""
    runs: tuple[tuple[Plan, VerifyReport], ...]
    """Each plan that ran (the 1F1B plan first), with its prediction under the calibration it started from,
    and what it measured."""

    @property
    def plan(self) -> Plan:
        """The 1F1B plan."""
        return self.runs[0][0]

    @property
    def report(self) -> VerifyReport:
        """What the 1F1B plan measured."""
        return self.runs[0][1]


def default_global_batch(profile: Profile, num_ranks: int) -> int:
    """Two micro-batches per rank of the largest profiled size: 1F1B reaches its steady state (every rank
    alternates a forward and a backward) only with more micro-batches than ranks."""
    return 2 * num_ranks * max(profile.micro_batch_sizes)


def learning_plan(
    profile: Profile, calibration: Calibration, global_batch: int, *, sha256: str, micro_batch_size: int | None = None
) -> Plan:
    """The planner's best 1F1B plan for the calibration's ranks (at ``micro_batch_size``, else at the size the
    planner picks): the run the model's cost is learned from."""
    if calibration.num_ranks < 2:
        raise UsageError(
            f"learning a model's pipeline cost needs at least 2 ranks (the calibration has {calibration.num_ranks})"
        )
    settings = default_settings(profile, calibration=calibration, calibration_label="calibrate")
    request = PlanRequest(
        num_ranks=calibration.num_ranks,
        global_batch_size=global_batch,
        schedule=Schedule.ONE_F_ONE_B,
        micro_batch_size=micro_batch_size,
        settings=settings,
    )
    return make_plan(profile, request, sha256=sha256)


def learning_plans(
    profile: Profile,
    calibration: Calibration,
    global_batch: int,
    *,
    sha256: str,
    every_schedule: bool | None = None,
    long_global_batch: int | None = None,
) -> list[Plan]:
    """The runs a model's cost is learned from: :func:`learning_plan` (1F1B), then, with ``every_schedule``
    (None: where that plan is predicted under :data:`EVERY_SCHEDULE_BELOW_S`), the same at the largest profiled
    micro-batch size that plans, the best plan of each other schedule the calibration's ranks can run with this
    model at that size (one it cannot plan is left out), every schedule's again with as many micro-batches as
    ranks, and 1F1B's at each other profiled size. Without every schedule, the 1F1B plans run at
    ``long_global_batch`` samples a step where given, else at ``global_batch``."""
    first = learning_plan(profile, calibration, global_batch, sha256=sha256)
    settings = default_settings(profile, calibration=calibration, calibration_label="calibrate")
    if every_schedule is None:
        every_schedule = first.predicted.iteration_s < EVERY_SCHEDULE_BELOW_S
    if not every_schedule and long_global_batch is not None and long_global_batch != global_batch:
        global_batch = long_global_batch
        first = learning_plan(profile, calibration, global_batch, sha256=sha256)
    if not every_schedule:
        # Where the planner would go, and 1F1B at each other size for that size's co-location factor, at the same
        # global batch (as many samples a step, not up to 4x as many): a factor learned at one size alone carries
        # its error into every other size and can tip the planner's choice of micro-batch size.
        return [first, *_one_f_one_b_at_other_sizes(profile, settings, first, global_batch, sha256)]
    # At the largest size that plans: it is where the plans worth running mostly are, and an overhead learned at
    # one size carries to another only as well as the profile's times at the two sizes agree
    # (`python benchmarks/bench_ratios.py` measures the predicted ratios against the runs). A long model's
    # 1F1B run stays at the size the planner picks (above).
    for size in sorted(profile.micro_batch_sizes, reverse=True):
        if size == first.micro_batch_size:
            break
        if global_batch % size or global_batch // size < first.num_ranks:
            continue
        try:
            first = learning_plan(profile, calibration, global_batch, sha256=sha256, micro_batch_size=size)
            break
        except PipeplanError as exc:  # e.g. stages that do not fit at this size
            log.info("not learning at b=%d for %s: %s", size, profile.model.name, exc)
    plans = [first]
    # Every plan at the 1F1B plan's micro-batch size: a ratio across sizes would carry how far the profile's
    # times at one size are from the other's into the overhead (a faster size would fit every overhead to 0).
    b = first.micro_batch_size
    others = _best_of_each_schedule(profile, settings, calibration.num_ranks, global_batch, b, sha256)
    plans += [p for p in others if p.schedule is not Schedule.ONE_F_ONE_B]
    # The fewest micro-batches that keep every rank of 1F1B busy: what an action costs beyond its compute moves
    # with the count (module docstring).
    fewest = calibration.num_ranks * b
    if fewest < global_batch:
        plans += _best_of_each_schedule(profile, settings, calibration.num_ranks, fewest, b, sha256)
    # 1F1B at each other profiled micro-batch size, as many micro-batches as its first plan: how much slower
    # compute runs beside the other rank depends on the size (Calibration.colocation_factor_by_micro_batch_size).
    return plans + _one_f_one_b_at_other_sizes(profile, settings, first, None, sha256)


def _one_f_one_b_at_other_sizes(
    profile: Profile, settings: CostSettings, first: Plan, global_batch: int | None, sha256: str
) -> list[Plan]:
    """1F1B's plan at each profiled micro-batch size but ``first``'s, at ``global_batch`` (None: as many
    micro-batches as ``first``); a size that cannot be planned (stages that do not fit, fewer micro-batches than
    ranks) is left out."""
    plans = []
    for size in profile.micro_batch_sizes:
        if size == first.micro_batch_size:
            continue
        batch = size * first.num_microbatches if global_batch is None else global_batch
        if batch % size or batch // size < first.num_ranks:
            continue
        request = PlanRequest(
            first.num_ranks, batch, schedule=Schedule.ONE_F_ONE_B, micro_batch_size=size, settings=settings
        )
        try:
            plans.append(make_plan(profile, request, sha256=sha256))
        except PipeplanError as exc:  # e.g. a size whose stages do not fit
            log.info("not learning b=%d for %s: %s", size, profile.model.name, exc)
    return plans


def _best_of_each_schedule(
    profile: Profile,
    settings: CostSettings,
    num_ranks: int,
    global_batch: int,
    micro_batch_size: int | None,
    sha256: str,
) -> list[Plan]:
    """The best plan of each schedule but naive, 1F1B first, zero-bubble's with one stage per rank and with several;
    a schedule that cannot be planned (too few units for two stages a rank, too few micro-batches) is left out."""
    plans = []
    for schedule in [Schedule.ONE_F_ONE_B, *(s for s in Schedule if s not in (Schedule.ONE_F_ONE_B, Schedule.NAIVE))]:
        request = PlanRequest(
            num_ranks, global_batch, schedule=schedule, micro_batch_size=micro_batch_size, settings=settings
        )
        try:
            ranked = make_plans(profile, request, sha256=sha256, count=8)
        except PipeplanError as exc:
            log.info("not learning %s for %s: %s", schedule.value, profile.model.name, exc)
            continue
        plans.append(ranked[0])
        if schedule is Schedule.ZERO_BUBBLE:  # it runs one stage per rank or several, at different costs
            v = ranked[0].virtual_stages
            plans.extend([p for p in ranked if (p.virtual_stages > 1) != (v > 1)][:1])
    return plans


def learn_from_run(calibration: Calibration, profile: Profile, plan: Plan, report: VerifyReport) -> Calibration:
    """``calibration`` refit from one measured run of ``plan`` (pure: no process is started)."""
    return learn_from_runs(calibration, profile, [(plan, report)])


def learn_from_runs(
    calibration: Calibration,
    profile: Profile,
    runs: Sequence[tuple[Plan, VerifyReport]],
    ratios: Sequence[float] | None = None,
    first_copies: Sequence[VerifyReport] = (),
) -> Calibration:
    """``calibration`` refit from measured runs of the model's plans, the 1F1B plan first (pure).

    The 1F1B run (with ``first_copies``, what other copies of its plan measured in the same launch) sets the
    co-location factor, the step tail and 1F1B's overhead (every other schedule shifted by as much:
    :func:`~planner.runtime.tune.refit_calibration`). Each other run, made in the same launch, sets its
    own schedule's overhead from its ratio to the 1F1B run, ``ratios[k]`` (default: the ratio of their measured
    iterations): the overhead at which the refit model predicts that ratio. A ratio measured interleaved holds
    while the machine's speed moves; an absolute fit does not, and where the 1F1B run measured faster than the
    model can go (no overhead, no slowdown) every schedule's fit stops at zero and their differences are lost:
    plans with four times the actions would then be predicted level with 1F1B. A run at another micro-batch
    count sets its schedule's
    overhead at that count; a 1F1B run at another micro-batch size, that size's co-location factor.
    """
    (first, first_report), others = runs[0], runs[1:]
    # At the machine's speed while profiling (the speed reference, timed in the ranks): what a busy minute
    # added is the machine's, not the model's, and must not be learned as its cost.
    refit = refit_calibration(calibration, [(first, r.at_profile_speed()) for r in (first_report, *first_copies)])
    if refit is calibration:
        raise UsageError("learning a model's pipeline cost needs a run on real processes, not a replay")
    if ratios is None:
        ratios = [r.measured_iteration_s / first_report.measured_iteration_s for _, r in runs]
    settings = default_settings(profile, calibration=refit, calibration_label="refit")
    reference_s = repredicted_plan(profile, first, settings).predicted.iteration_s
    overheads, multi = dict(refit.action_overhead_s), dict(refit.multi_stage_overhead_s)
    by_count: dict[str, dict[int, float]] = {}
    multi_by_count: dict[str, dict[int, float]] = {}
    if len({p.num_microbatches for p, _ in runs}) > 1:
        by_count[first.schedule.value] = {first.num_microbatches: overheads[first.schedule.value]}
    # A schedule that ran with one stage per rank and with several (zero-bubble) keeps both.
    single_stage = {p.schedule for p, _ in runs if p.virtual_stages == 1}
    by_size = _colocation_by_size(refit, runs, first_copies)
    for (plan, report), ratio in zip(others, ratios[1:], strict=True):
        if plan.micro_batch_size != first.micro_batch_size:
            continue  # it teaches its size's co-location factor, above
        again = repredicted_plan(profile, plan, settings)
        cap = overhead_cap(plan, report, refit.overhead_for(plan.schedule, plan.virtual_stages))
        fitted = min(cap, fit_overhead(reference_s * ratio, lambda o, p=again: _iteration_s(p, o)))
        apart = plan.virtual_stages > 1 and plan.schedule in single_stage
        scalars, counts = (multi, multi_by_count) if apart else (overheads, by_count)
        if plan.num_microbatches == first.num_microbatches or plan.schedule.value not in scalars:
            scalars[plan.schedule.value] = fitted
        if by_count:  # plans at several counts: each count keeps its own
            counts.setdefault(plan.schedule.value, {})[plan.num_microbatches] = fitted
    learned = replace(
        refit,
        action_overhead_s=overheads,
        multi_stage_overhead_s=multi,
        action_overhead_by_microbatches_s={**refit.action_overhead_by_microbatches_s, **by_count},
        multi_stage_overhead_by_microbatches_s={**refit.multi_stage_overhead_by_microbatches_s, **multi_by_count},
        colocation_factor_by_micro_batch_size=by_size or refit.colocation_factor_by_micro_batch_size,
    )
    if by_size and _learns_ratios([p for p, _ in runs]):
        learned = _colocation_to_ratios(learned, profile, runs, ratios)
    plan, report = runs[0]
    return learned.learned_from(
        profile.model.name,
        profile.model.fingerprint,
        schedule=plan.schedule.value,
        micro_batch_size=plan.micro_batch_size,
        num_microbatches=plan.num_microbatches,
        predicted_s=plan.predicted.iteration_s,
        measured_s=report.measured_iteration_s,
        steps=report.steps,
        schedules=[_label(p, first) for p, _ in runs],
        ratios_to_first=list(ratios),
    )


def _colocation_by_size(
    refit: Calibration, runs: Sequence[tuple[Plan, VerifyReport]], first_copies: Sequence[VerifyReport]
) -> dict[int, float]:
    """Per micro-batch size that ran, the co-location factor: the refit one times how much more the size's 1F1B
    run's compute exceeded its profile than the first run's did (their measured over profiled compute, both timed
    in the same launch: a ratio that holds while the machine's speed moves). Empty where one size ran."""
    first = runs[0][0]

    def excess(plan: Plan, reports: Sequence[VerifyReport]) -> float:
        measured = sum(r.measured_compute_s for report in reports for r in report.ranks)
        predicted = sum(r.predicted_compute_s for report in reports for r in report.ranks)
        return measured / (predicted / plan.predicted.runtime.compute_scale)  # over the profile's compute

    anchor = excess(first, [runs[0][1], *first_copies])
    by_size = {first.micro_batch_size: refit.colocation_factor}
    for plan, report in runs[1:]:
        if plan.micro_batch_size != first.micro_batch_size and plan.schedule is first.schedule:
            by_size[plan.micro_batch_size] = refit.colocation_factor * excess(plan, [report]) / anchor
    return by_size if len(by_size) > 1 else {}


def _learns_ratios(plans: Sequence[Plan]) -> bool:
    """Whether a plan but the first runs at the first's micro-batch size (a short model's launches: its schedules'
    overheads are learned from their ratios to the first, over two launches), not only at other sizes."""
    return any(p.micro_batch_size == plans[0].micro_batch_size for p in plans[1:])


def _colocation_to_ratios(
    learned: Calibration, profile: Profile, runs: Sequence[tuple[Plan, VerifyReport]], ratios: Sequence[float]
) -> Calibration:
    """``learned`` with each other size's co-location factor the one at which it predicts that size's 1F1B run's
    measured ratio to the first run, where the ratios were learned (a short model's launches: the medians of at
    least fourteen rounds in two launches, of a step mostly outside compute).

    The compute the ranks measured misses what a size costs outside its compute, so factors set from compute alone
    can predict the sizes' ratios off; set from the ratios, they reproduce the measured ratios. A long model keeps
    the factor from compute: its runs at other sizes are one launch of a few rounds of mostly compute, whose ratios
    are noisier than its compute summed over every action (``python benchmarks/bench_ratios.py`` compares the
    two)."""
    (first, _), by_size = runs[0], dict(learned.colocation_factor_by_micro_batch_size)

    def iteration_s(plan: Plan, factor: float | None = None) -> float:
        sizes = by_size if factor is None else {**by_size, plan.micro_batch_size: factor}
        cal = replace(learned, colocation_factor_by_micro_batch_size=sizes)
        settings = default_settings(profile, calibration=cal, calibration_label="refit")
        return repredicted_plan(profile, plan, settings).predicted.iteration_s

    reference_s = iteration_s(first)
    for (plan, _), ratio in zip(runs[1:], ratios[1:], strict=True):
        if plan.micro_batch_size != first.micro_batch_size and plan.schedule is first.schedule:
            by_size[plan.micro_batch_size] = solve_increasing(
                lambda factor, p=plan: iteration_s(p, factor), reference_s * ratio, 0.5, 2.0
            )
    return replace(learned, colocation_factor_by_micro_batch_size=by_size)


def _label(plan: Plan, first: Plan) -> str:
    """``gpipe``, ``zero-bubble v=2``; ``gpipe x2`` at another micro-batch count than ``first``'s, ``1f1b b=1`` at
    another micro-batch size."""
    v = f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    m = f" x{plan.num_microbatches}" if plan.num_microbatches != first.num_microbatches else ""
    b = f" b={plan.micro_batch_size}" if plan.micro_batch_size != first.micro_batch_size else ""
    return plan.schedule.value + v + m + b


def _iteration_s(plan: Plan, overhead_s: float) -> float:
    """``plan``'s iteration with its runtime terms but the per-action overhead (stage times: the profiled ones)."""
    return plan.simulation(replace(plan.predicted.runtime, action_overhead_s=overhead_s)).iteration_s


def learn_model_cost(
    calibration: Calibration,
    profile: Profile,
    model: str,
    plans: Sequence[Plan],
    *,
    steps: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    timeout_s: float = 600.0,
) -> ModelRun:
    """Run ``plans`` (:func:`learning_plans`) of ``model`` on real processes and refit ``calibration`` from them:
    one plan as ``verify`` runs it, several interleaved in each of :data:`LEARNING_LAUNCHES` launches (about
    :data:`LEARNING_BUDGET_S` of rounds in all), each plan's ratio to the first the geometric mean of the
    launches'.

    Where a launch learns schedule ratios (a plan but the first at the first's micro-batch size), every other
    plan's ratio is taken to the first plan's, so the first runs as two copies, one at each end of the launch's
    order: a plan's copy can measure a few percent from another copy of it in the same launch
    (:mod:`planner.runtime.interleave`), and one copy caught in a slow spell would set every other schedule's
    overhead to 0. A long model's launch (1F1B at each profiled size) learns from compute summed over every action
    of its rounds, and runs the first plan once.

    Raises:
        UsageError: the run was not on real processes.
        ExecutionError / ModelMismatchError: the run failed or the model is not the profile's.
    """
    if len(plans) == 1:
        report = verify_plan(
            plans[0],
            model,
            VerifyOptions(
                steps=steps, warmup=warmup, mode="processes", device=device, timeout_s=timeout_s, tolerance=0.25
            ),
        )
        runs = ((plans[0], report),)
        return ModelRun(learn_from_runs(calibration, profile, runs), runs)
    # A plan at the first's micro-batch size learns its schedule's overhead from its ratio to the first, which
    # one launch can bias; then 1F1B's plans at other sizes learn their co-location factors from their ratios
    # too, and where nothing else runs (a long model), from the first launch's compute.
    learns_ratios = _learns_ratios(plans)
    launch, anchor = ([*plans, plans[0]], [0, len(plans)]) if learns_ratios else (list(plans), [0])
    launch_count, at_least, budget_s = (
        (LEARNING_LAUNCHES, LEARNING_ROUNDS, LEARNING_BUDGET_S)
        if learns_ratios
        else (1, LEARNING_SIZE_ROUNDS, LEARNING_SIZE_BUDGET_S)
    )
    rounds = rounds_within(launch, budget_s / launch_count, at_least=at_least, at_most=LEARNING_MAX_ROUNDS)
    # Only the first plan's speed is read (the refit brings its copies to the profile's speed): the other plans
    # teach by their ratios to it and by their compute against their prediction, both taken in the same launch.
    firsts = [k in anchor for k in range(len(launch))]
    launches = [
        verify_plans(
            launch,
            model,
            rounds=rounds,
            warmup=warmup,
            device=device,
            timeout_s=timeout_s,
            unit_references=firsts,
            track_memory=False,  # what is learned is time: the plans' memory is verify's to check
        )
        for _ in range(launch_count)
    ]
    ratios = [
        statistics.geometric_mean(run.ratio(k if k else anchor, anchor) for run in launches) for k in range(len(plans))
    ]
    # The reports (co-location, step tail) from the first launch: its times are of one stretch of the machine.
    first = launches[0]
    runs = tuple(zip(plans, first.reports, strict=False))
    calibration = learn_from_runs(calibration, profile, runs, ratios, first_copies=first.reports[len(plans) :])
    return ModelRun(calibration, runs)


def learn_model_cost_on_ranks(
    calibration: Calibration,
    profile: Profile,
    model: str,
    *,
    num_ranks: int,
    sha256: str,
    global_batch: int | None = None,
    steps: int = 5,
    device: str = "cpu",
    timeout_s: float = 600.0,
    every_schedule: bool | None = None,
) -> ModelRun:
    """``calibrate --model``: plan ``model``'s runs on ``num_ranks`` ranks (the calibration's), run them, and
    refit ``calibration`` from them (:func:`learning_plans`, :func:`learn_model_cost`)."""
    calibration.check_device(profile.device.kind)
    if calibration.num_ranks != num_ranks:
        raise UsageError(f"--start was measured on {calibration.num_ranks} ranks, not --ranks {num_ranks}")
    batch = global_batch or default_global_batch(profile, num_ranks)
    # A long model's runs teach its co-location factors (compute, summed over every action) and 1F1B's overhead
    # (its simulated step fitted to the measured one): as many micro-batches of the largest size as ranks show
    # both, in half the time of twice as many.
    long_batch = None if global_batch else num_ranks * max(profile.micro_batch_sizes)
    plans = learning_plans(
        profile, calibration, batch, sha256=sha256, every_schedule=every_schedule, long_global_batch=long_batch
    )
    log.info(
        "running %s on %d ranks (%s, b=%d x %d) to learn its own per-action cost ...",
        model,
        num_ranks,
        ", ".join(_label(p, plans[0]) for p in plans),
        plans[0].micro_batch_size,
        plans[0].num_microbatches,
    )
    return learn_model_cost(calibration, profile, model, plans, steps=steps, device=device, timeout_s=timeout_s)


def can_learn_while_profiling(profile: Profile) -> bool:
    """Whether ``pipeplan profile`` can learn the model's pipeline cost on this machine: a timed CPU profile
    and a core per rank of the shipped calibration's pipeline (on a GPU a rank is a device: ``calibrate``)."""
    if profile.device.kind != "cpu" or profile.settings.get("meta"):
        return False
    return (os.cpu_count() or 1) >= shipped_calibration("cpu").num_ranks


def learn_while_profiling(profile: Profile, model: str, *, steps: int = 3, timeout_s: float = 600.0) -> ModelRun:
    """What ``calibrate --model`` learns, in the default path: the model's best 1F1B plan on the shipped
    calibration's ranks (and, for a short one, every schedule's: :func:`learning_plans`), run on real processes,
    and the calibration refit from them (:func:`learn_model_cost_on_ranks`). Store ``run.calibration.to_dict()``
    as the profile's ``pipeline_calibration`` (:func:`with_learned`) and ``plan`` uses it by default."""
    shipped = shipped_calibration(profile.device.kind)
    return learn_model_cost_on_ranks(
        shipped, profile, model, num_ranks=shipped.num_ranks, sha256="0" * 64, steps=steps, timeout_s=timeout_s
    )


def with_learned(profile: Profile, run: ModelRun) -> Profile:
    """``profile`` carrying what ``run`` learned, where ``plan`` finds it."""
    return replace(profile, pipeline_calibration=run.calibration.to_dict())


def learn_after_profile(profile: Profile, model: str) -> tuple[Profile, str | None]:
    """``pipeplan profile``'s last step: ``profile`` with its model's pipeline cost learned where this machine
    can run it (:func:`can_learn_while_profiling`), and one line saying what was learned (None: nothing was
    run). A run that fails is a warning, not a lost profile: ``plan`` then uses the shipped calibration."""
    if not can_learn_while_profiling(profile):
        return profile, None
    started = time.perf_counter()
    try:
        run = learn_while_profiling(profile, model)
    except PipeplanError as exc:
        warnings.warn(
            f"could not run {model} as a pipeline to learn its per-action cost ({exc}); plan will use the "
            "calibration shipped for the device",
            PipeplanWarning,
            stacklevel=2,
        )
        return profile, None
    learned = with_learned(profile, run)
    # What the run cost, beside what the rounds cost (profiles/report.py cost_line).
    learned = replace(learned, settings={**learned.settings, "pipeline_run_s": round(time.perf_counter() - started, 3)})
    return learned, format_learned(run, shipped_calibration(profile.device.kind), model)


def format_learned(run: ModelRun, before: Calibration, model: str) -> str:
    """What ``run`` of ``model`` taught the calibration it started from, one line per plan that ran."""
    after = run.calibration
    lines = [
        f"  learned from {model} on {run.plan.num_ranks} ranks (co-location {before.colocation_factor:.3f} -> "
        f"{after.colocation_factor:.3f}); each action costs, beyond the machine's:"
    ]
    for plan, report in run.runs:
        if plan.micro_batch_size == run.plan.micro_batch_size:
            learned = after.overhead_for(plan.schedule, plan.virtual_stages, plan.num_microbatches)
            what = f"{(learned - before.overhead_for(plan.schedule)) * 1e3:+.3f} ms"
        else:
            what = f"co-location {after.colocation_for(plan.micro_batch_size):.3f}"
        lines.append(
            f"    {_label(plan, run.plan):<21} {what}  (b={plan.micro_batch_size} x "
            f"{plan.num_microbatches}: predicted {plan.predicted.iteration_s * 1e3:.2f} ms, measured "
            f"{report.measured_iteration_s * 1e3:.2f} ms)"
        )
    if all(plan.micro_batch_size != run.plan.micro_batch_size for plan, _ in run.runs[1:]):
        lines.append("    (the other schedules: shifted by as much)")
    return "\n".join(lines)
