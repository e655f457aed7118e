"""Each command's options as one dataclass (planner/options.py): the files a command reads and writes beside
the library's options dataclass (``plan``: :class:`~planner.request.PlanOptions`; ``tune``: also
:class:`~planner.runtime.run_options.TuneOptions`; ``verify``:
:class:`~planner.runtime.run_options.VerifyOptions`), and the options of ``show`` and ``export`` whole
(``simulate``'s: planner/simulate_options.py). The parser is built from these (planner/commands/parser.py)
and ``cli.py`` reads them back."""

from __future__ import annotations

from dataclasses import dataclass

from planner.check_options import CHECKED_TRAINERS, CheckOptions
from planner.export import RELEASES
from planner.options import check_fields, nested, option, rename
from planner.request import (
    CLUSTER_DESCRIPTION,
    CLUSTER_RANKS_HELP,
    CLUSTER_TITLE,
    TRAINERS,
    ClusterOptions,
    PlanOptions,
)
from planner.runtime.run_options import TuneOptions, VerifyOptions

__all__ = ["PlanCommand", "TuneCommand", "VerifyCommand", "ShowOptions", "ExportOptions", "CheckCommand"]

_PROFILE_HELP = "a profile from `pipeplan profile`"
_PLAN_HELP = "a plan from `pipeplan plan`"


@dataclass(frozen=True, kw_only=True)
class PlanCommand:
    profile: str = option(positional=True, metavar="PROFILE.json", help=_PROFILE_HELP)
    out: str = option(required=True, metavar="PLAN.json", help="where to write the plan (atomically)")
    search: PlanOptions = nested(PlanOptions, amend={"ranks": CLUSTER_RANKS_HELP})
    cluster: ClusterOptions = nested(ClusterOptions, title=CLUSTER_TITLE, description=CLUSTER_DESCRIPTION)
    record_timing: bool = option(
        False, help="store the search time in the plan (otherwise null, so same inputs give the same bytes)"
    )


@dataclass(frozen=True, kw_only=True)
class TuneCommand:
    profile: str = option(positional=True, metavar="PROFILE.json", help=_PROFILE_HELP)
    model: str = option(required=True, metavar="MODEL", help="the model the profile was made for")
    out: str = option(required=True, metavar="PLAN.json", help="where to write the fastest measured plan")
    calibration_out: str | None = option(
        None,
        metavar="CALIBRATION.json",
        help="where the refit calibration goes (default: beside the plan, PLAN.calibration.json)",
    )
    run: TuneOptions = nested(TuneOptions)
    no_progress: bool = option(False, help="no progress bar")
    search: PlanOptions = nested(PlanOptions)


@dataclass(frozen=True, kw_only=True)
class VerifyCommand:
    plan: str = option(positional=True, metavar="PLAN.json", help=_PLAN_HELP)
    model: str = option(required=True, metavar="MODEL", help="the model the plan was made for")
    run: VerifyOptions = nested(VerifyOptions)
    out: str | None = option(None, metavar="report.json", help="also write the report as JSON (default: print only)")
    verbose: bool = option(
        False, help="when a rank fails, print its full traceback (from the rank's process) before the one-line error"
    )


@dataclass(frozen=True, kw_only=True)
class ShowOptions:
    file: str = option(
        positional=True,
        metavar="FILE.json|GPU",
        help="a profile, a plan, a verify report or a device model (a file, or a built-in's name: h100-80gb, ...)",
    )
    micro_batch_size: str | None = option(
        None,
        metavar="N|all",
        help="a profile's table at this micro-batch size, or at every size (default: the smallest)",
    )


_VERSIONS = "; ".join(f"{r.package} {r.current}, for {r.series_text}" for r in RELEASES.values())


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    plan: str = option(positional=True, metavar="PLAN.json", help=_PLAN_HELP)
    to: str = option(required=True, choices=TRAINERS, help="the trainer")
    renames: tuple[tuple[str, str], ...] = option(
        (),
        flag="--rename",
        parse=rename,
        repeat=True,
        metavar="OLD=NEW",
        help="map a module-name prefix of the profiled model onto the trainer's model (repeatable; the longest "
        "matching prefix wins; NEW may be empty to strip the prefix; default: the names as profiled)",
    )
    out: str | None = option(None, metavar="FILE", help="write to FILE (atomically) instead of stdout")
    trainer_version: str | None = option(
        None,
        metavar="VERSION",
        help="the trainer's release to write for; a release outside the series an export is for is refused "
        f"(default: the release each was run against: {_VERSIONS})",
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class CheckCommand:
    profile: str = option(positional=True, metavar="PROFILE.json", help=_PROFILE_HELP)
    trainer: str = option(
        required=True, flag="--from", choices=CHECKED_TRAINERS, help="the trainer whose configuration CONFIG is"
    )
    config: str = option(
        positional=True,
        metavar="CONFIG",
        help="the configuration: Megatron-Core arguments (a command line or a file of them), torchtitan overrides "
        "or TOML, or DeepSpeed's ds_config JSON (its pipeline section: stages, partition_method) or the Python "
        "`export --to deepspeed` writes; - reads standard input",
    )
    out: str | None = option(
        None, metavar="PLAN.json", help="also write the configuration's layout as a plan (simulate, verify, export)"
    )
    check: CheckOptions = nested(CheckOptions)
