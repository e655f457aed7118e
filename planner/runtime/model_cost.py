"""What a model's own actions cost in a pipeline, learned from one measured 1F1B run of it.

``pipeplan calibrate`` measures the runtime with stages of one tiny ``Linear``. Real stages pay more per
action once they run in a pipeline: on this 2-core CPU about 0.15 ms for a small MLP and 0.45 ms for
gpt2-tiny, beyond what they cost alone, with neither the other rank's compute nor a pause alone
explaining it (docs/BENCHMARKS.md, "Fidelity", 2026-12-01). No per-action constant of the runtime
fits both models, so a calibration that is to predict a given model's plans has to see that model run.

``pipeplan calibrate --model MODEL --profile PROFILE`` does so once: it plans the model for the
calibration's ranks under the 1F1B schedule, runs that plan on real processes
(:func:`planner.runtime.verify.verify_plan`) and refits the calibration from the run
(:func:`planner.runtime.tune.refit_calibration`: the co-location factor from the measured compute, the
1F1B overhead from the measured iteration, every other schedule shifted by the same per-action change,
the optimizer by the measured step tail). Held out of sample on the other plans of six models, such a
calibration predicted within 3.9-8.0 % (median, five runs; one plan of 49 above 20 % in the last three),
where the one made with trivial stages was 9.9-52.7 % off (docs/BENCHMARKS.md, "Fidelity", 2026-12-01).

The result is the model's: ``notes.model`` names it, and ``pipeplan plan`` warns when a profile of another
model is planned with it.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, replace

from planner.calibration import Calibration, shipped_calibration
from planner.cost import default_settings
from planner.errors import PipeplanError, PipeplanWarning, UsageError
from planner.plan import Plan
from planner.request import PlanRequest
from planner.runtime.tune import refit_calibration
from planner.runtime.verify import verify_plan
from planner.runtime.verify_report import VerifyReport
from planner.schedule.orders import Schedule
from planner.search import make_plan
from profiles.format import Profile

__all__ = [
    "ModelRun",
    "learning_plan",
    "learn_from_run",
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


@dataclass(frozen=True)
class ModelRun:
    calibration: Calibration
    """The calibration refit from the run (``source`` ``refit``, ``notes.model`` set)."""
    plan: Plan
    """The 1F1B plan that ran, with its prediction under the calibration it started from."""
    report: VerifyReport


def default_global_batch(profile: Profile, num_ranks: int) -> int:
    """Two micro-batches per rank of the largest profiled size: 1F1B reaches its steady state (every rank
    alternates a forward and a backward) only with more micro-batches than ranks."""
    return 2 * num_ranks * max(profile.micro_batch_sizes)


def learning_plan(profile: Profile, calibration: Calibration, global_batch: int, *, sha256: str) -> Plan:
    """The planner's best 1F1B plan for the calibration's ranks: the run the model's cost is learned from."""
    if calibration.num_ranks < 2:
        raise UsageError(
            f"learning a model's pipeline cost needs at least 2 ranks (the calibration has {calibration.num_ranks})"
        )
    settings = default_settings(profile, calibration=calibration, calibration_label="calibrate")
    request = PlanRequest(
        num_ranks=calibration.num_ranks,
        global_batch_size=global_batch,
        schedule=Schedule.ONE_F_ONE_B,
        settings=settings,
    )
    return make_plan(profile, request, sha256=sha256)


def learn_from_run(calibration: Calibration, profile: Profile, plan: Plan, report: VerifyReport) -> Calibration:
    """``calibration`` refit from one measured run of ``plan`` (pure: no process is started)."""
    # At the machine's speed while profiling (the speed reference, timed in the ranks): what a busy minute
    # added is the machine's, not the model's, and must not be learned as its cost.
    refit = refit_calibration(calibration, [(plan, report.at_profile_speed())])
    if refit is calibration:
        raise UsageError("learning a model's pipeline cost needs a run on real processes, not a replay")
    return refit.learned_from(
        profile.model.name,
        profile.model.fingerprint,
        schedule=plan.schedule.value,
        micro_batch_size=plan.micro_batch_size,
        num_microbatches=plan.num_microbatches,
        predicted_s=plan.predicted.iteration_s,
        measured_s=report.measured_iteration_s,
        steps=report.steps,
    )


def learn_model_cost(
    calibration: Calibration,
    profile: Profile,
    model: str,
    plan: Plan,
    *,
    steps: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    timeout_s: float = 600.0,
) -> ModelRun:
    """Run ``plan`` (:func:`learning_plan`) of ``model`` on real processes and refit ``calibration`` from it.

    Raises:
        UsageError: the run was not on real processes.
        ExecutionError / ModelMismatchError: the run failed or the model is not the profile's.
    """
    report = verify_plan(plan, model, steps=steps, warmup=warmup, mode="processes", device=device, timeout_s=timeout_s)
    return ModelRun(learn_from_run(calibration, profile, plan, report), plan, report)


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
) -> ModelRun:
    """``calibrate --model``: plan ``model``'s 1F1B run on ``num_ranks`` ranks (the calibration's), run it, and
    refit ``calibration`` from it (:func:`learning_plan`, :func:`learn_model_cost`)."""
    calibration.check_device(profile.device.kind)
    if calibration.num_ranks != num_ranks:
        raise UsageError(f"--start was measured on {calibration.num_ranks} ranks, not --ranks {num_ranks}")
    batch = global_batch or default_global_batch(profile, num_ranks)
    plan = learning_plan(profile, calibration, batch, sha256=sha256)
    log.info(
        "running %s under 1f1b on %d ranks (b=%d x %d) to learn its own per-action cost ...",
        model,
        num_ranks,
        plan.micro_batch_size,
        plan.num_microbatches,
    )
    return learn_model_cost(calibration, profile, model, plan, steps=steps, device=device, timeout_s=timeout_s)


def can_learn_while_profiling(profile: Profile) -> bool:
    """Whether ``pipeplan profile`` can learn the model's pipeline cost on this machine: a timed CPU profile
    and a core per rank of the shipped calibration's pipeline (on a GPU a rank is a device: ``calibrate``)."""
    if profile.device.kind != "cpu" or profile.settings.get("meta"):
        return False
    return (os.cpu_count() or 1) >= shipped_calibration("cpu").num_ranks


def learn_while_profiling(profile: Profile, model: str, *, steps: int = 3, timeout_s: float = 600.0) -> ModelRun:
    """What ``calibrate --model`` learns, in the default path: the model's best 1F1B plan on the shipped
    calibration's ranks, run for ``steps`` steps on real processes, and the calibration refit from it
    (:func:`learn_model_cost_on_ranks`). Store ``run.calibration.to_dict()`` as the profile's
    ``pipeline_calibration`` (:func:`with_learned`) and ``plan`` uses it by default."""
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
    return with_learned(profile, run), format_learned(run, shipped_calibration(profile.device.kind), model)


def format_learned(run: ModelRun, before: Calibration, model: str) -> str:
    """What ``run`` of ``model`` taught the calibration it started from (one line, under its terms)."""
    plan, report, after = run.plan, run.report, run.calibration
    learned = after.overhead_for(plan.schedule) - before.overhead_for(plan.schedule)
    return (
        f"  learned from {model} ({plan.schedule.value}, b={plan.micro_batch_size} x "
        f"{plan.num_microbatches}): predicted {plan.predicted.iteration_s * 1e3:.2f} ms, measured "
        f"{report.measured_iteration_s * 1e3:.2f} ms; its actions cost {learned * 1e3:+.3f} ms each beyond the "
        f"machine's, co-location {before.colocation_factor:.3f} -> {after.colocation_factor:.3f}"
    )
