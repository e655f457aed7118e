"""What ``pipeplan calibrate`` does with its options (:class:`~planner.runtime.run_options.CalibrateOptions`):
measure the machine, or start from a calibration, and refit it from runs of a model's plans."""

from __future__ import annotations

from planner.calibration import Calibration, load_calibration, shipped_calibration
from planner.request import profile_sha256
from planner.runtime.calibrate import calibrate
from planner.runtime.model_cost import ModelRun, learn_model_cost_on_ranks
from planner.runtime.run_options import CalibrateOptions
from profiles.format import load_profile

__all__ = ["calibrate_with"]

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
