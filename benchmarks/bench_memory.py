"""Memory (docs/BENCHMARKS.md, "Memory"): each stage's predicted peak against the peak measured in a real step.

    python benchmarks/bench_memory.py --out DIR                      # the whole matrix (35 min on 2 cores)
    python benchmarks/bench_memory.py --models mlp --schedules 1f1b --out DIR
    python benchmarks/bench_memory.py --cap --out DIR                # plans under a cap that binds
    python benchmarks/bench_memory.py --cluster --out DIR            # pp 2 x dp 2, DDP and FSDP
    python benchmarks/bench_memory.py --selective --out DIR          # whole-block vs selective recomputation
    python benchmarks/bench_memory.py --render --out DIR             # the tables of the reports in DIR again

For every model, schedule, recomputation (off, on) and verify mode (processes, replay): a plan for 2 ranks
(global batch 8; b = 2, M = 4; 4 stages for the schedules with two per rank), run for one warm-up and one
timed step by ``verify_plan``, which measures each stage's peak of live tensor bytes (planner/runtime/
stage_memory.py). Memory does not depend on the machine's speed, so no timing floors are used. Every run's
plan and report are kept in DIR (``<model>-<schedule>-<recompute>-<mode>.json``); the tables are printed.

``--cap``: for each model and schedule, the unconstrained plan's largest stage, then a plan under usable
memory 5 % below it (``--memory`` set so that the usable part, after the 10 % headroom, is that), verified:
every stage must be measured under its share of the cap.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402
from models import CNN13_SPEC  # noqa: E402

from planner.cost import HEADROOM_FRACTION  # noqa: E402
from planner.errors import PlanInfeasibleError  # noqa: E402
from planner.formatting import format_table, human_bytes  # noqa: E402
from planner.plan import Plan, save_plan  # noqa: E402
from planner.request import PlanOptions, plan_request  # noqa: E402
from planner.search import make_plan  # noqa: E402
from profiles.format import Profile, load_profile, save_profile  # noqa: E402

MODELS = ("mlp", "gpt2-tiny", "llama-small", "unet-small", CNN13_SPEC)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "dualpipev")
GLOBAL_BATCH = 8
MICRO_BATCH = 2


def short(spec: str) -> str:
    return "cnn13" if spec == CNN13_SPEC else spec


def get_profile(spec: str, out: Path) -> Profile:
    """The model's profile (b = 1, 2), made once and kept in ``out``: only its memory figures matter here."""
    from profiles.measure_settings import MeasureSettings
    from profiles.profiler import profile_model
    from profiles.workload import load_workload

    path = out / f"{short(spec)}.profile.json"
    if path.exists():
        return load_profile(path)
    profile = profile_model(
        load_workload(spec),
        MeasureSettings(micro_batch_sizes=(1, 2), repeats=1, warmup=1, min_time_s=0.0, progress=False),
    )
    save_profile(profile, path)
    return profile


def plan_for(profile: Profile, schedule: str, recompute: str, memory_bytes: int | None = None) -> Plan:
    options = PlanOptions(
        ranks=2,
        global_batch=GLOBAL_BATCH,
        schedule=schedule,
        micro_batch_size=MICRO_BATCH if memory_bytes is None else None,
        recompute=recompute,
        calibration="none",
        memory_bytes=memory_bytes,
    )
    request = plan_request(profile, options)
    return make_plan(profile, request, sha256="0" * 64)


@dataclass(frozen=True)
class Row:
    model: str
    schedule: str
    recompute: str
    mode: str
    stage: int
    rank: int
    predicted_bytes: int
    measured_bytes: int
    capacity_bytes: float | None

    @property
    def error_pct(self) -> float:
        return (self.measured_bytes - self.predicted_bytes) / self.predicted_bytes * 100.0


def run_one(spec: str, plan: Plan, mode: str, name: str, out: Path) -> list[Row]:
    from planner.runtime.run_options import VerifyOptions
    from planner.runtime.verify import verify_plan

    report = verify_plan(
        plan,
        spec,
        VerifyOptions(mode=mode, steps=1, warmup=1, min_warmup_s=0.0, min_time_s=0.0, timeout_s=900, tolerance=0.25),
    )
    save_plan(plan, out / f"{name}.plan.json")
    (out / f"{name}.json").write_text(json.dumps(report.to_dict(), indent=1, default=str))
    model, schedule, recompute, _ = name.split("~")
    return [
        Row(
            model,
            schedule,
            recompute,
            mode,
            s.index,
            s.rank,
            s.predicted_memory_bytes or 0,
            s.measured_memory_bytes or 0,
            s.capacity_bytes,
        )
        for s in report.stages
    ]


def summary(rows: list[Row]) -> str:
    """Median and worst error per model and schedule, over stages, recomputation and modes, as a markdown table
    (processes and replay apart)."""
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in rows:
        groups.setdefault((r.model, r.schedule), {}).setdefault(r.mode, []).append(r.error_pct)
    lines = [
        "| model | schedule | stages | processes: median abs | worst | replay: median abs | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    for (model, schedule), by_mode in groups.items():
        cells = []
        for mode in ("processes", "replay"):
            errors = by_mode.get(mode, [])
            median = f"{statistics.median(abs(x) for x in errors):.1f} %" if errors else "-"
            cells += [median, f"{max(errors, key=abs):+.1f} %" if errors else "-"]
        count = max(len(e) for e in by_mode.values())
        lines.append(f"| {model} | {schedule} | {count} | " + " | ".join(cells) + " |")
    everything = [abs(r.error_pct) for r in rows]
    lines.append(
        f"\n{len(rows)} stage measurements: median |error| {statistics.median(everything):.1f} %, "
        f"{sum(e <= 5 for e in everything)} within 5 %, {sum(e <= 10 for e in everything)} within 10 %, "
        f"worst {max(everything):.1f} %."
    )
    return "\n".join(lines)


def detail(rows: list[Row]) -> str:
    table = [
        [
            r.model,
            r.schedule,
            r.recompute,
            r.mode,
            r.stage,
            human_bytes(r.predicted_bytes),
            human_bytes(r.measured_bytes),
            f"{r.error_pct:+.1f}%",
        ]
        for r in rows
    ]
    headers = ["model", "schedule", "recompute", "mode", "stage", "predicted", "measured", "error"]
    return format_table(headers, table, align="<<<<>>>>")


def saved_rows(out: Path) -> list[Row]:
    """Every stage of every report kept in ``out`` (``--render``: the tables again, nothing run)."""
    rows = []
    for path in sorted(out.glob("*~*~*~*.json")):
        if path.name.endswith(".plan.json"):
            continue
        model, schedule, recompute, mode = path.name[: -len(".json")].split("~")
        for s in json.loads(path.read_text())["stages"]:
            rows.append(
                Row(
                    model,
                    schedule,
                    recompute,
                    mode,
                    s["index"],
                    s["rank"],
                    s["predicted_memory_bytes"],
                    s["measured_memory_bytes"],
                    s["capacity_bytes"],
                )
            )
    return rows


def matrix(args: argparse.Namespace, out: Path) -> list[Row]:
    rows: list[Row] = []
    for spec in args.models:
        profile = get_profile(spec, out)
        for schedule in args.schedules:
            for recompute in args.recompute:
                try:
                    plan = plan_for(profile, schedule, recompute)
                except PlanInfeasibleError as exc:
                    print(f"{short(spec)} {schedule} recompute {recompute}: no plan ({exc})", flush=True)
                    continue
                for mode in args.modes:
                    name = f"{short(spec)}~{schedule}~{recompute}~{mode}"
                    started = time.perf_counter()
                    got = run_one(spec, plan, mode, name, out)
                    rows.extend(got)
                    errors = ", ".join(f"{r.error_pct:+.1f}%" for r in got)
                    print(f"{name.replace('~', ' ')}: {errors} ({time.perf_counter() - started:.0f} s)", flush=True)
    return rows


def capped(args: argparse.Namespace, out: Path) -> list[Row]:
    """Per model and schedule: a plan under usable memory 5 % below the unconstrained plan's largest stage."""
    rows: list[Row] = []
    for spec in args.models:
        profile = get_profile(spec, out)
        for schedule in args.schedules:
            free = plan_for(profile, schedule, "off")
            largest = max(s.memory_bytes.peak * len(free.stages_of_rank(s.rank)) for s in free.stages)
            usable = 0.95 * largest
            memory = int(usable / (1 - HEADROOM_FRACTION)) + 1
            try:
                plan = plan_for(profile, schedule, "auto", memory_bytes=memory)
            except PlanInfeasibleError as exc:
                print(f"{short(spec)} {schedule} under {human_bytes(usable)} usable: {exc}", flush=True)
                continue
            name = f"{short(spec)}~{schedule}~cap~processes"
            got = run_one(spec, plan, "processes", name, out)
            rows.extend(got)
            how = f"b={plan.micro_batch_size}, recompute {[s.recompute for s in plan.stages]}"
            fits = all(r.measured_bytes <= (r.capacity_bytes or float("inf")) for r in got)
            print(
                f"{short(spec)} {schedule}: unconstrained largest rank {human_bytes(largest)}, usable "
                f"{human_bytes(usable)} -> {how}; measured "
                + ", ".join(f"{human_bytes(r.measured_bytes)} of {human_bytes(r.capacity_bytes or 0)}" for r in got)
                + (" (fits)" if fits else " (OVER)"),
                flush=True,
            )
    return rows


def cluster(args: argparse.Namespace, out: Path) -> list[Row]:
    """pp 2 x dp 2 on 4 processes, 1F1B: DDP (shard none) and FSDP (shard full); global batch 16 (8 a replica)."""
    from planner.cluster import MeshSearch, default_cluster, plan_cluster

    rows: list[Row] = []
    for spec in args.models:
        profile = get_profile(spec, out)
        for shard in ("none", "full"):
            options = PlanOptions(
                global_batch=2 * GLOBAL_BATCH,
                schedule="1f1b",
                micro_batch_size=MICRO_BATCH,
                recompute="off",
                calibration="none",
            )
            request = plan_request(profile, options, cluster=True)
            found = plan_cluster(
                profile, request, default_cluster("cpu", 4, shard=shard), MeshSearch(pipeline_degree=2), sha256="0" * 64
            )
            name = f"{short(spec)}~1f1b-dp2-{'ddp' if shard == 'none' else 'fsdp'}~off~processes"
            got = run_one(spec, found.plan, "processes", name, out)
            rows.extend(got)
            print(f"{name.replace('~', ' ')}: " + ", ".join(f"{r.error_pct:+.1f}%" for r in got), flush=True)
    return rows


def _held(run: Callable[[], Any], module: Any, inputs: list[Any]) -> int:
    """What one forward leaves alive until its backward: live tensor bytes, the inputs and the weights excluded
    (registered first: a view of a weight is no new storage)."""
    from profiles.memory import LiveBytes

    tracker = LiveBytes(default_owner=0)
    tracker.register([*module.parameters(), *module.buffers()], 0, "weights")
    tracker.register(inputs, 0, "buffers")
    with tracker:
        before = tracker.live(0).total_bytes
        out = run()
        held = tracker.live(0).total_bytes - before
    out.sum().backward()
    return held


def _interleaved_medians(runs: list[Callable[[], Any]], rounds: int = 9) -> list[float]:
    """Median forward + backward time of each run, timed in turn round after round: a shared machine's speed
    moves from one second to the next, and round-robin rounds see the same moments."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for k, run in enumerate(runs):
            started = time.perf_counter()
            run().sum().backward()
            times[k].append(time.perf_counter() - started)
    return [statistics.median(t) for t in times]


def selective(args: argparse.Namespace) -> None:
    """Whole-stage recomputation against selective recomputation of single operators, measured on one block.

    torch's ``SACEstimator`` (torch.distributed._tools.sac_estimator) estimates the trade-off per operator but
    times operators for a GPU (its benchmark and roofline modes); on this CPU it aborted the process. Here the
    trade-off is measured instead, with torch's own selective checkpointing
    (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of the matrix products are
    saved, every other operator (layer norm, softmax, GELU, additions) is recomputed. Per micro-batch: what the
    block holds from its forward to its backward, and the median forward + backward time of 9 rounds, the three
    timed in turn (one thread).
    """
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    from planner.runtime.stages import split_stages
    from profiles.workload import as_tuple, load_workload

    torch.set_num_threads(1)
    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def policy(ctx: object, op: object, *a: object, **k: object) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE

    rows = []
    # The block as the runtime runs it: the traced piece of a stage holding it (planner/runtime/apply.py).
    for spec, block, after in (
        ("gpt2-small", "transformer.h.1", "transformer.h.2"),
        ("llama-small", "model.layers.1", "model.layers.2"),
    ):
        workload = load_workload(spec)
        ids, _ = workload.make_batch(1)
        stages = split_stages(workload.model, as_tuple(ids), [block, after], [False, False, False])
        carried = as_tuple(stages[0](*as_tuple(ids)))
        stage = stages[1]
        args = [carried[i].detach().requires_grad_(carried[i].requires_grad) for i in stage.arg_sources]
        piece = stage.inner
        variants = {
            "none": partial(piece, *args),
            "whole block": partial(checkpoint, piece, *args, use_reentrant=False),
            "selective (matmuls saved)": partial(
                checkpoint,
                piece,
                *args,
                use_reentrant=False,
                context_fn=partial(create_selective_checkpoint_contexts, policy),
            ),
        }

        def first(out: Any) -> Any:
            return out[0] if isinstance(out, tuple) else out

        runs = [lambda run=run: first(run()) for run in variants.values()]
        held = [_held(run, piece, args) for run in runs]
        medians = _interleaved_medians(runs)
        for label, nbytes, median in zip(variants, held, medians, strict=True):
            extra_time = f"{(median / medians[0] - 1) * 100:+.0f}%"
            rows.append(
                [f"{spec} {block} (b=1, 128 tokens)", label, human_bytes(nbytes), f"{median * 1e3:.1f} ms", extra_time]
            )
    print(format_table(["block", "recomputation", "held per micro-batch", "fwd+bwd", "time"], rows, align="<<>>>"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--recompute", nargs="+", default=["off", "on"])
    parser.add_argument("--modes", nargs="+", default=["processes", "replay"])
    parser.add_argument("--cap", action="store_true", help="plans under a cap that binds, instead of the matrix")
    parser.add_argument("--cluster", action="store_true", help="pp x dp cluster plans, instead of the matrix")
    parser.add_argument("--selective", action="store_true", help="whole-block vs selective recomputation, one block")
    parser.add_argument("--render", action="store_true", help="the tables of the reports kept in --out; run nothing")
    parser.add_argument("--out", required=True, help="folder for profiles, plans and reports")
    args = parser.parse_args()
    started, printed = run_started(), tee_stdout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    import torch

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, python {platform.python_version()}",
        flush=True,
    )
    if args.selective:
        selective(args)
        write_record("memory_selective", {}, started=started, tables=tables_in(printed.getvalue(), ("selective",)))
        return
    if args.render:
        rows = saved_rows(out)
    else:
        rows = capped(args, out) if args.cap else cluster(args, out) if args.cluster else matrix(args, out)
    print()
    print(summary(rows))
    print()
    print(detail(rows))
    if not args.render:
        kind = "memory_cap" if args.cap else "memory_cluster" if args.cluster else "memory"
        write_record(kind, {}, started=started, tables=tables_in(printed.getvalue()))


if __name__ == "__main__":
    from planner.runtime.launch import signals_interrupt

    with signals_interrupt():  # a SIGTERM stops the ranks too, as it does the CLI's
        main()
