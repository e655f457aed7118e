"""pipeplan's command line. It only wires: every command calls the documented Python API.

Errors a user can cause (``PipeplanError``) are caught once, here, and printed as one line
with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence

from planner.errors import PipeplanError, UsageError
from planner.schedule.orders import Schedule

__all__ = ["main", "build_parser"]

EXIT_USAGE = 2

_TOP = """\
pipeplan: profile a PyTorch model once, get an exact pipeline-parallel plan, apply it with
torch.distributed.pipelining.

  pipeplan profile gpt2-small --out gpt2.profile.json      measure every unit on this device
  pipeplan plan gpt2.profile.json --stages 4 --global-batch 16 --out gpt2.plan.json
  pipeplan simulate gpt2.plan.json --png timeline.png      see the bubble
  pipeplan verify gpt2.plan.json --model gpt2-small        run it, compare with the prediction
  pipeplan show gpt2.plan.json                             reprint a profile or plan

Run `pipeplan COMMAND --help` for each command's options.
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"pipeplan {self.prog.split()[-1]}: error: {message} (see --help)\n")


def _int_at_least(minimum: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= {minimum}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(1, text)


def _nonneg_int(text: str) -> int:
    return _int_at_least(0, text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(_positive_int(t.strip()) for t in text.split(",") if t.strip()) or _fail(f"{text!r} is empty")


def _float_list(text: str) -> tuple[float, ...]:
    return tuple(_positive_float(t.strip()) for t in text.split(",") if t.strip()) or _fail(f"{text!r} is empty")


def _fail(message: str) -> tuple:
    raise argparse.ArgumentTypeError(message)


def _memory(text: str) -> int:
    from planner.cost import parse_bytes

    try:
        return parse_bytes(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _memory_list(text: str) -> tuple[int, ...]:
    return tuple(_memory(t) for t in text.split(",") if t.strip())


def _bandwidth(text: str) -> float:
    value = _memory(text.strip().removesuffix("/s"))
    return float(value)


def _pin(text: str) -> tuple[str, int]:
    name, sep, stage = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: write UNIT=STAGE, e.g. lm_head=3")
    return name, _nonneg_int(stage)


# --- commands ---------------------------------------------------------------------------------------------


def _rank_threads(ranks: int) -> int:
    """Threads each of ``ranks`` processes on this machine gets: the rule of planner/runtime/launch.py."""
    return max(1, (os.cpu_count() or 1) // ranks)


def _cmd_profile(args: argparse.Namespace) -> int:
    from planner.fileio import check_output_path
    from profiles.format import save_profile
    from profiles.profiler import profile_model
    from profiles.report import format_profile_table
    from profiles.workload import load_workload

    check_output_path(args.out)
    threads = args.threads or (_rank_threads(args.ranks) if args.ranks else None)
    if threads:
        import torch

        torch.set_num_threads(threads)
    workload = load_workload(args.model, seq_len=args.seq_len)
    units: object = None
    if args.units:
        units = int(args.units) if args.units.isdigit() else [u.strip() for u in args.units.split(",") if u.strip()]
    profile = profile_model(
        workload,
        micro_batch_sizes=args.micro_batch_sizes,
        device=args.device,
        dtype=args.dtype,
        repeats=args.repeats,
        max_repeats=max(args.max_repeats, args.repeats),
        warmup=args.warmup,
        units=units,
        progress=not args.no_progress,
    )
    save_profile(profile, args.out)
    print(format_profile_table(profile))
    print(f"\nwrote {args.out}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from planner.fileio import read_json

    data = read_json(args.file, UsageError, "JSON")
    kind = data.get("format") if isinstance(data, dict) else None
    if kind == "pipeplan.plan":
        from planner.plan import load_plan
        from planner.report import format_plan

        print(format_plan(load_plan(args.file)))
    elif kind == "pipeplan.profile":
        from profiles.format import load_profile
        from profiles.report import format_profile_table

        print(format_profile_table(load_profile(args.file)))
    else:
        raise UsageError(f"{args.file} is neither a pipeplan profile nor a plan (format {kind!r})")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from planner.cost import default_settings
    from planner.fileio import check_output_path
    from planner.plan import save_plan
    from planner.report import format_plan
    from planner.search import PlanRequest, make_plan, profile_sha256
    from profiles.format import load_profile

    check_output_path(args.out)
    profile = load_profile(args.profile)
    memory = (args.memory,) if args.memory else args.device_memory
    settings = default_settings(
        profile,
        optimizer=args.optimizer,
        link_bytes_per_s=args.bandwidth,
        link_latency_s=args.latency,
        device_memory_bytes=memory or (),
        device_speeds=args.device_speeds or (),
    )
    request = PlanRequest(
        num_ranks=args.stages,
        global_batch_size=args.global_batch,
        schedule=None if args.schedule == "auto" else Schedule.parse(args.schedule),
        micro_batch_size=None if args.micro_batch_size == "auto" else _positive_int(args.micro_batch_size),
        recompute=args.recompute,
        solver=args.solver,
        settings=settings,
        pinned=tuple(args.pin or ()),
        max_units_per_stage=args.max_units_per_stage,
        ilp_time_limit_s=args.time_limit,
    )
    plan = make_plan(profile, request, sha256=profile_sha256(args.profile), record_timing=args.record_timing)
    save_plan(plan, args.out)
    print(format_plan(plan))
    print(f"\nwrote {args.out}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from planner.schedule.simulate import simulate
    from planner.schedule.timeline import ascii_timeline, render_comparison_png, render_png

    if args.plan:
        from planner.plan import load_plan

        plan = load_plan(args.plan)
        forward = [s.forward_s for s in plan.stages]
        backward = [s.backward_s for s in plan.stages]
        m, ranks, schedule = plan.num_microbatches, plan.num_ranks, plan.schedule
        comm_f, comm_b = plan.predicted.comm_forward_s, plan.predicted.comm_backward_s
    else:
        if not args.stages or not args.microbatches:
            raise UsageError("give a PLAN.json, or --stages and --microbatches for a what-if simulation")
        schedule = Schedule.parse(args.schedule or "1f1b")
        v = args.virtual_stages if schedule is Schedule.INTERLEAVED_1F1B else 1
        n_stages = args.stages * v
        forward = list(args.stage_times) if args.stage_times else [1.0] * n_stages
        if len(forward) != n_stages:
            raise UsageError(f"--stage-times has {len(forward)} values for {n_stages} stages")
        backward = list(args.backward_times) if args.backward_times else [args.backward_ratio * f for f in forward]
        if len(backward) != n_stages:
            raise UsageError(f"--backward-times has {len(backward)} values for {n_stages} stages")
        m, ranks = args.microbatches, args.stages
        comm_f = comm_b = ()
    result = simulate(forward, backward, m, schedule, num_ranks=ranks, comm_forward_s=comm_f, comm_backward_s=comm_b)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(ascii_timeline(result))
    if args.png:
        render_png(result, args.png)
        if not args.json:
            print(f"wrote {args.png}")
    if args.compare:
        results = [
            _simulate_as(Schedule.parse(name), forward, backward, m, ranks, comm_f, comm_b, args.virtual_stages)
            for name in args.compare.split(",")
        ]
        out = args.compare_png or "schedules.png"
        render_comparison_png(results, out)
        if not args.json:
            for r in results:
                print(
                    f"{r.schedule:>18}: iteration {r.iteration_s:.4g} s, bubble {r.bubble_fraction:.1%}, "
                    f"peak in-flight {max(r.peak_in_flight)}"
                )
            print(f"wrote {out}")
    return 0


def _simulate_as(
    schedule: Schedule,
    forward: list[float],
    backward: list[float],
    m: int,
    ranks: int,
    comm_f: Sequence[float],
    comm_b: Sequence[float],
    virtual_stages: int,
):
    """The same per-rank work under ``schedule``; interleaving cuts each rank's stage into v equal chunks."""
    from planner.schedule.simulate import simulate

    if schedule is Schedule.INTERLEAVED_1F1B and len(forward) == ranks and virtual_stages > 1:
        v = virtual_stages
        # Looped placement: stage s runs on rank s % ranks; chunks inside a rank have no transfer time.
        forward = [forward[s % ranks] / v for s in range(ranks * v)]
        backward = [backward[s % ranks] / v for s in range(ranks * v)]
        comm_f = comm_b = ()
    return simulate(forward, backward, m, schedule, num_ranks=ranks, comm_forward_s=comm_f, comm_backward_s=comm_b)


def _cmd_verify(args: argparse.Namespace) -> int:
    from planner.fileio import write_json_atomic
    from planner.plan import load_plan
    from planner.runtime.verify import format_report, verify_plan

    plan = load_plan(args.plan)
    if args.out:
        from planner.fileio import check_output_path

        check_output_path(args.out)
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
    )
    print(format_report(report))
    if args.out:
        write_json_atomic(args.out, report.to_dict())
        print(f"wrote {args.out}")
    return 0 if report.ok else 1


# --- parser -----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from profiles.models import BUILTIN_NAMES

    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="pipeplan", description=_TOP, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "profile",
        help="measure a model unit by unit into a profile JSON",
        formatter_class=fmt,
        description=(
            "Measure every unit (block) of MODEL on this device: forward and backward time, FLOPs (fvcore,\n"
            "multiply-adds), output and saved-activation bytes, parameters, and the tensors flowing between\n"
            "units, for several micro-batch sizes. The unit sum is checked against the whole model.\n\n"
            f"MODEL is a built-in ({', '.join(BUILTIN_NAMES)}), path/to/file.py:NAME or\n"
            "package.module:NAME, NAME being a zero-argument function returning a profiles.workload.Workload.\n\n"
            "example:\n  pipeplan profile gpt2-small --micro-batch-sizes 1,2,4 --out gpt2.profile.json"
        ),
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="where to write the profile (atomically)")
    p.add_argument(
        "--micro-batch-sizes",
        type=_int_list,
        default=(1, 2, 4),
        metavar="1,2,4",
        help="micro-batch sizes to measure (default 1,2,4)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length of built-in language models")
    p.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="timed rounds at least (each times every unit once); the median is kept (default 3)",
    )
    p.add_argument(
        "--max-repeats",
        type=_positive_int,
        default=15,
        help="timed rounds at most: rounds go on until the medians of the unit sum and of the whole model "
        "move by 1%% or less (default 15)",
    )
    p.add_argument("--warmup", type=_nonneg_int, default=1, help="untimed warm-up runs (default 1)")
    p.add_argument(
        "--units",
        default=None,
        metavar="FQN,FQN|DEPTH",
        help="unit FQNs in execution order, or a module depth (default: the largest repeated block list)",
    )
    threads = p.add_mutually_exclusive_group()
    threads.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="CPU intra-op threads while measuring; match what each rank will get (cores / ranks per machine)",
    )
    threads.add_argument(
        "--ranks",
        type=_positive_int,
        default=None,
        metavar="P",
        help="profile with the threads each of P ranks on this machine will get: cores // P, as the runtime sets",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser(
        "show",
        help="print a profile or plan file as a table",
        formatter_class=fmt,
        description="Reprint the table of a profile or a plan file.",
    )
    p.add_argument("file", metavar="FILE.json")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser(
        "plan",
        help="solve for the best pipeline plan from a profile",
        formatter_class=fmt,
        description=(
            "Find stage boundaries, micro-batch size and count, schedule and recomputation that minimise the\n"
            "iteration time under each device's memory. An exact DP (or ILP) solves each candidate for its\n"
            "declared objective; the schedule simulator then scores the best partitions and the best\n"
            "simulated plan wins. Baselines (uniform, by parameters, by time) are scored the same way.\n\n"
            "example:\n"
            "  pipeplan plan gpt2.profile.json --stages 4 --global-batch 16 --memory 16GiB --out gpt2.plan.json"
        ),
    )
    p.add_argument("profile", metavar="PROFILE.json")
    p.add_argument("--out", required=True, metavar="PLAN.json")
    p.add_argument("--stages", type=_positive_int, required=True, help="pipeline ranks (devices), P")
    p.add_argument("--global-batch", type=_positive_int, required=True, help="samples per iteration, B = b x M")
    p.add_argument(
        "--memory",
        type=_memory,
        default=None,
        metavar="80GiB",
        help="memory of every device (default: the profiled device's), less 10%% headroom",
    )
    p.add_argument(
        "--device-memory",
        type=_memory_list,
        default=None,
        metavar="80GiB,40GiB,...",
        help="memory per rank (heterogeneous devices)",
    )
    p.add_argument(
        "--device-speeds",
        type=_float_list,
        default=None,
        metavar="1,1,0.5,...",
        help="speed per rank relative to the profiled device (uses the ILP)",
    )
    p.add_argument(
        "--bandwidth",
        type=_bandwidth,
        default=None,
        metavar="25GB/s",
        help="link bandwidth per pipeline hop (default: cpu 1.1GB/s, cuda 25GB/s)",
    )
    p.add_argument(
        "--latency",
        type=float,
        default=None,
        metavar="SECONDS",
        help="link latency per message (default: cpu 130e-6, cuda 10e-6)",
    )
    p.add_argument(
        "--optimizer",
        choices=("sgd", "adam"),
        default="adam",
        help="decides the optimizer state per parameter (default adam)",
    )
    p.add_argument("--schedule", choices=("auto", "gpipe", "1f1b", "interleaved-1f1b"), default="auto")
    p.add_argument("--micro-batch-size", default="auto", metavar="auto|N")
    p.add_argument(
        "--recompute",
        choices=("auto", "on", "off"),
        default="auto",
        help="activation recomputation: chosen per stage (auto), on or off",
    )
    p.add_argument("--solver", choices=("auto", "dp", "ilp"), default="auto")
    p.add_argument("--pin", type=_pin, action="append", metavar="UNIT=STAGE", help="pin a unit to a stage (ILP)")
    p.add_argument("--max-units-per-stage", type=_positive_int, default=None, help="cap units per stage (ILP)")
    p.add_argument("--time-limit", type=_positive_float, default=60.0, help="ILP time limit in seconds (default 60)")
    p.add_argument(
        "--record-timing",
        action="store_true",
        help="store the search time in the plan (otherwise null, so same inputs give the same bytes)",
    )
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser(
        "simulate",
        help="predict an iteration and draw its timeline",
        formatter_class=fmt,
        description=(
            "Simulate the schedule of a plan (or a what-if pipeline) action by action, print an ASCII timeline\n"
            "and optionally a Gantt chart PNG with the bubble visible.\n\n"
            "examples:\n  pipeplan simulate gpt2.plan.json --png timeline.png\n"
            "  pipeplan simulate --stages 4 --microbatches 8 --schedule gpipe --stage-times 1,1,2,1\n"
            "  pipeplan simulate --stages 4 --microbatches 8 --compare gpipe,1f1b,interleaved-1f1b"
        ),
    )
    p.add_argument("plan", nargs="?", metavar="PLAN.json")
    p.add_argument("--png", default=None, metavar="timeline.png", help="write a Gantt chart")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--compare", default=None, metavar="gpipe,1f1b,...", help="side-by-side picture of schedules")
    p.add_argument("--compare-png", default=None, metavar="schedules.png")
    p.add_argument("--stages", type=_positive_int, default=None, help="what-if: ranks")
    p.add_argument("--microbatches", type=_positive_int, default=None, help="what-if: micro-batches M")
    p.add_argument("--schedule", default=None, choices=("naive", "gpipe", "1f1b", "interleaved-1f1b"))
    p.add_argument("--virtual-stages", type=_positive_int, default=2, help="what-if: v for interleaved-1f1b")
    p.add_argument("--stage-times", type=_float_list, default=None, metavar="1,1,2,1", help="forward time per stage")
    p.add_argument("--backward-times", type=_float_list, default=None, help="backward time per stage")
    p.add_argument(
        "--backward-ratio",
        type=_positive_float,
        default=1.0,
        help="backward = ratio x forward when --backward-times is not given (default 1)",
    )
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser(
        "verify",
        help="run a plan with torch.distributed.pipelining and compare with the prediction",
        formatter_class=fmt,
        description=(
            "Launch the plan's ranks (gloo on CPU, NCCL on GPUs), run warm-up and timed steps, and print the\n"
            "predicted vs measured time per stage and per iteration. Exits 1 when the iteration error exceeds\n"
            "--tolerance. With fewer cores or GPUs than ranks, replay mode runs every stage in one process in\n"
            "the schedule's order and feeds the measured times through the simulator.\n\n"
            "example:\n  pipeplan verify gpt2.plan.json --model gpt2-small --steps 5 --out report.json"
        ),
    )
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--model", required=True, metavar="MODEL", help="the model the plan was made for")
    p.add_argument("--steps", type=_positive_int, default=5)
    p.add_argument("--warmup", type=_nonneg_int, default=2)
    p.add_argument("--tolerance", type=_positive_float, default=0.15, help="allowed iteration-time error (0.15 = 15%%)")
    p.add_argument("--mode", choices=("auto", "processes", "replay"), default="auto")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--check-numerics", action="store_true", help="compare loss and gradients with one process")
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds before every rank is stopped")
    p.add_argument("--out", default=None, metavar="report.json")
    p.set_defaults(func=_cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # torch 2.13's pipelining tracer warns about its own use of a deprecated pytree API; not the user's concern.
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*", category=FutureWarning)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except PipeplanError as exc:
        print(f"pipeplan {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"pipeplan {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
