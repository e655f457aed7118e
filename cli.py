"""pipeplan's command line. It only wires: every command calls the documented Python API.

Errors a user can cause (``PipeplanError``) are caught once, here, and printed as one line
with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from planner.errors import MAX_MESSAGE_CHARS, PipeplanError, UsageError, shorten
from planner.limits import (
    MAX_DEVICES,
    MAX_GLOBAL_BATCH,
    MAX_JSON_INT,
    MAX_MICROBATCHES,
    MAX_PROFILED_SIZES,
    MAX_RANKS,
    MAX_REPEATS,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_UNITS,
)
from planner.schedule.orders import Schedule

if TYPE_CHECKING:
    from planner.calibration import Calibration
    from planner.cluster import Cluster
    from planner.runtime.model_cost import ModelRun
    from planner.search import PlanRequest
    from profiles.format import Profile

__all__ = ["main", "build_parser"]

EXIT_USAGE = 2
EXIT_INTERNAL = 1

_TOP = """\
pipeplan: profile a PyTorch model once, get an exact pipeline-parallel plan, apply it with
torch.distributed.pipelining.

  pipeplan calibrate --ranks 2 --out cpu.calibration.json  measure what the runtime adds (once per machine)
  pipeplan profile gpt2-small --out gpt2.profile.json      measure every unit on this device
  pipeplan calibrate --ranks 2 --model gpt2-small --profile gpt2.profile.json --out gpt2.calibration.json
                                                           learn what this model's actions pay in a pipeline
  pipeplan plan gpt2.profile.json --stages 4 --global-batch 16 --out gpt2.plan.json
  pipeplan simulate gpt2.plan.json --png timeline.png      see the bubble
  pipeplan verify gpt2.plan.json --model gpt2-small        run it, compare with the prediction
  pipeplan tune gpt2.profile.json --model gpt2-small --stages 2 --global-batch 8 --out gpt2.plan.json
                                                           run the best candidates, keep the fastest
  pipeplan show gpt2.plan.json                             reprint a profile or plan
  pipeplan export gpt2.plan.json --to megatron             the plan as torchtitan/Megatron/DeepSpeed/accelerate config

Run `pipeplan COMMAND --help` for each command's options.
"""


def _write_line(line: str) -> None:
    """One line on stderr that cannot fail: a lone surrogate in a name is escaped, not an UnicodeEncodeError."""
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    line = shorten(line, MAX_MESSAGE_CHARS)
    sys.stderr.write(line.encode(encoding, "backslashreplace").decode(encoding, "replace") + "\n")
    sys.stderr.flush()


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _write_line(f"pipeplan {self.prog.split()[-1]}: error: {shorten(message, 200)} (see --help)")
        self.exit(EXIT_USAGE)


def _bad(text: str, why: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{shorten(repr(text), 40)} {why}")


def _int_in(minimum: int, maximum: int, text: str) -> int:
    # Digits only (sign allowed): '4.0', '1e3', 'abc' and 400-digit numbers are refused before int().
    stripped = text.strip()
    if not stripped.lstrip("+-").isdigit() or len(stripped) > 19:
        raise _bad(text, f"is not an integer in {minimum}..{maximum:,}")
    value = int(stripped)
    if not minimum <= value <= maximum:
        raise _bad(text, f"must be an integer in {minimum}..{maximum:,}")
    return value


def _int_range(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return _int_in(minimum, maximum, text)

    return parse


def _number(text: str, low: float, high: float, *, low_open: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(text, "is not a number") from None
    if not math.isfinite(value) or not (value > low if low_open else value >= low) or value > high:
        if low == 0 and low_open:
            raise _bad(text, f"must be a positive finite number, at most {high:g}")
        raise _bad(text, f"must be a finite number {'>' if low_open else '>='} {low:g} and <= {high:g}")
    return value


def _positive_float(text: str) -> float:
    return _number(text, 0.0, MAX_SECONDS)


def _nonneg_float(text: str) -> float:
    return _number(text, 0.0, MAX_SECONDS, low_open=False)


def _speed(text: str) -> float:
    # Relative speeds outside [1e-3, 1e3] are not a device; they only push the solver's numbers out of range.
    return _number(text, 1e-3, 1e3, low_open=False)


def _items(text: str, limit: int) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise _bad(text, "is not a comma-separated list of values (empty item)")
    if len(items) > limit:
        raise _bad(text, f"has {len(items)} values, over pipeplan's limit of {limit}")
    return items


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(_int_in(1, MAX_GLOBAL_BATCH, t) for t in _items(text, MAX_PROFILED_SIZES))


def _float_list(text: str) -> tuple[float, ...]:
    return tuple(_positive_float(t) for t in _items(text, MAX_UNITS))


def _speed_list(text: str) -> tuple[float, ...]:
    return tuple(_speed(t) for t in _items(text, MAX_RANKS))


def _memory(text: str) -> int:
    from planner.cost import parse_bytes

    if len(text) > 40:
        raise _bad(text, "is not a memory size: write e.g. 80GiB, 16GB or 1073741824")
    try:
        value = parse_bytes(text)
    except (UsageError, OverflowError, ValueError) as exc:
        raise argparse.ArgumentTypeError(shorten(str(exc), 120)) from None
    if value > MAX_JSON_INT:
        raise _bad(text, "is over pipeplan's limit of 2**53 bytes (8 PiB)")
    return value


def _memory_list(text: str) -> tuple[int, ...]:
    return tuple(_memory(t) for t in _items(text, MAX_RANKS))


def _bandwidth(text: str) -> float:
    value = _memory(text.strip().removesuffix("/s"))
    return float(value)


def _auto_or_positive_int(text: str) -> int | None:
    return None if text.strip() == "auto" else _int_in(1, MAX_GLOBAL_BATCH, text)


def _pin(text: str) -> tuple[str, int]:
    name, sep, stage = text.rpartition("=")
    if not sep or not name:
        raise _bad(text, "is not UNIT=STAGE, e.g. lm_head=3")
    return name, _int_in(0, MAX_UNITS, stage)


def _model_file(spec: str) -> str | None:
    """The Python file a MODEL spec names (an input no output may replace), if any."""
    target = spec.rpartition(":")[0]
    return target if target.endswith(".py") else None


# --- commands ---------------------------------------------------------------------------------------------


def _rank_threads(ranks: int) -> int:
    """Threads each of ``ranks`` processes on this machine gets (planner/runtime/launch.py's rule)."""
    from planner.runtime.launch import rank_threads

    return rank_threads(ranks)


def _too_large_for_device(args: argparse.Namespace) -> bool:
    """An hf: config built on meta (no weights: seconds) is too large to profile whole: say so, and go meta."""
    from profiles.meta import too_large
    from profiles.workload import load_workload

    try:
        probe = load_workload(args.model, meta=True, seq_len=args.seq_len, task=args.task)
    except Exception:  # a best-effort look: the normal build reports what is wrong with the spec, in its words
        return False
    reason = too_large(probe.model, args.device, args.dtype)
    if reason:
        print(f"pipeplan: {reason}: profiling it on the meta device, one unit at a time (--meta)", file=sys.stderr)
    return bool(reason)


def _cmd_profile(args: argparse.Namespace) -> int:
    from planner.fileio import check_output_path
    from profiles.format import save_profile
    from profiles.profiler import profile_model
    from profiles.report import format_profile_table
    from profiles.workload import load_workload

    check_output_path(args.out, inputs=[_model_file(args.model)])
    threads = args.threads or (_rank_threads(args.ranks) if args.ranks else None)
    if threads:
        import torch

        torch.set_num_threads(threads)
    meta = args.meta or args.sample_blocks  # --sample-blocks implies --meta (its help says so)
    if not meta and args.model.startswith("hf:"):
        meta = _too_large_for_device(args)
    workload = load_workload(args.model, meta=meta, seq_len=args.seq_len, task=args.task)
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
        **({} if args.min_time is None else {"min_time_s": args.min_time}),
        warmup=args.warmup,
        units=units,
        progress=not args.no_progress,
        sample_blocks=args.sample_blocks,
    )
    save_profile(profile, args.out)
    print(format_profile_table(profile))
    print(f"\nwrote {args.out}")
    ranks = args.ranks or 2
    print(f"next: pipeplan plan {args.out} --stages {ranks} --global-batch B --out PLAN.json")
    if not meta:
        print(
            f"      (first, to predict this model's runs closely: pipeplan calibrate --ranks {ranks} --model "
            f"{args.model} --profile {args.out} --out CALIBRATION.json, then plan with --calibration CALIBRATION.json)"
        )
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


def _check_pins(profile: object, pins: Sequence[tuple[str, int]], num_ranks: int, schedule: Schedule | None) -> None:
    """Each pin names a unit, once, at a stage that leaves every other stage a unit, in model order.

    Said here, in terms of the pins, rather than as the solver's "no plan fits" (which reads as memory).
    """
    names = [u.name for u in profile.units]  # type: ignore[attr-defined]
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
        k, stages = index[name], counts[0]
        if any(stage < s and stage <= k and s - 1 - stage <= n - 1 - k for s in counts):
            continue
        if stage >= max(counts):
            why = f"stages are 0..{max(counts) - 1} for {num_ranks} ranks"
        elif stage > k:
            why = f"stages 0..{stage - 1} before it need a unit each, and only {k} units come before it"
        else:
            why = (
                f"stages {stage + 1}..{stages - 1} after it need a unit each, and only {n - 1 - k} units come after it"
            )
        raise UsageError(f"--pin {shorten(name, 60)}={stage}: unit {k} of 0..{n - 1} cannot be on stage {stage}: {why}")
    by_unit = sorted((index[name], stage, name) for name, stage in chosen.items())
    for (_, s1, n1), (_, s2, n2) in zip(by_unit, by_unit[1:], strict=False):
        if s2 < s1:
            raise UsageError(
                f"--pin {shorten(n1, 40)}={s1} and --pin {shorten(n2, 40)}={s2} conflict: {shorten(n2, 40)} comes "
                "later in the model, so its stage cannot be earlier"
            )


def _calibration_settings(args: argparse.Namespace, device_kind: str) -> dict[str, object]:
    """``--calibration auto|none|FILE`` as CostSettings fields (``auto``: the calibration shipped for the device)."""
    from planner.calibration import load_calibration, shipped_calibration

    if args.calibration == "none":
        return {}
    if args.calibration == "auto":
        return {"calibration": shipped_calibration(device_kind), "calibration_label": "shipped"}
    return {"calibration": load_calibration(args.calibration), "calibration_label": str(args.calibration)}


def _warn_other_model(calibration: object, profile: Profile) -> None:
    """A calibration refit on one model (``calibrate --model``, ``tune``) carries that model's per-action
    cost: say so when another model is planned with it."""
    from planner.calibration import Calibration

    note = calibration.learned_model if isinstance(calibration, Calibration) else None
    if note is not None and note.get("fingerprint") != profile.model.fingerprint:
        print(
            f"pipeplan: warning: the calibration learned {note.get('name')}'s per-action cost, not "
            f"{profile.model.name}'s: its predictions for this model may be off by that difference",
            file=sys.stderr,
        )


def _calibration_inputs(args: argparse.Namespace) -> list[str]:
    """The calibration file a command reads, if any: an input that no output may replace."""
    return [] if args.calibration in ("auto", "none") else [args.calibration]


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from planner.calibration import load_calibration, save_calibration, shipped_calibration
    from planner.fileio import check_output_path
    from planner.runtime.calibrate import calibrate

    if (args.model is None) != (args.profile is None):
        raise UsageError("--model and --profile go together: the model to run and its profile (pipeplan profile)")
    if args.start is not None and args.model is None:
        raise UsageError("--start only makes sense with --model: it is the calibration the model's run refits")
    inputs = [args.profile, None if args.start == "auto" else args.start, args.model and _model_file(args.model)]
    check_output_path(args.out, inputs=[p for p in inputs if p])
    profile = None
    if args.profile is not None:
        from profiles.format import load_profile

        profile = load_profile(args.profile)
    with _signals_interrupt(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", module=r"torch(\..*)?$")
        if args.start is None:
            calibration = calibrate(args.ranks, device=args.device, repeats=args.repeats, timeout_s=args.timeout)
        elif args.start == "auto":
            calibration = shipped_calibration(args.device)
        else:
            calibration = load_calibration(args.start)
        if profile is not None:
            run = _learn_model_cost(args, profile, calibration)
            before, after = calibration, run.calibration
            calibration = after
    save_calibration(calibration, args.out)
    c = calibration
    print(f"calibration on {c.device_kind}/{c.backend}, {c.num_ranks} ranks x {c.threads_per_rank} threads")
    print(f"  point-to-point: {c.p2p_latency_s * 1e6:.0f} us + bytes / {c.p2p_bytes_per_s / 1e9:.2f} GB/s")
    for name, seconds in sorted(c.action_overhead_s.items()):
        print(f"  overhead per action, {name:<17} {seconds * 1e3:.3f} ms")
    for name, cost in sorted(c.optimizer.items()):
        print(f"  {name} step: {cost.per_step_s * 1e3:.3f} ms + {cost.per_param_s * 1e9:.2f} ns per parameter")
    print(f"  co-location factor: {c.colocation_factor:.3f} (compute inside the pipeline / profiled alone)")
    if profile is not None:
        plan, report = run.plan, run.report
        learned = after.overhead_for(plan.schedule) - before.overhead_for(plan.schedule)
        print(
            f"  learned from {args.model} ({plan.schedule.value}, b={plan.micro_batch_size} x "
            f"{plan.num_microbatches}): predicted {plan.predicted.iteration_s * 1e3:.2f} ms, measured "
            f"{report.measured_iteration_s * 1e3:.2f} ms; its actions cost {learned * 1e3:+.3f} ms each beyond the "
            f"machine's, co-location {before.colocation_factor:.3f} -> {after.colocation_factor:.3f}"
        )
    print(f"\nwrote {args.out}")
    return 0


def _learn_model_cost(args: argparse.Namespace, profile: Profile, calibration: Calibration) -> ModelRun:
    """``calibrate --model``: the model's 1F1B run on the calibration's ranks, and the calibration refit from it."""
    from planner.runtime.model_cost import default_global_batch, learn_model_cost, learning_plan
    from planner.runtime.verify import threads_warning
    from planner.search import profile_sha256

    calibration.check_device(profile.device.kind)
    if calibration.num_ranks != args.ranks:
        raise UsageError(f"--start was measured on {calibration.num_ranks} ranks, not --ranks {args.ranks}")
    batch = args.global_batch or default_global_batch(profile, args.ranks)
    plan = learning_plan(profile, calibration, batch, sha256=profile_sha256(args.profile))
    warning = threads_warning(plan, "processes", args.device)
    if warning:
        print(f"pipeplan: warning: {warning}", file=sys.stderr)
    print(
        f"running {args.model} under 1f1b on {args.ranks} ranks (b={plan.micro_batch_size} x "
        f"{plan.num_microbatches}) to learn its own per-action cost ...",
        file=sys.stderr,
    )
    return learn_model_cost(
        calibration, profile, args.model, plan, steps=args.steps, device=args.device, timeout_s=args.timeout
    )


def _plan_request(args: argparse.Namespace, profile: Profile) -> PlanRequest:
    """The search request that ``plan`` and ``tune`` build from the same options (checked here, once)."""
    from planner.cost import default_settings
    from planner.limits import check_plan_work
    from planner.search import PlanRequest

    if args.memory is not None and args.device_memory is not None:
        raise UsageError("--memory and --device-memory conflict: give one (--memory is every device's memory)")
    schedule = None if args.schedule == "auto" else Schedule.parse(args.schedule)
    sizes = [args.micro_batch_size] if args.micro_batch_size is not None else profile.micro_batch_sizes
    cluster = getattr(args, "devices", None) is not None
    if args.stages is None and not cluster:
        raise UsageError("give --stages P (one pipeline of P ranks), or --devices N for a cluster plan")
    if cluster and (args.pin or args.device_memory or args.device_speeds):
        raise UsageError("--pin, --device-memory and --device-speeds are per pipeline rank: use them without --devices")
    if not cluster:
        check_plan_work(args.stages, args.global_batch, sizes)
    if args.pin:
        _check_pins(profile, args.pin, args.stages, schedule)
    memory = (args.memory,) if args.memory is not None else args.device_memory
    settings = default_settings(
        profile,
        optimizer=args.optimizer,
        link_bytes_per_s=args.bandwidth,
        link_latency_s=args.latency,
        device_memory_bytes=memory or (),
        device_speeds=args.device_speeds or (),
        **_calibration_settings(args, profile.device.kind),
    )
    _warn_other_model(settings.calibration, profile)
    return PlanRequest(
        num_ranks=args.stages or 1,  # a cluster plan sets the pipeline degree per layout
        global_batch_size=args.global_batch,
        schedule=schedule,
        micro_batch_size=args.micro_batch_size,
        recompute=args.recompute,
        solver=args.solver,
        settings=settings,
        pinned=tuple(args.pin or ()),
        max_units_per_stage=args.max_units_per_stage,
        ilp_time_limit_s=args.time_limit,
    )


def _cmd_plan(args: argparse.Namespace) -> int:
    from planner.fileio import check_output_path
    from planner.plan import save_plan
    from planner.report import format_plan
    from planner.search import make_plan, profile_sha256
    from profiles.format import load_profile

    check_output_path(args.out, inputs=[args.profile, *_calibration_inputs(args)])
    profile = load_profile(args.profile)
    request = _plan_request(args, profile)
    sha256 = profile_sha256(args.profile)
    if args.devices is None:
        plan = make_plan(profile, request, sha256=sha256, record_timing=args.record_timing)
        save_plan(plan, args.out)
        print(format_plan(plan))
    else:
        from planner.cluster import plan_cluster
        from planner.report import format_cluster

        cluster = _cluster(args, profile.device.kind)
        result = plan_cluster(
            profile,
            request,
            cluster,
            sha256=sha256,
            pipeline_degree=args.stages,
            record_timing=args.record_timing,
            jobs=args.jobs or os.cpu_count() or 1,
        )
        save_plan(result.plan, args.out)
        print(format_cluster(result))
        print()
        print(format_plan(result.plan))
    print(f"\nwrote {args.out}")
    return 0


def _cluster(args: argparse.Namespace, device_kind: str) -> Cluster:
    from planner.cluster import DEFAULT_CLUSTER_LINKS, Cluster

    intra, inter, latency = DEFAULT_CLUSTER_LINKS.get(device_kind, DEFAULT_CLUSTER_LINKS["cpu"])
    return Cluster(
        num_devices=args.devices,
        devices_per_node=args.devices_per_node or args.devices,
        intra_node_bytes_per_s=args.intra_node_bandwidth or intra,
        inter_node_bytes_per_s=args.inter_node_bandwidth or inter,
        latency_s=args.latency if args.latency is not None else latency,
        shard=args.shard,
    )


def _rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    old, new = old.strip(), new.strip()
    if not sep or not old:
        raise _bad(text, "is not OLD=NEW, e.g. model.layers=layers (NEW may be empty: strip the prefix)")
    return old, new


def _cmd_export(args: argparse.Namespace) -> int:
    from planner.export import export_plan
    from planner.fileio import check_output_path, write_atomic
    from planner.plan import load_plan

    if args.out:
        check_output_path(args.out, inputs=[args.plan])
    config = export_plan(load_plan(args.plan), args.to, renames=args.rename or ())
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
    from planner.runtime.tune import format_tune_table, tune
    from planner.search import profile_sha256
    from profiles.format import load_profile

    check_output_path(args.out, inputs=[args.profile, *_calibration_inputs(args)])
    calibration_out = args.calibration_out or _beside(args.out, ".calibration.json")
    check_output_path(calibration_out, inputs=[args.profile, args.out, *_calibration_inputs(args)])
    if args.calibration == "none":
        raise UsageError("tune refits a calibration: give --calibration auto (the shipped one) or a file")
    profile = load_profile(args.profile)
    request = _plan_request(args, profile)
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


def _beside(path: str, suffix: str) -> str:
    """``gpt2.plan.json`` -> ``gpt2.plan.calibration.json``."""
    return str(path).removesuffix(".json") + suffix


def _cmd_simulate(args: argparse.Namespace) -> int:
    from planner.fileio import check_output_path
    from planner.limits import check_simulation
    from planner.schedule.timeline import ascii_timeline, render_comparison_png, render_png, time_breakdown
    from planner.schedule.what_if import compare_schedules, what_if_pipeline

    compare_png = (args.compare_png or "schedules.png") if args.compare else None
    outputs = [out for out in (args.png, compare_png) if out is not None]
    for out in outputs:
        check_output_path(out, inputs=[args.plan])
    if len(outputs) == 2 and os.path.realpath(outputs[0]) == os.path.realpath(outputs[1]):
        raise UsageError(f"--png and --compare-png both name {shorten(outputs[0])}: give two files")
    compare = [Schedule.parse(name) for name in _items(args.compare, 8)] if args.compare else []
    if args.plan:
        from planner.plan import load_plan

        pipeline = load_plan(args.plan).pipeline()
    else:
        if not args.stages or not args.microbatches:
            raise UsageError("give a PLAN.json, or --stages and --microbatches for a what-if simulation")
        pipeline = what_if_pipeline(
            args.stages,
            args.microbatches,
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
    if args.png:
        render_png(result, args.png)
        if not args.json:
            print(f"wrote {args.png}")
    if compare_png is not None:
        out = compare_png
        render_comparison_png(results, out)
        if not args.json:
            for r in results:
                print(
                    f"{r.schedule:>18}: iteration {r.iteration_s:.4g} s, bubble {r.bubble_fraction:.1%}, "
                    f"peak in-flight {max(r.peak_in_flight)}"
                )
            print(f"wrote {out}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from planner.fileio import write_json_atomic
    from planner.plan import load_plan
    from planner.runtime.verify import format_report, threads_warning, verify_plan

    if args.out:
        from planner.fileio import check_output_path

        check_output_path(args.out, inputs=[args.plan, _model_file(args.model)])
    plan = load_plan(args.plan)
    warning = threads_warning(plan, args.mode, args.device)
    if warning:
        print(f"pipeplan: warning: {warning}", file=sys.stderr)
    with _signals_interrupt(), warnings.catch_warnings():
        # torch's deprecation and resource warnings are not the user's concern, and would follow the error line.
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", module=r"torch(\..*)?$")
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


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread is so that every ``finally`` (stopping ranks) runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop verify like Ctrl-C: the ranks and their process groups are stopped first."""

    def handler(signum: int, _frame: object) -> None:
        raise _Signalled(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# --- parser -----------------------------------------------------------------------------------------------


def _add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "cluster plans",
        "With --devices N the plan is a pp x dp mesh: pp pipeline ranks (--stages fixes it) times dp replicas of\n"
        "the pipeline, each stage's gradients reduced over its replicas; --global-batch is the whole step's.",
    )
    g.add_argument("--devices", type=_int_range(1, MAX_DEVICES), default=None, metavar="N", help="devices to plan for")
    g.add_argument(
        "--devices-per-node", type=_int_range(1, MAX_DEVICES), default=None, metavar="G", help="default: all on one"
    )
    g.add_argument(
        "--intra-node-bandwidth",
        type=_bandwidth,
        default=None,
        metavar="450GB/s",
        help="per device, each way, inside a node (default: cuda 450GB/s, cpu 1.1GB/s)",
    )
    g.add_argument(
        "--inter-node-bandwidth",
        type=_bandwidth,
        default=None,
        metavar="50GB/s",
        help="per device, each way, between nodes (default: cuda 50GB/s, cpu 1.1GB/s)",
    )
    g.add_argument(
        "--shard",
        choices=("none", "optimizer", "full"),
        default="none",
        help="what the replicas split: nothing (DDP), optimizer state (ZeRO-1), everything (FSDP)",
    )
    g.add_argument(
        "--jobs",
        type=_int_range(1, 256),
        default=None,
        metavar="J",
        help="layouts searched at once, in worker processes (default: the CPUs; the plan is the same)",
    )


def _add_search_arguments(p: argparse.ArgumentParser) -> None:
    """The plan search's options, shared by ``plan`` and ``tune``."""
    p.add_argument(
        "--stages",
        type=_int_range(1, MAX_RANKS),
        default=None,
        help="pipeline ranks (devices), P; with --devices: the pipeline degree pp, fixed",
    )
    p.add_argument(
        "--global-batch", type=_int_range(1, MAX_GLOBAL_BATCH), required=True, help="samples per iteration, B = b x M"
    )
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
        type=_speed_list,
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
        type=_nonneg_float,
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
    p.add_argument(
        "--schedule",
        choices=("auto", *(x.value for x in Schedule if x is not Schedule.NAIVE)),
        default="auto",
        help="auto: search every schedule torch ships (the split-backward ones when the profile measured the split)",
    )
    p.add_argument("--micro-batch-size", type=_auto_or_positive_int, default=None, metavar="auto|N")
    p.add_argument(
        "--recompute",
        choices=("auto", "on", "off"),
        default="auto",
        help="activation recomputation: chosen per stage (auto), on or off",
    )
    p.add_argument("--solver", choices=("auto", "dp", "ilp"), default="auto")
    p.add_argument(
        "--calibration",
        default="auto",
        metavar="auto|none|CALIBRATION.json",
        help="runtime terms (overhead per action, optimizer, tied-gradient sum, co-location): auto = the calibration "
        "shipped for the profile's device (cpu: measured on gloo; cuda: estimated), none = compute and links only, "
        "or a file from `pipeplan calibrate` / `pipeplan tune` (default auto)",
    )
    p.add_argument("--pin", type=_pin, action="append", metavar="UNIT=STAGE", help="pin a unit to a stage (ILP)")
    p.add_argument(
        "--max-units-per-stage", type=_int_range(1, MAX_UNITS), default=None, help="cap units per stage (ILP)"
    )
    p.add_argument("--time-limit", type=_positive_float, default=60.0, help="ILP time limit in seconds (default 60)")


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
            "package.module:NAME, NAME being a zero-argument function returning a profiles.workload.Workload,\n"
            "or hf:path/to/config.json (a transformers model built from a local config, random weights;\n"
            "--task, --seq-len; the profile's model name is the full spec verify takes).\n\n"
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
    p.add_argument(
        "--seq-len",
        type=_int_range(1, 1 << 20),
        default=None,
        help="sequence length of built-in language models and hf: configs",
    )
    p.add_argument(
        "--task",
        choices=("causal-lm", "masked-lm", "seq2seq", "image-classification"),
        default=None,
        help="what an hf:CONFIG.json model is built for (default: from the config's architectures)",
    )
    p.add_argument(
        "--repeats",
        type=_int_range(1, MAX_REPEATS),
        default=3,
        help="timed rounds at least (each times every unit once); the median is kept (default 3)",
    )
    p.add_argument(
        "--max-repeats",
        type=_int_range(1, MAX_REPEATS),
        default=15,
        help="timed rounds at most: rounds go on until the medians of the unit sum and of the whole model "
        "move by 1%% or less (default 15)",
    )
    p.add_argument("--warmup", type=_int_range(0, MAX_REPEATS), default=1, help="untimed warm-up runs (default 1)")
    p.add_argument(
        "--min-time",
        type=_nonneg_float,
        default=None,
        metavar="SECONDS",
        help="at each micro-batch size, rounds also go on until they span this long (default 2): a shared "
        "machine changes speed from one second to the next, and a median over a moment sees one speed",
    )
    p.add_argument(
        "--units",
        default=None,
        metavar="FQN,FQN|DEPTH",
        help="unit FQNs in execution order, or a module depth (default: the largest repeated block list)",
    )
    threads = p.add_mutually_exclusive_group()
    threads.add_argument(
        "--threads",
        type=_int_range(1, 4096),
        default=None,
        help="CPU intra-op threads while measuring; match what each rank will get (cores / ranks per machine)",
    )
    threads.add_argument(
        "--ranks",
        type=_int_range(1, MAX_RANKS),
        default=None,
        metavar="P",
        help="profile with the threads each of P ranks on this machine will get: cores // P, as the runtime sets",
    )
    p.add_argument(
        "--meta",
        action="store_true",
        help="build the model on the meta device (no weights held) and materialise one unit at a time to measure "
        "it, for a model larger than the device; the whole model is not measured (automatic for an hf: config "
        "whose weights and gradients exceed the device's memory)",
    )
    p.add_argument(
        "--sample-blocks",
        action="store_true",
        help="with --meta (implied): measure one unit of each run of identical consecutive units (decoder layers) "
        "and copy its numbers to the others; the profile lists the copies in settings.sampled_from",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser(
        "calibrate",
        help="measure the runtime's costs (P2P, per-action overhead, optimizer, co-location) on real ranks",
        formatter_class=fmt,
        description=(
            "Run a short job on RANKS local processes (gloo on CPU, NCCL on GPUs) and measure what a real\n"
            "iteration adds to the profiled compute: point-to-point latency and bandwidth, the overhead of\n"
            "each action of each torch schedule, optimizer step time per parameter (Adam, SGD), and how\n"
            "much slower compute runs when every rank is busy (co-location). Takes under a minute on CPU.\n"
            "Give the file to `pipeplan plan --calibration`. Measure on a quiet machine.\n\n"
            "With --model and --profile it then runs that model once under 1F1B on the same ranks and\n"
            "refits the calibration from it: real stages pay more per action in a pipeline than the\n"
            "trivial ones measured first (0.15 ms for a small MLP, 0.45 ms for gpt2-tiny on a 2-core CPU),\n"
            "and only a run of the model shows how much. Plans of that model predicted with the result\n"
            "came within 4-8 % (median) where the machine's constants alone were 10-53 % off.\n\n"
            "examples:\n  pipeplan calibrate --ranks 2 --out cpu.calibration.json\n"
            "  pipeplan calibrate --ranks 2 --model gpt2-tiny --profile gpt2-tiny.profile.json \\\n"
            "      --out gpt2-tiny.calibration.json\n"
            "  pipeplan calibrate --ranks 2 --start cpu.calibration.json --model gpt2-tiny \\\n"
            "      --profile gpt2-tiny.profile.json --out gpt2-tiny.calibration.json   (skip re-measuring)"
        ),
    )
    p.add_argument(
        "--ranks", type=_int_range(1, MAX_RANKS), default=2, help="ranks to run, as in your pipeline (default 2)"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--repeats", type=_int_range(1, MAX_REPEATS), default=15, help="timed repeats of each measurement (median)"
    )
    p.add_argument("--timeout", type=_positive_float, default=300.0, help="seconds before every rank is stopped")
    p.add_argument("--model", metavar="MODEL", help="also run this model once under 1F1B and learn its per-action cost")
    p.add_argument("--profile", metavar="PROFILE.json", help="with --model: the model's profile (plans its run)")
    p.add_argument(
        "--global-batch",
        type=_int_range(1, MAX_GLOBAL_BATCH),
        help="with --model: the batch of its run (default: 2 micro-batches per rank of the largest profiled size)",
    )
    p.add_argument(
        "--steps", type=_int_range(1, MAX_STEPS), default=5, help="with --model: timed steps of its run (default 5)"
    )
    p.add_argument(
        "--start",
        metavar="CALIBRATION.json",
        help="with --model: refit this calibration ('auto': the shipped one) instead of measuring the machine first",
    )
    p.add_argument("--out", required=True, metavar="CALIBRATION.json")
    p.set_defaults(func=_cmd_calibrate)

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
    _add_search_arguments(p)
    _add_cluster_arguments(p)
    p.add_argument(
        "--record-timing",
        action="store_true",
        help="store the search time in the plan (otherwise null, so same inputs give the same bytes)",
    )
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser(
        "tune",
        help="run the planner's best candidates for real, refit the calibration, keep the fastest",
        formatter_class=fmt,
        description=(
            "Close the loop: take the planner's K best distinct plans (schedules, micro-batch sizes,\n"
            "boundaries, recomputation), run each on real ranks (processes when there are cores or GPUs for\n"
            "every rank, else a one-process replay), refit the calibration from what was measured, plan again\n"
            "with it, and write the plan that measured fastest, with its measured numbers. The refit\n"
            "calibration is written beside it; give it to `pipeplan plan --calibration` next time.\n\n"
            "example:\n"
            "  pipeplan tune gpt2.profile.json --model gpt2-small --stages 2 --global-batch 8 --out gpt2.plan.json"
        ),
    )
    p.add_argument("profile", metavar="PROFILE.json")
    p.add_argument("--model", required=True, metavar="MODEL", help="the model the profile was made for")
    p.add_argument("--out", required=True, metavar="PLAN.json")
    p.add_argument(
        "--calibration-out",
        default=None,
        metavar="CALIBRATION.json",
        help="where the refit calibration goes (default: beside the plan, PLAN.calibration.json)",
    )
    p.add_argument("--candidates", type=_int_range(1, 32), default=4, help="distinct plans to run (default 4)")
    p.add_argument("--steps", type=_int_range(1, MAX_STEPS), default=3, help="timed steps per candidate (default 3)")
    p.add_argument(
        "--warmup",
        type=_int_range(0, MAX_STEPS),
        default=1,
        help="untimed steps per candidate (default 1; processes mode also warms up for at least 1 s)",
    )
    p.add_argument("--mode", choices=("auto", "processes", "replay"), default="auto")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds per candidate before it is stopped")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_search_arguments(p)
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser(
        "export",
        help="print the plan's layout as torchtitan, Megatron-Core, DeepSpeed or accelerate configuration",
        formatter_class=fmt,
        description=(
            "Write what each trainer takes for the plan's stages (docs/export.md):\n"
            "  torchtitan  [parallelism] module_fqns_per_model_part, pipeline_parallel_degree, schedule and\n"
            "              micro-batch size (TOML)\n"
            "  megatron    --pipeline-model-parallel-layout 'Et*2|t*2L' with --pipeline-model-parallel-size,\n"
            "              --num-layers and batch sizes (flags); E = units before the first decoder layer,\n"
            "              t = each decoder layer (units PREFIX.N), L = units after the last one (norm, head)\n"
            "  deepspeed   a PipelineModule subclass whose _partition_layers sets self.parts to the plan's\n"
            "              boundaries, and the layer count (Python)\n"
            "  accelerate  prepare_pippy(model, split_points=[...], num_chunks=M) (Python; inference only)\n"
            "What a trainer cannot express is refused with the reason (a cut inside Megatron's embedding or\n"
            "inside a decoder layer, a non-transformer model for Megatron, interleaved stages for DeepSpeed and\n"
            "accelerate, names nested deeper than torchtitan splits).\n\n"
            "examples:\n"
            "  pipeplan export gpt2.plan.json --to megatron\n"
            "  pipeplan export llama.plan.json --to torchtitan --rename model.embed_tokens=tok_embeddings \\\n"
            "      --rename model.layers=layers --rename model.norm=norm --rename lm_head=output --out pp.toml"
        ),
    )
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument(
        "--to", required=True, choices=("torchtitan", "megatron", "deepspeed", "accelerate"), help="the trainer"
    )
    p.add_argument(
        "--rename",
        type=_rename,
        action="append",
        metavar="OLD=NEW",
        help="map a module-name prefix of the profiled model onto the trainer's model (repeatable; the longest "
        "matching prefix wins; NEW may be empty to strip the prefix)",
    )
    p.add_argument("--out", default=None, metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "simulate",
        help="predict an iteration and draw its timeline",
        formatter_class=fmt,
        description=(
            "Simulate the schedule of a plan (or a what-if pipeline) action by action, print an ASCII timeline\n"
            "and optionally a Gantt chart PNG with the bubble visible.\n\n"
            "examples:\n  pipeplan simulate gpt2.plan.json --png timeline.png\n"
            "  pipeplan simulate --stages 4 --microbatches 8 --schedule gpipe --stage-times 1,1,2,1\n"
            "  pipeplan simulate --stages 4 --microbatches 8 --compare gpipe,1f1b,interleaved-1f1b\n"
            "  pipeplan simulate --stages 4 --microbatches 8 --schedule zero-bubble --stage-times 1 \\\n"
            "      --backward-times 1 --weight-times 1"
        ),
    )
    p.add_argument("plan", nargs="?", metavar="PLAN.json")
    p.add_argument("--png", default=None, metavar="timeline.png", help="write a Gantt chart")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--compare", default=None, metavar="gpipe,1f1b,...", help="side-by-side picture of schedules")
    p.add_argument("--compare-png", default=None, metavar="schedules.png")
    p.add_argument("--stages", type=_int_range(1, MAX_RANKS), default=None, help="what-if: ranks")
    p.add_argument(
        "--microbatches", type=_int_range(1, MAX_MICROBATCHES), default=None, help="what-if: micro-batches M"
    )
    p.add_argument("--schedule", default=None, choices=[x.value for x in Schedule], help="what-if: the schedule")
    p.add_argument(
        "--virtual-stages",
        type=_int_range(1, 16),
        default=None,
        help="what-if: stages per rank of interleaved-1f1b, looped-bfs (default 2) and zero-bubble (default 1); "
        "zbv and dualpipev always run 2",
    )
    p.add_argument(
        "--stage-times", type=_float_list, default=None, metavar="1,1,2,1", help="forward time per stage (or one)"
    )
    p.add_argument(
        "--backward-times",
        type=_float_list,
        default=None,
        help="backward time per stage; with --weight-times, its input-gradient part B (the full backward is B + W)",
    )
    p.add_argument(
        "--weight-times",
        type=_float_list,
        default=None,
        help="weight-gradient time W per stage: split-backward schedules (zero-bubble, zbv, dualpipev) run it apart; "
        "absent, the backward stays unsplit",
    )
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
    p.add_argument(
        "--steps",
        type=_int_range(1, MAX_STEPS),
        default=5,
        help="timed steps at least (default 5); processes mode also times for at least 2 s, as a shared machine's "
        "speed changes from one second to the next; the median step is measured",
    )
    p.add_argument(
        "--warmup",
        type=_int_range(0, MAX_STEPS),
        default=2,
        help="untimed steps first (default 2); processes mode also warms up for at least 1 s, as a fresh rank's "
        "first steps run slow",
    )
    p.add_argument("--tolerance", type=_positive_float, default=0.15, help="allowed iteration-time error (0.15 = 15%%)")
    p.add_argument("--mode", choices=("auto", "processes", "replay"), default="auto")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--check-numerics", action="store_true", help="compare loss and gradients with one process")
    p.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds before every rank is stopped")
    p.add_argument("--out", default=None, metavar="report.json")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="when a rank fails, print its full traceback (from the rank's process) before the one-line error",
    )
    p.set_defaults(func=_cmd_verify)
    return parser


# Errors that are not pipeplan's own but that user input can still reach (a full disk, a name the file
# system refuses, a number or a structure too large for Python): reported as one line like a PipeplanError.
_ENVIRONMENT_ERRORS = (OSError, OverflowError, RecursionError, MemoryError, UnicodeError)


def main(argv: Sequence[str] | None = None) -> int:
    # torch 2.13's pipelining tracer warns about its own use of a deprecated pytree API; not the user's concern.
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec.*", category=FutureWarning)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    prefix = f"pipeplan {args.command}"
    try:
        return args.func(args)
    except PipeplanError as exc:
        remote = getattr(exc, "remote_traceback", "")
        if remote and getattr(args, "verbose", False):
            sys.stderr.write(remote.rstrip("\n") + "\n")
        _write_line(f"{prefix}: error: {exc}")
        return EXIT_USAGE
    except _Signalled as exc:
        _write_line(f"{prefix}: stopped by {exc}")
        return 128 + exc.signum
    except KeyboardInterrupt:
        _write_line(f"{prefix}: interrupted")
        return 130
    except _ENVIRONMENT_ERRORS as exc:
        _write_line(f"{prefix}: error: {type(exc).__name__}: {exc}")
        return EXIT_USAGE
    except Exception as exc:  # a bug in pipeplan: still one line, and the way to see the traceback
        if os.environ.get("PIPEPLAN_DEBUG"):
            raise
        _write_line(
            f"{prefix}: internal error (a bug in pipeplan; PIPEPLAN_DEBUG=1 shows the traceback): "
            f"{type(exc).__name__}: {exc}"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
