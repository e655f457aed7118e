"""pipeplan's command line: a thin shell over the library.

Each command reads its arguments (planner/commands/parser.py), calls one library function, prints that
artefact's formatter and says where it wrote it. Errors a user can cause (``PipeplanError``) are caught once,
here, and printed as one line with exit code 2; the library's warnings (``PipeplanWarning``) and notes (the
``pipeplan`` logger) reach stderr as ``pipeplan: ...`` lines. Library modules are imported inside the
commands so that ``--help`` answers without importing torch.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from planner.commands.checks import refuse_idle_plan_options, refuse_idle_simulate_options
from planner.commands.command_options import (
    CheckCommand,
    ExportOptions,
    PlanCommand,
    ShowOptions,
    TuneCommand,
    VerifyCommand,
)
from planner.commands.options import EXIT_USAGE, negative_values_attached, write_line
from planner.commands.parser import build_parser, command_options
from planner.commands.terminal import Signalled, library_words, quiet_torch, signals_interrupt
from planner.errors import PipeplanError, UsageError, shorten
from planner.request import PlanOptions
from planner.runtime.run_options import CalibrateOptions
from planner.simulate_options import SimulateOptions
from profiles.profile_options import ProfileOptions

__all__ = ["main", "build_parser"]

EXIT_INTERNAL = 1


def _model_file(spec: str | None) -> str | None:
    """The file a MODEL spec names, a Python file or an ``hf:`` config (an input no output may replace), if any."""
    from profiles.models.hf_spec import PREFIX, parse_hf_spec

    if spec and spec.startswith(PREFIX):
        return parse_hf_spec(spec)[0]
    target = (spec or "").rpartition(":")[0]
    return target if target.endswith(".py") else None


def _calibration_inputs(options: PlanOptions) -> list[str]:
    """The calibration file a command reads, if any: an input that no output may replace."""
    return [] if options.calibration in ("auto", "none") else [options.calibration]


def _beside(path: str, suffix: str) -> str:
    """``gpt2.plan.json`` -> ``gpt2.plan.calibration.json``."""
    return str(path).removesuffix(".json") + suffix


# --- commands ---------------------------------------------------------------------------------------------


def _cmd_modelled_profile(options: ProfileOptions) -> int:
    """``profile --device-model``: the roofline's profile, written without torch."""
    from planner.fileio import check_output_path
    from profiles.device_model import device_model
    from profiles.format import save_profile
    from profiles.modelled import load_hf_shape, modelled_profile
    from profiles.report import format_profile_table

    check_output_path(options.out, inputs=[_model_file(options.model), options.device_model])
    device = device_model(options.device_model or "")
    shape = load_hf_shape(options.model, options.seq_len)
    profile = modelled_profile(
        shape,
        device,
        options.micro_batch_sizes,
        precision=options.precision,
        recompute=options.recompute_within,
    )
    save_profile(profile, options.out)
    print(format_profile_table(profile))
    print(f"\nwrote {options.out} (modelled for {device.name}, nothing measured)")
    print(
        f"next: pipeplan plan {options.out} --devices N --global-batch B --out PLAN.json  (nodes of "
        f"{device.devices_per_node}, NVLink {device.intra_node_bytes_per_s / 1e9:g} GB/s and network "
        f"{device.inter_node_bytes_per_s / 1e9:g} GB/s a GPU each way, unless given)"
    )
    return 0


def _cmd_profile(options: ProfileOptions) -> int:
    if options.device_model:
        return _cmd_modelled_profile(options)
    from planner.fileio import check_output_path
    from profiles.format import save_profile
    from profiles.from_spec import profile_spec
    from profiles.report import format_profile_table

    check_output_path(options.out, inputs=[_model_file(options.model)])
    profile = profile_spec(options)
    learned = None
    if not options.no_pipeline_run:
        from planner.runtime.model_cost import learn_after_profile

        profile, learned = learn_after_profile(profile, options.model)
    save_profile(profile, options.out)
    print(format_profile_table(profile))
    if learned:
        print(learned)
    print(f"\nwrote {options.out}")
    ranks = options.ranks or 2
    print(f"next: pipeplan plan {options.out} --ranks {ranks} --global-batch B --out PLAN.json")
    if learned is None and not profile.settings.get("meta"):
        print(
            f"      (to predict this model's runs closely, learn its cost in a pipeline: pipeplan calibrate --ranks "
            f"{ranks} --model {options.model} --profile {options.out} --out CALIBRATION.json, then plan with "
            "--calibration)"
        )
    return 0


def _cmd_show(options: ShowOptions) -> int:
    from planner.commands.show import format_file

    print(format_file(options.file, options.micro_batch_size))
    return 0


def _cmd_calibrate(options: CalibrateOptions) -> int:
    from planner.calibration import format_calibration, save_calibration
    from planner.fileio import check_output_path
    from planner.runtime.calibrate_with import calibrate_with
    from planner.runtime.model_cost import format_learned

    if options.from_run:
        return _calibrate_from_runs(options)
    if (options.model is None) != (options.profile is None):
        raise UsageError("--model and --profile go together: the model to run and its profile (pipeplan profile)")
    if options.start is not None and options.model is None:
        raise UsageError(
            "--start only makes sense with --model or --from-run: it is the calibration the model's run refits"
        )
    inputs = [options.profile, None if options.start == "auto" else options.start, _model_file(options.model)]
    check_output_path(options.out, inputs=[p for p in inputs if p])
    with signals_interrupt(), quiet_torch():
        before, run = calibrate_with(options)
    calibration = before if run is None else run.calibration
    save_calibration(calibration, options.out)
    print(format_calibration(calibration))
    if run is not None:
        print(format_learned(run, before, options.model))
    print(f"\nwrote {options.out}")
    return 0


def _calibrate_from_runs(options: CalibrateOptions) -> int:
    """``calibrate --from-run``: refit from run records; runs nothing."""
    from planner.calibration import format_calibration, save_calibration
    from planner.fileio import check_output_path
    from planner.runtime.calibrate_with import calibrate_from_runs
    from planner.runtime.run_refit import format_run_refit

    if options.model is not None or options.profile is not None:
        raise UsageError("--from-run refits from the records alone: leave out --model and --profile")
    start = None if options.start == "auto" else options.start
    check_output_path(options.out, inputs=[*options.from_run, *([start] if start else [])])
    result = calibrate_from_runs(options)
    save_calibration(result.calibration, options.out)
    print(format_calibration(result.calibration))
    print()
    print(format_run_refit(result))
    print(f"\nwrote {options.out}")
    return 0


def _cmd_plan(options: PlanCommand) -> int:
    from planner.fileio import check_output_path
    from planner.formatting import human_seconds
    from planner.plan import save_plan
    from planner.planning import plan_profile
    from planner.report import format_cluster, format_plan

    search = options.search
    check_output_path(options.out, inputs=[options.profile, *_calibration_inputs(search)])
    refuse_idle_plan_options(options)
    planned = plan_profile(options.profile, search, options.cluster, record_timing=options.record_timing)
    plan = planned.plan
    save_plan(plan, options.out)
    if planned.cluster is not None:
        print(format_cluster(planned.cluster))
        print()
    print(format_plan(plan))
    if planned.fewer_ranks is not None:
        ranks, iteration_s = planned.fewer_ranks
        print(
            f"note: {ranks} ranks predict {human_seconds(iteration_s)} per iteration, faster than these "
            f"{plan.num_ranks}: the work does not split that far; plan with --ranks {ranks}"
        )
    print(f"\nwrote {options.out}")
    print(f"next: pipeplan simulate {options.out} --out timeline.png   (see the bubble)")
    print(f"      pipeplan verify {options.out} --model {plan.model_name}   (run it, compare with the prediction)")
    if search.trainer:
        print(f"      pipeplan export {options.out} --to {search.trainer}   (the trainer's configuration)")
    return 0


def _cmd_export(options: ExportOptions) -> int:
    from planner.export import export_plan
    from planner.fileio import check_output_path, write_atomic
    from planner.plan import load_plan

    if options.out:
        check_output_path(options.out, inputs=[options.plan])
    plan = load_plan(options.plan)
    config = export_plan(plan, options.to, renames=options.renames, trainer_version=options.trainer_version)
    if options.out:
        write_atomic(options.out, config.text().encode())
        print(f"wrote {options.out}")
    else:
        sys.stdout.write(config.text())
    return 0


def _cmd_check(options: CheckCommand) -> int:
    """``check``: exit 0 when the configuration fits every rank, 1 when some rank would run out of memory."""
    from planner.check import check_config, format_check, read_config_file
    from planner.fileio import check_output_path
    from planner.plan import save_plan

    if options.out:
        check_output_path(options.out, inputs=[options.profile, options.config])
    text = read_config_file(options.config)
    result = check_config(options.profile, options.trainer, text, options.check)
    print(format_check(result))
    if options.out:
        save_plan(result.plan, options.out)
        print(f"\nwrote {options.out}")
        print(f"next: pipeplan simulate {options.out}   (see the bubble)")
        print(f"      pipeplan verify {options.out} --model {result.plan.model_name}   (run it)")
    return 0 if result.fits else 1


def _cmd_tune(options: TuneCommand) -> int:
    from tqdm import tqdm

    from planner.calibration import save_calibration
    from planner.fileio import check_output_path
    from planner.plan import save_plan
    from planner.planning import request_for
    from planner.report import format_plan
    from planner.request import profile_sha256
    from planner.runtime.tune import format_tune_table, tune
    from profiles.format import load_profile

    search = options.search
    check_output_path(options.out, inputs=[options.profile, *_calibration_inputs(search)])
    calibration_out = options.calibration_out or _beside(options.out, ".calibration.json")
    check_output_path(calibration_out, inputs=[options.profile, options.out, *_calibration_inputs(search)])
    if search.calibration == "none":
        raise UsageError("tune refits a calibration: give --calibration auto (the shipped one) or a file")
    profile = load_profile(options.profile)
    request = request_for(profile, search)
    total = options.run.candidates + 1
    with tqdm(total=total, disable=options.no_progress, file=sys.stderr, leave=False) as bar:

        def progress(text: str) -> None:
            bar.set_description(text)
            bar.update()

        sha256 = profile_sha256(options.profile)
        result = tune(profile, request, options.model, options.run, sha256=sha256, on_progress=progress)
    save_plan(result.best, options.out)
    save_calibration(result.calibration, calibration_out)
    print(format_tune_table(result))
    print()
    print(format_plan(result.best))
    print(f"\nwrote {options.out} and {calibration_out}")
    return 0


def _simulate_outputs(options: SimulateOptions) -> None:
    """The charts ``simulate`` writes: each a picture format, neither an input, not both the same file."""
    from planner.fileio import check_output_path
    from planner.schedule.timeline import picture_format

    outputs = [out for out in (options.out, options.compare_out) if out is not None]
    for out in outputs:
        check_output_path(out, inputs=[options.plan])
        picture_format(out)
    if len(outputs) == 2 and os.path.realpath(outputs[0]) == os.path.realpath(outputs[1]):
        raise UsageError(f"--out and --compare-out both name {shorten(outputs[0])}: give two files")


def _cmd_simulate(options: SimulateOptions) -> int:
    from planner.schedule.timeline import (
        ascii_timeline,
        format_comparison,
        render_comparison_png,
        render_png,
        time_breakdown,
    )
    from planner.simulate_options import simulate

    _simulate_outputs(options)
    refuse_idle_simulate_options(options)
    run = simulate(options)
    result = run.result
    if options.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(ascii_timeline(result))
        print("\nwhere the time goes (per rank, one iteration):")
        print(time_breakdown(result))
    if options.out:
        render_png(result, options.out)
        if not options.json:
            print(f"wrote {options.out}")
    if run.compared and not options.json:
        footing = "the plan's runtime terms" if options.plan else "compute and links only"
        print(f"\nthe same stages under other schedules ({footing}):")
        print(format_comparison(run.compared))
    if options.compare_out:
        render_comparison_png(run.compared, options.compare_out)
        if not options.json:
            print(f"wrote {options.compare_out}")
    if not options.json and run.plan is not None:
        model = run.plan.model_name
        print(f"next: pipeplan verify {options.plan} --model {model}   (run it, compare with the prediction)")
    return 0


def _cmd_verify(options: VerifyCommand) -> int:
    from planner.fileio import check_output_path, write_json_atomic
    from planner.plan import load_plan
    from planner.runtime.torchrun import is_reporting_rank
    from planner.runtime.verify import format_report, verify_plan

    # Checked on every rank of a torchrun job too, so that a bad path stops them all before any waits on another.
    if options.out:
        check_output_path(options.out, inputs=[options.plan, _model_file(options.model)])
    plan = load_plan(options.plan)
    with signals_interrupt(), quiet_torch():
        report = verify_plan(plan, options.model, options.run)
    if not is_reporting_rank():
        return 0 if report.ok else 1  # a torchrun job's rank 0 prints and writes the job's one report
    print(format_report(report))
    if options.out:
        write_json_atomic(options.out, report.to_dict())
        print(f"wrote {options.out}")
    return 0 if report.ok else 1


_COMMANDS: dict[str, Callable[[Any], int]] = {
    "profile": _cmd_profile,
    "calibrate": _cmd_calibrate,
    "show": _cmd_show,
    "plan": _cmd_plan,
    "tune": _cmd_tune,
    "export": _cmd_export,
    "check": _cmd_check,
    "simulate": _cmd_simulate,
    "verify": _cmd_verify,
}


# Errors that are not pipeplan's own but that user input can still reach (a full disk, a name the file
# system refuses, a number or a structure too large for Python): reported as one line like a PipeplanError.
_ENVIRONMENT_ERRORS = (OSError, OverflowError, RecursionError, MemoryError, UnicodeError)


def main(argv: Sequence[str] | None = None) -> int:
    # torch 2.13's pipelining tracer warns about its own use of a deprecated pytree API; not the user's concern.
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*", category=FutureWarning)
    parser = build_parser()
    args = parser.parse_args(negative_values_attached(sys.argv[1:] if argv is None else argv))
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    prefix = f"pipeplan {args.command}"
    try:
        with library_words():
            return _COMMANDS[args.command](command_options(args))
    except PipeplanError as exc:
        remote = getattr(exc, "remote_traceback", "")
        if remote and getattr(args, "verbose", False):
            sys.stderr.write(remote.rstrip("\n") + "\n")
        write_line(f"{prefix}: error: {exc}")
        return EXIT_USAGE
    except Signalled as exc:
        write_line(f"{prefix}: stopped by {exc}")
        return 128 + exc.signum
    except KeyboardInterrupt:
        write_line(f"{prefix}: interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (``pipeplan show P | head``): nothing left to say, and nothing to say it to.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _ENVIRONMENT_ERRORS as exc:
        write_line(f"{prefix}: error: {type(exc).__name__}: {exc}")
        return EXIT_USAGE
    except Exception as exc:  # a bug in pipeplan: still one line, and the way to see the traceback
        if os.environ.get("PIPEPLAN_DEBUG"):
            raise
        write_line(
            f"{prefix}: internal error (a bug in pipeplan; PIPEPLAN_DEBUG=1 shows the traceback): "
            f"{type(exc).__name__}: {exc}"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
