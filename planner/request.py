"""A plan request: what the search is asked for, checked once where it enters, for the CLI and the Python API.

:func:`plan_request` turns the options ``plan`` and ``tune`` take (``--ranks``, ``--memory``, ``--pin``,
``--calibration`` ...) into a :class:`PlanRequest`: it refuses conflicting or impossible options in terms of
the options themselves (a pin that cannot hold reads as a pin, not as "no plan fits"), chooses the
calibration, and warns when that calibration learned another model.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from planner.calibration import Calibration, calibration_from_dict, load_calibration, shipped_calibration
from planner.cost import CostSettings, default_settings
from planner.errors import PipeplanWarning, UsageError, shorten
from planner.limits import MAX_GLOBAL_BATCH, MAX_RANKS, check_at_most, check_plan_work
from planner.schedule.orders import Schedule
from profiles.format import Profile

__all__ = ["PlanRequest", "plan_request", "check_pins", "pinned_units", "calibration_settings", "profile_sha256"]


@dataclass(frozen=True)
class PlanRequest:
    num_ranks: int
    """Pipeline ranks (devices): ``--ranks``."""
    global_batch_size: int
    schedule: Schedule | None = None
    """None: search every schedule (``auto``). A name is parsed once, here."""
    auto_schedules: tuple[Schedule, ...] = ()
    """The schedules ``auto`` chooses from (a trainer's, ``plan --for``); empty: every one torch ships."""
    micro_batch_size: int | None = None
    """None: search every profiled size that divides the global batch."""
    recompute: str = "auto"
    """auto (chosen per stage), on, off."""
    solver: str = "auto"
    """auto (dp, or ilp when devices differ, units are pinned or stages capped), dp, ilp."""
    settings: CostSettings = field(default_factory=CostSettings)
    pinned: tuple[tuple[str, int], ...] = ()
    """(unit FQN, stage) pairs; ILP only."""
    max_units_per_stage: int | None = None
    top_k: int = 4
    """Partitions per candidate handed from the solver to the simulator."""
    ilp_time_limit_s: float = 60.0

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise UsageError(f"--ranks must be >= 1, got {self.num_ranks}")
        if self.global_batch_size < 1:
            raise UsageError(f"--global-batch must be >= 1, got {self.global_batch_size}")
        # The bounds of planner.limits, checked where a request enters (README, "Limits").
        check_at_most("--ranks", self.num_ranks, MAX_RANKS)
        check_at_most("--global-batch", self.global_batch_size, MAX_GLOBAL_BATCH)
        check_at_most("--micro-batch-size", self.micro_batch_size or 1, MAX_GLOBAL_BATCH)
        if self.recompute not in ("auto", "on", "off"):
            raise UsageError(f"--recompute must be auto, on or off, got {self.recompute!r}")
        if self.solver not in ("auto", "dp", "ilp"):
            raise UsageError(f"--solver must be auto, dp or ilp, got {self.solver!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise UsageError(f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.max_units_per_stage is not None and self.max_units_per_stage < 1:
            raise UsageError(f"--max-units-per-stage must be >= 1, got {self.max_units_per_stage}")
        if isinstance(self.schedule, str) and not isinstance(self.schedule, Schedule):
            # The Python API's edge: a name becomes the enum once and travels as the enum.
            object.__setattr__(self, "schedule", None if self.schedule == "auto" else Schedule.parse(self.schedule))


def profile_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def plan_request(
    profile: Profile,
    *,
    stages: int | None,
    global_batch: int,
    cluster: bool = False,
    memory_bytes: int | None = None,
    device_memory_bytes: Sequence[int] | None = None,
    device_speeds: Sequence[float] | None = None,
    link_bytes_per_s: float | None = None,
    link_latency_s: float | None = None,
    optimizer: str = "adam",
    schedule: str | Schedule = "auto",
    micro_batch_size: int | None = None,
    recompute: str = "auto",
    solver: str = "auto",
    calibration: str = "auto",
    pins: Sequence[tuple[str, int]] = (),
    max_units_per_stage: int | None = None,
    ilp_time_limit_s: float = 60.0,
) -> PlanRequest:
    """The search request of ``plan`` / ``tune`` (``cluster``: a ``--devices`` plan, whose pipeline degree is
    chosen per layout, ``stages`` fixing it if given). ``calibration``: ``auto`` (the one the profile learned
    while profiling, else the one shipped for its device), ``none`` or a calibration file. Raises UsageError on
    options that cannot hold."""
    if memory_bytes is not None and device_memory_bytes is not None:
        raise UsageError("--memory and --device-memory conflict: give one (--memory is every device's memory)")
    chosen = None if schedule == "auto" else Schedule.parse(schedule)
    sizes = [micro_batch_size] if micro_batch_size is not None else profile.micro_batch_sizes
    if stages is None and not cluster:
        raise UsageError("give --ranks P (one pipeline of P ranks), or --devices N for a cluster plan")
    if cluster and (pins or device_memory_bytes or device_speeds):
        raise UsageError("--pin, --device-memory and --device-speeds are per pipeline rank: use them without --devices")
    if not cluster:
        assert stages is not None
        check_plan_work(stages, global_batch, sizes)
    if pins:
        assert stages is not None
        check_pins(profile, pins, stages, chosen)
    memory = (memory_bytes,) if memory_bytes is not None else device_memory_bytes
    if memory is None and not cluster and profile.device.kind == "cpu":
        assert stages is not None
        # The ranks of one pipeline on a CPU are processes of one machine: they share its memory.
        memory = (profile.device.memory_bytes // stages,)
    settings = default_settings(
        profile,
        optimizer=optimizer,
        link_bytes_per_s=link_bytes_per_s,
        link_latency_s=link_latency_s,
        device_memory_bytes=memory or (),
        device_speeds=device_speeds or (),
        **calibration_settings(calibration, profile.device.kind, profile),
    )
    warn_other_model(settings.calibration, profile)
    return PlanRequest(
        num_ranks=stages or 1,  # a cluster plan sets the pipeline degree per layout
        global_batch_size=global_batch,
        schedule=chosen,
        micro_batch_size=micro_batch_size,
        recompute=recompute,
        solver=solver,
        settings=settings,
        pinned=tuple(pins),
        max_units_per_stage=max_units_per_stage,
        ilp_time_limit_s=ilp_time_limit_s,
    )


LEARNED_LABEL = "learned while profiling"
"""The calibration label of a profile's own ``pipeline_calibration``."""


def calibration_settings(calibration: str, device_kind: str, profile: Profile | None = None) -> dict[str, object]:
    """``auto|none|FILE`` as CostSettings fields. ``auto``: the calibration ``profile`` learned from a run of its
    model in a pipeline (``pipeplan profile``), else the one shipped for the device."""
    if calibration == "none":
        return {}
    if calibration == "auto":
        learned = profile.pipeline_calibration if profile is not None else None
        if learned is not None:
            return {"calibration": calibration_from_dict(learned), "calibration_label": LEARNED_LABEL}
        return {"calibration": shipped_calibration(device_kind), "calibration_label": "shipped"}
    return {"calibration": load_calibration(calibration), "calibration_label": str(calibration)}


def warn_other_model(calibration: object, profile: Profile) -> None:
    """A calibration refit on one model (``calibrate --model``, ``tune``) carries that model's per-action
    cost: say so when another model is planned with it."""
    note = calibration.learned_model if isinstance(calibration, Calibration) else None
    if note is not None and note.get("fingerprint") != profile.model.fingerprint:
        warnings.warn(
            f"the calibration learned {note.get('name')}'s per-action cost, not {profile.model.name}'s: its "
            "predictions for this model may be off by that difference",
            PipeplanWarning,
            stacklevel=3,
        )


def check_pins(profile: Profile, pins: Sequence[tuple[str, int]], num_ranks: int, schedule: Schedule | None) -> None:
    """Each pin names a unit, once, at a stage that leaves every other stage a unit, in model order.

    Said here, in terms of the pins, rather than as the solver's "no plan fits" (which reads as memory).
    """
    names = [u.name for u in profile.units]
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    # Stage counts the search may try: one stage per rank, or 2 or 4 per rank when interleaving.
    looped = schedule is None or schedule.multi_stage
    counts = [num_ranks] + ([num_ranks * v for v in (2, 4) if num_ranks * v <= n] if looped else [])
    chosen: dict[str, int] = {}
    for name, stage in pins:
        if name not in index:
            raise UsageError(
                f"--pin {shorten(name, 60)}={stage}: no unit of that name (units: {shorten(', '.join(names), 120)})"
            )
        if chosen.get(name, stage) != stage:
            raise UsageError(f"--pin {shorten(name, 60)} is given twice, to stage {chosen[name]} and to stage {stage}")
        chosen[name] = stage
        k = index[name]
        # A stage counted from the end (-1: the last) is stage s + stage of s stages.
        resolved = [(stage + s if stage < 0 else stage, s) for s in counts]
        if any(0 <= at < s and at <= k and s - 1 - at <= n - 1 - k for at, s in resolved):
            continue
        at = stage + counts[0] if stage < 0 else stage
        if at >= max(counts) or at < 0:
            why = f"stages are 0..{max(counts) - 1} (or -1 for the last) for {num_ranks} ranks"
        elif at > k:
            why = f"stages 0..{at - 1} before it need a unit each, and only {k} units come before it"
        else:
            why = (
                f"stages {at + 1}..{counts[0] - 1} after it need a unit each, and only {n - 1 - k} units come after it"
            )
        raise UsageError(f"--pin {shorten(name, 60)}={stage}: unit {k} of 0..{n - 1} cannot be on stage {stage}: {why}")
    # In model order, stages never go back (a stage counted from the end, as on one pipeline of counts[0]).
    by_unit = sorted((index[name], stage + counts[0] if stage < 0 else stage, name) for name, stage in chosen.items())
    for (_, s1, n1), (_, s2, n2) in zip(by_unit, by_unit[1:], strict=False):
        if s2 < s1:
            raise UsageError(
                f"--pin {shorten(n1, 40)}={chosen[n1]} and --pin {shorten(n2, 40)}={chosen[n2]} conflict: "
                f"{shorten(n2, 40)} comes later in the model, so its stage cannot be earlier"
            )


def pinned_units(profile: Profile, request: PlanRequest, virtual_stages: int) -> tuple[tuple[int, int], ...]:
    """The request's pins as (unit index, stage) for a search with ``virtual_stages`` stages per rank."""
    names = [u.name for u in profile.units]
    pins = []
    for name, given in request.pinned:
        stage = given + request.num_ranks * virtual_stages if given < 0 else given  # -1: the last stage
        if name not in names:
            raise UsageError(f"cannot pin unknown unit {name!r}")
        if not 0 <= stage < request.num_ranks * virtual_stages:
            raise UsageError(
                f"cannot pin {name} to stage {stage}: stages are 0..{request.num_ranks * virtual_stages - 1}"
            )
        pins.append((names.index(name), stage))
    return tuple(pins)
