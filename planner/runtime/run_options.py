"""The options of the commands that run a model on ranks: ``verify`` (:class:`VerifyOptions`, what
:func:`planner.runtime.verify.verify_plan` takes), ``tune`` (:class:`TuneOptions`, what
:func:`planner.runtime.tune.tune` takes) and ``calibrate`` (:class:`CalibrateOptions`, what
:func:`planner.runtime.calibrate_with.calibrate_with` takes).

Declared once (planner/options.py): each field is the command's flag, its help and its default, and the
Python API's keyword. No torch here: ``pipeplan --help`` builds its parser from these without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.limits import MAX_GLOBAL_BATCH, MAX_RANKS, MAX_REPEATS, MAX_STEPS
from planner.options import check_fields, int_range, nonneg_float, option, positive_float
from planner.runtime.verify_report import MEMORY_TOLERANCE

__all__ = ["VerifyOptions", "TuneOptions", "CalibrateOptions", "DEVICES", "MODES", "MIN_WARMUP_S", "MIN_TIME_S"]

DEVICES = ("cpu", "cuda")
MODES = ("auto", "processes", "replay")

MIN_WARMUP_S = 1.0
"""Processes mode warms up for at least this long (and ``warmup`` steps). A fresh rank's first steps run
slow while its heap grows (profiles/allocator.py: freed blocks are reused only after a few iterations) and
gloo opens its pairs: a step count alone would time a short plan's steps before they settle."""
MIN_TIME_S = 2.0
"""Processes mode also times steps until they span this long: a shared machine's speed moves from one second
to the next, and a few short steps would see one such moment only (profiles/measure_settings.py, ``MIN_TIME_S``,
for the profile's side of it)."""


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """How ``verify`` runs a plan and judges it against its prediction."""

    steps: int = option(
        5,
        parse=int_range(1, MAX_STEPS),
        help="timed steps at least (default 5); processes mode also times for at least 2 s, as a shared machine's "
        "speed changes from one second to the next; the median step is measured",
    )
    warmup: int = option(
        1,
        parse=int_range(0, MAX_STEPS),
        help="untimed steps first (default 1); processes mode also warms up for at least 1 s, as a fresh rank's "
        "first steps run slow",
    )
    tolerance: float = option(
        0.15,
        parse=positive_float,
        help="the largest iteration-time error that passes, as a fraction: 0.15 = 15%% (default 0.15)",
    )
    mode: str = option(
        "auto",
        choices=MODES,
        help="processes: one process per rank (gloo or NCCL); replay: every stage in one process, in the "
        "schedule's order, its times through the simulator; auto: processes when there is a core (or GPU) per "
        "rank (default auto)",
    )
    device: str = option("cpu", choices=DEVICES, help="run on this CPU (gloo) or GPUs (NCCL)")
    check_numerics: bool = option(False, help="compare loss and gradients with one process")
    timeout_s: float = option(
        600.0, flag="--timeout", parse=positive_float, unit="s", help="seconds before every rank is stopped"
    )
    memory_tolerance: float = option(
        MEMORY_TOLERANCE,
        parse=positive_float,
        help="allowed error of each stage's measured memory peak against its prediction (default 0.10 = 10%%); "
        "a stage over it, or over the memory the plan gave it, fails the verdict",
    )
    # The floors below are the Python API's only: a test or a benchmark of a few steps sets them to 0.
    min_warmup_s: float = option(
        MIN_WARMUP_S,
        parse=nonneg_float,
        unit="s",
        cli=False,
        help="processes mode warms up for at least this long as well as --warmup steps (default 1)",
    )
    min_time_s: float = option(
        MIN_TIME_S,
        parse=nonneg_float,
        unit="s",
        cli=False,
        help="processes mode times steps until they span this long as well as --steps steps (default 2)",
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """How ``tune`` runs the planner's best candidates."""

    candidates: int = option(4, parse=int_range(1, 32), help="distinct plans to run (default 4)")
    steps: int = option(
        3,
        parse=int_range(1, MAX_STEPS),
        help="the fewest timed steps per candidate (default 3; interleaved: at least that many rounds, as many as "
        "fit in about 30 s)",
    )
    warmup: int = option(
        1,
        parse=int_range(0, MAX_STEPS),
        help="untimed steps per candidate (default 1; processes mode also warms up for at least 1 s)",
    )
    mode: str = option(
        "auto",
        choices=MODES,
        help="processes: one process per rank; replay: every stage in one process, in the schedule's order; auto: "
        "processes when there is a core (or GPU) per rank (default auto)",
    )
    device: str = option("cpu", choices=DEVICES, help="run the candidates on CPU or GPUs")
    timeout_s: float = option(
        600.0, flag="--timeout", parse=positive_float, unit="s", help="seconds per candidate before it is stopped"
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class CalibrateOptions:
    """What ``calibrate`` measures, and, with a model, what run of it refits the result; or, with run records,
    what a calibration is refit from without running anything."""

    ranks: int = option(2, parse=int_range(1, MAX_RANKS), help="ranks to run, as in your pipeline (default 2)")
    device: str = option("cpu", choices=DEVICES, help="calibrate gloo on this CPU or NCCL on GPUs")
    repeats: int = option(15, parse=int_range(1, MAX_REPEATS), help="timed repeats of each measurement (median)")
    timeout_s: float = option(
        300.0, flag="--timeout", parse=positive_float, unit="s", help="seconds before every rank is stopped"
    )
    model: str | None = option(None, metavar="MODEL", help="also run this model's plans and learn its per-action cost")
    profile: str | None = option(None, metavar="PROFILE.json", help="with --model: the model's profile (plans its run)")
    global_batch: int | None = option(
        None,
        parse=int_range(1, MAX_GLOBAL_BATCH),
        help="with --model: the batch of its run (default: 2 micro-batches per rank of the largest profiled size)",
    )
    steps: int = option(5, parse=int_range(1, MAX_STEPS), help="with --model: timed steps of its run (default 5)")
    learn: str = option(
        "auto",
        choices=("auto", "1f1b", "every"),
        help="with --model: run 1F1B's plans only (one a profiled micro-batch size), or every schedule's at two "
        "micro-batch counts as well, each learning its own overhead (auto: every where 1F1B's plan steps in "
        "under 0.5 s; default auto)",
    )
    start: str | None = option(
        None,
        metavar="CALIBRATION.json",
        help="with --model: refit this calibration ('auto': the shipped one) instead of measuring the machine first; "
        "with --from-run: the calibration to refit (default: the one the run's plan was predicted with, where it "
        "names a file or the shipped one)",
    )
    from_run: tuple[str, ...] = option(
        (),
        flag="--from-run",
        repeat=True,
        metavar="RUN.json",
        help="refit from the run record of a real job (`examples/train.py --record`, `run.save_record`; "
        "repeatable) instead of running anything: co-location, per-action overhead, step tail",
    )
    skip_steps: int = option(
        1,
        parse=int_range(0, MAX_STEPS),
        help="with --from-run: recorded steps each rank's report leaves out first (default 1: the first step warms up)",
    )
    tolerance: float = option(
        0.15,
        parse=positive_float,
        help="with --from-run: say which term moved where a run and its plan's prediction disagree by more than "
        "this fraction (default 0.15 = 15%%)",
    )
    out: str | None = option(None, required=True, metavar="CALIBRATION.json", help="where to write the calibration")

    def __post_init__(self) -> None:
        check_fields(self)
