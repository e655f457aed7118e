"""What ``pipeplan calibrate`` does with its options (:class:`~planner.runtime.run_options.CalibrateOptions`):
measure the machine, or start from a calibration, and refit it from runs of a model's plans; or refit a
calibration from the run records of real jobs (``--from-run``, :func:`calibrate_from_runs`)."""

from __future__ import annotations

from planner.calibration import Calibration, load_calibration, shipped_calibration
from planner.compare import plan_calibration
from planner.errors import UsageError
from planner.request import profile_sha256
from planner.runtime.calibrate import calibrate
from planner.runtime.model_cost import ModelRun, learn_model_cost_on_ranks
from planner.runtime.run_options import CalibrateOptions
from planner.runtime.run_record import RunRecord, load_run_record
from planner.runtime.run_refit import RunRefit, refit_from_runs
from profiles.format import load_profile

__all__ = ["calibrate_with", "calibrate_from_runs"]

_EVERY_SCHEDULE = {"auto": None, "1f1b": False, "every": True}
"""``--learn`` as ``learn_model_cost_on_ranks``' ``every_schedule``."""


def calibrate_with(options: CalibrateOptions) -> tuple[Calibration, ModelRun | None]:
    """What ``calibrate`` does: measure the machine (or start from ``options.start``: a file, or ``auto``, the
    calibration shipped for the device) and, with ``options.model``, refit it from runs of that model's plans.
    Returns the calibration before the refit and the model's run (None without a model), whose
    ``calibration`` is the refit one."""

    profile = load_profile(options.profile) if options.profile is not None else None
    if options.start is None:
        calibration = calibrate(
            options.ranks, device=options.device, repeats=options.repeats, timeout_s=options.timeout_s
        )
    elif options.start == "auto":
        calibration = shipped_calibration(options.device)
    else:
        calibration = load_calibration(options.start)
    if profile is None or options.model is None or options.profile is None:
        return calibration, None
    run = learn_model_cost_on_ranks(
        calibration,
        profile,
        options.model,
        num_ranks=options.ranks,
        sha256=profile_sha256(options.profile),
        global_batch=options.global_batch,
        steps=options.steps,
        device=options.device,
        timeout_s=options.timeout_s,
        every_schedule=_EVERY_SCHEDULE[options.learn],
    )
    return calibration, run


def calibrate_from_runs(options: CalibrateOptions) -> RunRefit:
    """``calibrate --from-run``: ``options.start`` (a file, ``auto``: the shipped one; None: the calibration the
    first run's plan names) refit from the run records ``options.from_run``, each run checked before and after.

    Raises:
        UsageError: no calibration to start from; a record that cannot be read or has too few steps.
    """
    records = [load_run_record(path) for path in options.from_run]
    start = _start_of_runs(options.start, records)
    return refit_from_runs(
        records, start, warmup=options.skip_steps, tolerance=options.tolerance, labels=list(options.from_run)
    )


def _start_of_runs(start: str | None, records: list[RunRecord]) -> Calibration:
    if start == "auto":
        return shipped_calibration(str(records[0].plan.device.get("kind", "cpu")))
    if start is not None:
        return load_calibration(start)
    named = plan_calibration(records[0].plan)
    if named is None:
        label = records[0].plan.predicted.calibration
        raise UsageError(
            f"the run's plan was predicted with calibration {label!r}, which is no file here: give --start "
            "CALIBRATION.json (or --start auto, the shipped one)"
        )
    return named
