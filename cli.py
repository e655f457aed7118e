"""pipeplan's command line: a thin shell over the library.

Each command reads its arguments (planner/commands/parser.py), calls one library function, prints that
artefact's formatter and says where it wrote it. Errors a user can cause (``PipeplanError``) are caught once,
here, and printed as one line with exit code 2; the library's warnings (``PipeplanWarning``) and notes (the
``pipeplan`` logger) reach stderr as ``pipeplan: ...`` lines. Library modules are imported inside the
commands so that ``--help`` answers without importing torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from planner.commands.checks import refuse_idle_options
from planner.commands.options import EXIT_USAGE, items, negative_values_attached, write_line
from planner.commands.parser import build_parser
from planner.commands.terminal import Signalled, library_words, quiet_torch, signals_interrupt
from planner.errors import PipeplanError, UsageError, shorten
from planner.schedule.orders import Schedule

if TYPE_CHECKING:
    from planner.request import PlanRequest
    from profiles.format import Profile

__all__ = ["main", "build_parser"]

EXIT_INTERNAL = 1


def _model_file(spec: str) -> str | None:
    """The Python file a MODEL spec names (an input no output may replace), if any."""
    target = spec.rpartition(":")[0]
    return target if target.endswith(".py") else None


def _calibration_inputs(args: argparse.Namespace) -> list[str]:
    """The calibration file a command reads, if any: an input that no output may replace."""
    return [] if args.calibration in ("auto", "none") else [args.calibration]


def _beside(path: str, suffix: str) -> str:
    """``gpt2.plan.json`` -> ``gpt2.plan.calibration.json``."""
    return str(path).removesuffix(".json") + suffix


# --- commands ---------------------------------------------------------------------------------------------


def _cmd_profile(args: argparse.Namespace) -> int:
    from planner.fileio import check_output_path
    from profiles.format import save_profile
    from profiles.from_spec import profile_spec
    from profiles.report import format_profile_table

    check_output_path(args.out, inputs=[_model_file(args.model)])
    profile = profile_spec(
        args.model,
        micro_batch_sizes=args.micro_batch_sizes,
        device=args.device,
        dtype=args.dtype,
        seq_len=args.seq_len,
        task=args.task,
        repeats=args.repeats,
        max_repeats=args.max_repeats,
        min_time_s=args.min_time,
        warmup=args.warmup,
        units=args.units,
        threads=args.threads,
        ranks=args.ranks,
        meta=args.meta,
        sample_blocks=args.sample_blocks,
        progress=not args.no_progress,
    )
    learned = None
    if not args.no_pipeline_run:
        from planner.runtime.model_cost import learn_after_profile

        profile, learned = learn_after_profile(profile, args.model)
    save_profile(profile, args.out)
    print(format_profile_table(profile))
    if learned:
        print(learned)
    print(f"\nwrote {args.out}")
    ranks = args.ranks or 2
    print(f"next: pipeplan plan {args.out} --ranks {ranks} --global-batch B --out PLAN.json")
    if learned is None and not profile.settings.get("meta"):
        print(
            f"      (to predict this model's runs closely, learn its cost in a pipeline: pipeplan calibrate --ranks "
            f"{ranks} --model {args.model} --profile {args.out} --out CALIBRATION.json, then plan with --calibration)"
        )
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from planner.commands.show import format_file

    print(format_file(args.file, args.micro_batch_size))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from planner.calibration import format_calibration, load_calibration, save_calibration, shipped_calibration
    from planner.fileio import check_output_path
    from planner.request import profile_sha256
    from planner.runtime.calibrate import calibrate
    from planner.runtime.model_cost import format_learned, learn_model_cost_on_ranks
    from profiles.format import load_profile

    if (args.model is None) != (args.profile is None):
        raise UsageError("--model and --profile go together: the model to run and its profile (pipeplan profile)")
    if args.start is not None and args.model is None:
        raise UsageError("--start only makes sense with --model: it is the calibration the model's run refits")
    inputs = [args.profile, None if args.start == "auto" else args.start, args.model and _model_file(args.model)]
    check_output_path(args.out, inputs=[p for p in inputs if p])
    profile = load_profile(args.profile) if args.profile is not None else None
    run = None
    with signals_interrupt(), quiet_torch():
        if args.start is None:
            calibration = calibrate(args.ranks, device=args.device, repeats=args.repeats, timeout_s=args.timeout)
        elif args.start == "auto":
            calibration = shipped_calibration(args.device)
        else:
            calibration = load_calibration(args.start)
        before = calibration
        if profile is not None:
            run = learn_model_cost_on_ranks(
                calibration,
                profile,
                args.model,
                num_ranks=args.ranks,
                sha256=profile_sha256(args.profile),
                global_batch=args.global_batch,
                steps=args.steps,
                device=args.device,
                timeout_s=args.timeout,
                every_schedule={"auto": None, "1f1b": False, "every": True}[args.learn],
            )
            calibration = run.calibration
    save_calibration(calibration, args.out)
    print(format_calibration(calibration))
    if run is not None:
        print(format_learned(run, before, args.model))
    print(f"\nwrote {args.out}")
    return 0


def _plan_request(args: argparse.Namespace, profile: Profile) -> PlanRequest:
    """The search request that ``plan`` and ``tune`` build from the same options."""
    from planner.request import plan_request

    return plan_request(
        profile,
        stages=args.ranks,
        global_batch=args.global_batch,
        cluster=getattr(args, "devices", None) is not None,
        memory_bytes=args.memory,
        device_memory_bytes=args.device_memory,
        device_speeds=args.device_speeds,
        link_bytes_per_s=args.bandwidth,
        link_latency_s=args.latency,
        optimizer=args.optimizer,
        schedule=args.schedule,
        micro_batch_size=args.micro_batch_size,
        recompute=args.recompute,
        solver=args.solver,
        calibration=args.calibration,
        pins=args.pin or (),
        max_units_per_stage=args.max_units_per_stage,
        ilp_time_limit_s=args.time_limit,
    )


def _tp_switches(args: argparse.Namespace) -> dict[str, bool]:
    """``plan_cluster``'s tensor-parallel layout from ``--tp-layout`` and ``--sequence-parallel``: by default the
    layout of whoever runs the plan, Megatron's for a plan made ``--for megatron|torchtitan``, else pipeplan's."""
    from planner.tensor_parallel import TpLayout, layout_switches

    default = TpLayout.MEGATRON if args.trainer in ("megatron", "torchtitan") else TpLayout.BLOCKS
    layout = TpLayout(args.tp_layout) if args.tp_layout else default
    sequence = None if args.sequence_parallel is None else args.sequence_parallel == "on"
    sequence_parallel, vocab_parallel = layout_switches(layout, sequence)
    return {"sequence_parallel": sequence_parallel, "vocab_parallel": vocab_parallel}


def _cmd_plan(args: argparse.Namespace) -> int:
    from planner.cluster import default_cluster, plan_cluster
    from planner.fileio import check_output_path
    from planner.formatting import human_seconds
    from planner.plan import save_plan
    from planner.report import format_cluster, format_plan
    from planner.request import profile_sha256
    from planner.search import fewer_ranks_faster, make_plan
    from planner.trainer_rules import check_trainer, for_trainer
    from profiles.format import load_profile

    check_output_path(args.out, inputs=[args.profile, *_calibration_inputs(args)])
    refuse_idle_options(args)
    profile = load_profile(args.profile)
    request = _plan_request(args, profile)
    if args.trainer:
        request = for_trainer(profile, request, args.trainer)
    sha256 = profile_sha256(args.profile)
    if args.devices is None:
        plan = make_plan(profile, request, sha256=sha256, record_timing=args.record_timing)
        if args.trainer:
            check_trainer(plan, args.trainer)
        save_plan(plan, args.out)
        print(format_plan(plan))
        faster = fewer_ranks_faster(profile, request, plan)
        if faster is not None:
            print(
                f"note: {faster[0]} ranks predict {human_seconds(faster[1])} per iteration, faster than these "
                f"{plan.num_ranks}: the work does not split that far; plan with --ranks {faster[0]}"
            )
    else:
        cluster = default_cluster(
            profile.device.kind,
            args.devices,
            devices_per_node=args.devices_per_node,
            intra_node_bytes_per_s=args.intra_node_bandwidth,
            inter_node_bytes_per_s=args.inter_node_bandwidth,
            latency_s=args.latency,
            shard=args.shard,
        )
        result = plan_cluster(
            profile,
            request,
            cluster,
            sha256=sha256,
            pipeline_degree=args.ranks,
            tensor_parallel=None if args.tensor_parallel == "auto" else args.tensor_parallel or 1,
            attention_heads=args.attention_heads,
            **_tp_switches(args),
            record_timing=args.record_timing,
            jobs=args.jobs or os.cpu_count() or 1,
        )
        plan = result.plan
        if args.trainer:
            check_trainer(plan, args.trainer)
        save_plan(plan, args.out)
        print(format_cluster(result))
        print()
        print(format_plan(plan))
    print(f"\nwrote {args.out}")
    print(f"next: pipeplan simulate {args.out} --out timeline.png   (see the bubble)")
    print(f"      pipeplan verify {args.out} --model {plan.model_name}   (run it, compare with the prediction)")
    if args.trainer:
        print(f"      pipeplan export {args.out} --to {args.trainer}   (the trainer's configuration)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from planner.export import export_plan
    from planner.fileio import check_output_path, write_atomic
    from planner.plan import load_plan

    if args.out:
        check_output_path(args.out, inputs=[args.plan])
    config = export_plan(load_plan(args.plan), args.to, renames=args.rename or (), trainer_version=args.trainer_version)
    if args.out:
        write_atomic(args.out, config.text().encode())
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(config.text())
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from planner.calibration import save_calibration
    from planner.fileio import check_output_path
    from planner.plan import save_plan
    from planner.report import format_plan
    from planner.request import profile_sha256
    from planner.runtime.tune import format_tune_table, tune
    from profiles.format import load_profile

    check_output_path(args.out, inputs=[args.profile, *_calibration_inputs(args)])
    calibration_out = args.calibration_out or _beside(args.out, ".calibration.json")
    check_output_path(calibration_out, inputs=[args.profile, args.out, *_calibration_inputs(args)])
    if args.calibration == "none":
        raise UsageError("tune refits a calibration: give --calibration auto (the shipped one) or a file")
    profile = load_profile(args.profile)
    request = _plan_request(args, profile)
    if args.trainer:
        from planner.trainer_rules import for_trainer

        request = for_trainer(profile, request, args.trainer)
    with tqdm(total=args.candidates + 1, disable=args.no_progress, file=sys.stderr, leave=False) as bar:

        def progress(text: str) -> None:
            bar.set_description(text)
            bar.update()

        result = tune(
            profile,
            request,
            args.model,
            sha256=profile_sha256(args.profile),
            candidates=args.candidates,
            steps=args.steps,
            warmup=args.warmup,
            mode=args.mode,
            device=args.device,
            timeout_s=args.timeout,
            on_progress=progress,
        )
    save_plan(result.best, args.out)
    save_calibration(result.calibration, calibration_out)
    print(format_tune_table(result))
    print()
    print(format_plan(result.best))
    print(f"\nwrote {args.out} and {calibration_out}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from planner.compare import compare_plan
    from planner.fileio import check_output_path
    from planner.limits import check_simulation
    from planner.plan import load_plan
    from planner.schedule.timeline import (
        ascii_timeline,
        format_comparison,
        picture_format,
        render_comparison_png,
        render_png,
        time_breakdown,
    )
    from planner.schedule.what_if import compare_schedules, what_if_pipeline

    outputs = [out for out in (args.out, args.compare_out) if out is not None]
    for out in outputs:
        check_output_path(out, inputs=[args.plan])
        picture_format(out)
    if len(outputs) == 2 and os.path.realpath(outputs[0]) == os.path.realpath(outputs[1]):
        raise UsageError(f"--out and --compare-out both name {shorten(outputs[0])}: give two files")
    refuse_idle_options(args)
    compare = [Schedule.parse(name) for name in items(args.compare, 8)] if args.compare else []
    if args.plan:
        plan = load_plan(args.plan)
        pipeline = plan.pipeline()
        check_simulation(pipeline.num_stages, pipeline.num_microbatches)
        results = compare_plan(plan, compare) if compare else []
    elif not args.ranks or not args.micro_batches:
        raise UsageError("give a PLAN.json, or --ranks and --micro-batches for a what-if simulation")
    else:
        pipeline = what_if_pipeline(
            args.ranks,
            args.micro_batches,
            Schedule.parse(args.schedule or "1f1b"),
            virtual_stages=args.virtual_stages,
            stage_times=args.stage_times,
            backward_times=args.backward_times,
            weight_times=args.weight_times,
            backward_ratio=args.backward_ratio,
        )
        check_simulation(pipeline.num_stages, pipeline.num_microbatches)
        results = compare_schedules(pipeline, compare, args.virtual_stages) if compare else []
    result = pipeline.simulate()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(ascii_timeline(result))
        print("\nwhere the time goes (per rank, one iteration):")
        print(time_breakdown(result))
    if args.out:
        render_png(result, args.out)
        if not args.json:
            print(f"wrote {args.out}")
    if results and not args.json:
        footing = "the plan's runtime terms" if args.plan else "compute and links only"
        print(f"\nthe same stages under other schedules ({footing}):")
        print(format_comparison(results))
    if args.compare_out:
        render_comparison_png(results, args.compare_out)
        if not args.json:
            print(f"wrote {args.compare_out}")
    if not args.json and args.plan:
        print(f"next: pipeplan verify {args.plan} --model {plan.model_name}   (run it, compare with the prediction)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from planner.fileio import check_output_path, write_json_atomic
    from planner.plan import load_plan
    from planner.runtime.verify import format_report, verify_plan

    if args.out:
        check_output_path(args.out, inputs=[args.plan, _model_file(args.model)])
    plan = load_plan(args.plan)
    with signals_interrupt(), quiet_torch():
        report = verify_plan(
            plan,
            args.model,
            steps=args.steps,
            warmup=args.warmup,
            tolerance=args.tolerance,
            mode=args.mode,
            check_numerics=args.check_numerics,
            timeout_s=args.timeout,
            device=args.device,
            memory_tolerance=args.memory_tolerance,
        )
    print(format_report(report))
    if args.out:
        write_json_atomic(args.out, report.to_dict())
        print(f"wrote {args.out}")
    return 0 if report.ok else 1


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "profile": _cmd_profile,
    "calibrate": _cmd_calibrate,
    "show": _cmd_show,
    "plan": _cmd_plan,
    "tune": _cmd_tune,
    "export": _cmd_export,
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
            return _COMMANDS[args.command](args)
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
