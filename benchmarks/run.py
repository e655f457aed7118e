"""Run the simulated benchmarks, write their record and re-render docs/BENCHMARKS.md (and docs/bench_*.png).

Usage, from the repository root::

    python benchmarks/run.py            # the full run: ~8 min with cached profiles, ~30-40 min from scratch
    python benchmarks/run.py --quick    # fewer models, rounds and grid points (~4 min once cached)
    python benchmarks/run.py --fresh    # re-profile instead of using benchmarks/.cache/

The run's numbers and tables go to its record, ``benchmarks/results/run/<date>.json`` (a ``--quick`` or
``--smoke`` run's under ``benchmarks/results/.trial/``); the page is then rendered from the latest records
by ``benchmarks/render.py`` (the prose is ``benchmarks/BENCHMARKS.template.md``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_measured  # noqa: E402
import bench_planner_scale  # noqa: E402
import bench_profile  # noqa: E402
import bench_quality  # noqa: E402
import bench_scaling  # noqa: E402
import render  # noqa: E402
from bench_profile import profile_cached  # noqa: E402
from common import run_started, table_from_markdown, write_record  # noqa: E402
from models import GPT2_DEEP_SPEC  # noqa: E402
from peers import peer_versions  # noqa: E402

from profiles.format import load_profile  # noqa: E402

DOCS = ROOT / "docs"
SIZES = (1, 2, 4)
# One thread per profiling process: on 2 shared cores, torch's default of one thread per core makes
# unit times depend on the other processes' load (measured: identical blocks differ by several x),
# and verify's ranks run one thread each.
THREADS = 1


def _machine() -> dict[str, str]:
    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo", encoding="utf-8") as f:
        mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    from importlib.metadata import version

    import highspy  # noqa: F401
    import pulp
    import torch
    import transformers

    peers = peer_versions()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": f"{mem_kib / 2**20:.1f} GiB",
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "pulp": pulp.__version__,
        "highspy": version("highspy"),
        "deepspeed": peers["deepspeed"],
        "torchgpipe": peers["torchgpipe"],
    }


def _bullets(lines: list[str]) -> str:
    return "\n".join(f"- {x}" for x in lines) if lines else "- none"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="gpt2-small and unet-small, one measured round")
    parser.add_argument("--smoke", action="store_true", help="gpt2-tiny and mlp only: checks the script (seconds)")
    parser.add_argument("--fresh", action="store_true", help="re-profile instead of reading benchmarks/.cache/")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the markdown and pictures go")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="render docs/BENCHMARKS.md from the records again (after editing the template)",
    )
    args = parser.parse_args(argv)
    if args.render_only:
        render.main(["--docs", str(args.docs)])
        return
    record_start = run_started()
    args.docs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_start = os.getloadavg()
    values: dict[str, str] = {}
    raw: dict[str, object] = {}
    machine = _machine()
    values.update({f"machine_{k}": v for k, v in machine.items()})
    values["date"] = datetime.date.today().isoformat()
    values["mode"] = "smoke (`--smoke`)" if args.smoke else "quick (`--quick`)" if args.quick else "full"
    print(f"machine: {machine}", flush=True)

    # Item 5 and the cache: every profile is a CLI run in a fresh process.
    lead = "gpt2-tiny" if args.smoke else "gpt2-small"
    models = [(lead, lead), ("unet-small" if not args.smoke else "mlp",) * 2]
    if not args.quick and not args.smoke:
        models[1:1] = [("llama-small", "llama-small")]
        models.append(("gpt2-deep (48 blocks)", GPT2_DEEP_SPEC))
    print("profiles", flush=True)
    runs = {name: profile_cached(spec, SIZES, threads=THREADS, fresh=args.fresh) for name, spec in models}
    profiles = {name: load_profile(run.path) for name, run in runs.items()}
    spread_runs = [runs[lead]]
    if not args.quick:
        spread_runs += [profile_cached(lead, SIZES, run=k, threads=THREADS, fresh=args.fresh) for k in (1, 2)]
        default_threads = profile_cached(lead, SIZES, fresh=args.fresh)
        runs_for_table = {**runs, "gpt2-small, torch's default threads (2)": default_threads}
    else:
        runs_for_table = dict(runs)
    table_profiles = {k: profiles.get(k) or load_profile(r.path) for k, r in runs_for_table.items()}
    values["profile_table"] = _profile_table(runs_for_table, table_profiles)
    walls = [r.wall_s for r in spread_runs]  # cached runs keep the wall time measured when they were made
    values["profile_gpt2_wall"] = (
        f"median {statistics.median(walls):.0f} s over {len(walls)} runs ({', '.join(f'{w:.0f}' for w in walls)} s)"
    )
    if len(spread_runs) > 1:
        spread = bench_profile.unit_spread([load_profile(r.path) for r in spread_runs])
        values["spread_table"] = bench_profile.spread_table(spread, len(spread_runs))
        values["spread_plans"] = _plan_stability([load_profile(r.path) for r in spread_runs])
    else:
        values["spread_table"] = "(quick run: one profile, no spread; the full run profiles gpt2-small 3 times)"
        values["spread_plans"] = ""
    raw["profiles"] = {k: {"wall_s": r.wall_s, "cached": r.cached} for k, r in runs.items()}

    # Item 1: plan quality, simulated.
    print("plan quality (simulated)", flush=True)
    rows = []
    for name, profile in profiles.items():
        rows += bench_quality.quality_rows(name, profile, (2, 4, 8, 16))
    peer_names = list(rows[0].peers)
    values["quality_table"] = bench_quality.quality_table(rows, peer_names)
    values["quality_skipped"] = bench_quality.skipped_notes(rows) or "- none"
    values["quality_findings"] = _bullets(bench_quality.findings(rows))
    summary = bench_quality.summary(rows)
    values["quality_summary"] = _quality_summary(summary)
    detail = next(r for r in rows if r.model == lead and r.num_stages == 4)
    values["quality_detail"] = bench_quality.detail_table(detail, profiles[lead])
    bench_quality.speedup_png(rows, args.docs / "bench_speedup.png")
    raw["quality"] = [
        {
            "model": r.model,
            "P": r.num_stages,
            "M": r.num_microbatches,
            "b": r.micro_batch_size,
            "lower_bound_s": r.lower_bound_s,
            "pipeplan_boundaries_s": r.ours.iteration_s,
            "pipeplan_full_s": r.full.predicted.iteration_s,
            "full_plan": [r.full.schedule, r.full.virtual_stages, r.full.micro_batch_size, r.full.num_microbatches],
            "peers": {k: (v if isinstance(v, str) else v.iteration_s) for k, v in r.peers.items()},
            "plan_search_s": r.plan_s,
        }
        for r in rows
    ]

    # Item 3: the memory case.
    print("memory case", flush=True)
    case = bench_quality.memory_case(lead, profiles[lead], 4)
    values["memory_table"] = bench_quality.memory_table(case, profiles[lead])

    # Item 4: solver scaling and the whole plan search.
    print("solver scaling", flush=True)
    dp_units = (10, 50) if args.smoke else (10, 100, 500) if args.quick else (10, 100, 250, 500, 1000, 2000)
    dp_stages = (2, 8) if args.smoke else (2, 8, 32) if args.quick else (2, 4, 8, 16, 32, 64)
    dp = bench_scaling.dp_grid(dp_units, dp_stages)
    ilp_limit = 20.0 if args.quick else 60.0
    ilp_units = (10,) if args.smoke else (10, 32, 64) if args.quick else (10, 32, 64, 128)
    ilp_stages = (2, 4, 8) if args.quick else (2, 4, 8, 16)
    ilp = bench_scaling.ilp_grid(ilp_units, ilp_stages, ilp_limit)
    values["dp_table"] = bench_scaling.grid_table(dp)
    values["ilp_table"] = bench_scaling.grid_table(ilp, ilp_limit)
    backend_size = (10, 2) if args.smoke else (24, 4) if args.quick else (64, 8)
    values["backend_table"] = _backend_table(bench_scaling.ilp_backends(*backend_size, 120.0), backend_size)
    search_cases = [(2, 8), (4, 16)] if args.smoke else [(2, 8), (4, 16), (8, 32), (16, 64)]
    searches = bench_scaling.plan_search_times(profiles[lead], search_cases)
    values["plan_search_table"] = _plan_search_table(searches, profiles[lead].num_units, lead)
    if "gpt2-deep (48 blocks)" in profiles:
        deep = bench_scaling.plan_search_times(profiles["gpt2-deep (48 blocks)"], [(4, 16), (16, 64)], repeats=3)
        values["plan_search_table"] += "\n" + _plan_search_table(
            deep, profiles["gpt2-deep (48 blocks)"].num_units, "gpt2-deep", header=False
        )
    bench_scaling.scaling_png(dp, ilp, args.docs / "bench_solver_scaling.png")
    raw["dp"] = [t.__dict__ for t in dp]
    raw["ilp"] = [t.__dict__ for t in ilp]
    raw["plan_search"] = searches

    # Issue 12: the planner's own scale, 100 to 2,000 units and 2 to 64 ranks (synthetic profiles).
    print("planner scale", flush=True)
    scale_units = (100, 500) if args.smoke else (100, 500, 2000) if args.quick else bench_planner_scale.UNITS
    scale_ranks = (2, 8) if args.smoke else (2, 8, 64) if args.quick else bench_planner_scale.RANKS
    scale_repeats = 1 if args.smoke or args.quick else 3
    scale_load = os.getloadavg()[0]
    scale = [bench_planner_scale.measure(n, r, scale_repeats) for n in scale_units for r in scale_ranks]
    values["scale_table"] = bench_planner_scale.scale_table(scale)
    values["scale_phase_table"] = bench_planner_scale.phase_table(scale)
    values["scale_setup"] = (
        f"median of {scale_repeats}; load average (1 min, 2 cores) {scale_load:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    bench_planner_scale.scale_png(scale, args.docs / "bench_planner_scale.png")
    raw["planner_scale"] = [p.__dict__ for p in scale]

    # Item 2: measured on this CPU, P = 2. A one-thread profile matches each rank's one thread.
    print("plan quality (measured)", flush=True)
    b, rounds, steps = (1, 1, 1) if args.smoke else (1, 1, 2) if args.quick else (1, 3, 2)
    measured_profile = profiles[lead]
    # Global batch 4 (M = 4 at b = 1): one gpt2-small iteration takes 5-20 s here, depending on the load.
    plans = bench_measured.choose_plans(measured_profile, b, 4)
    load_before = os.getloadavg()
    bench_measured.measure(plans, lead, rounds=rounds, steps=steps, warmup=1)
    load_after = os.getloadavg()
    values["measured_table"] = bench_measured.measured_table(plans, measured_profile)
    others = [(f"profile run {k}", load_profile(r.path)) for k, r in enumerate(spread_runs)]
    values["measured_other_profiles"] = bench_measured.other_profiles_table(plans, others)
    values["measured_setup"] = (
        f"{rounds} round(s), each plan verified once per round in rotating order, {steps} timed steps after 1 "
        f"warm-up per run; load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    raw["measured"] = [
        {
            "name": m.name,
            "predicted_s": m.plan.predicted.iteration_s,
            "runs_s": m.runs_s,
            "stage_errors": m.stage_errors_pct,
        }
        for m in plans
    ]

    total = time.perf_counter() - started
    load_end = os.getloadavg()
    made = sum(not r.cached for r in [*runs.values(), *spread_runs])
    values["run_time"] = f"{total / 60:.1f} min" + (
        f", {made} profile(s) made in this run" if made else ", all profiles read from benchmarks/.cache/"
    )
    values["load"] = f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end (1-minute load average, 2 cores)"
    # Results first: a template edited during the run must not cost the run (--render-only renders again).
    out = bench_profile.CACHE / _results_name(args)
    out.write_text(json.dumps({"values": values, "raw": raw}, indent=1, default=str))
    numbers = {
        "wall_min": round(total / 60, 1),
        "profiles_made": made,
        "mode": values["mode"],
        "quality": {
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()},
            "peer_max_slowdown": _peer_max_slowdown(raw["quality"]),
        },
        "raw": raw,
    }
    write_record(
        "run",
        numbers,
        started=record_start,
        tables={name: table_from_markdown(values[key]) for name, key in _TABLES.items() if "|" in values[key]},
        text={key: values[key] for key in _TEXTS},
        plots=(args.docs / "bench_speedup.png", args.docs / "bench_solver_scaling.png"),
        trial=args.quick or args.smoke,
    )
    render.main(["--docs", str(args.docs)])
    print(f"wrote the record, the pages and the pictures in {total / 60:.1f} min", flush=True)


_TABLES = {
    "quality": "quality_table",
    "quality_detail": "quality_detail",
    "measured": "measured_table",
    "measured_other_profiles": "measured_other_profiles",
    "memory_cap": "memory_table",
    "dp": "dp_table",
    "ilp": "ilp_table",
    "backends": "backend_table",
    "plan_search": "plan_search_table",
    "profile": "profile_table",
    "spread": "spread_table",
}
"""The record's table names (what the template's marks read) and the values they come from."""
_TEXTS = (
    "quality_summary",
    "quality_skipped",
    "quality_findings",
    "measured_setup",
    "profile_gpt2_wall",
    "spread_plans",
)


def _peer_max_slowdown(quality: list[dict]) -> dict[str, float]:
    """Each peer's slowest iteration against pipeplan's boundaries, over the cases, by the peer's slug."""
    worst: dict[str, float] = {}
    for row in quality:
        for name, value in row["peers"].items():
            if isinstance(value, float):
                slug = "_".join("".join(c if c.isalnum() else " " for c in name.lower()).split())
                worst[slug] = round(max(worst.get(slug, 0.0), value / row["pipeplan_boundaries_s"]), 3)
    return worst


def _results_name(args: argparse.Namespace) -> str:
    return "results-smoke.json" if args.smoke else "results-quick.json" if args.quick else "results.json"


def _profile_table(runs: dict, profiles: dict) -> str:
    lines = [
        "| model | units | parameters | whole-process `pipeplan profile` (s; 1-min load after) "
        "| unit sum vs whole model, b=1 / 2 / 4 "
        "| spread over identical blocks, b=1 / 2 / 4 |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        p = profiles[name]
        params = sum(u.param_count for u in p.units)
        diffs = " / ".join(f"{p.unit_sum_error(k) * 100:+.1f} %" for k in range(len(p.micro_batch_sizes)))
        meta = json.loads(Path(str(run.path).replace(".profile.json", ".meta.json")).read_text())
        cached = f" (load {meta.get('load_avg_1m_after', float('nan')):.1f})"
        blocks = bench_profile.block_spread(p)
        spread = " / ".join(f"{x:.0f} %" for x in blocks) if blocks else "n/a (no block list)"
        lines.append(
            f"| {name} | {p.num_units} | {params / 1e6:.1f} M | {run.wall_s:.0f}{cached} | {diffs} | {spread} |"
        )
    return "\n".join(lines)


def _plan_stability(profiles: list) -> str:
    """Does the plan change when only the profiling noise changes?"""
    out = []
    for p_ranks, batch in ((2, 8), (4, 16)):
        plans = [bench_quality.pipeplan_full(p, p_ranks, batch) for p in profiles]
        splits = {(pl.schedule, pl.micro_batch_size, pl.split_points) for pl in plans}
        iters = [pl.predicted.iteration_s for pl in plans]
        out.append(
            f"- P = {p_ranks}, global batch {batch}: {len(splits)} distinct plan(s) from the {len(plans)} profiles; "
            f"predicted iteration {min(iters):.3f}..{max(iters):.3f} s"
        )
    return "\n".join(out)


def _quality_summary(s: dict) -> str:
    return (
        f"Over {s['cases']} (model, P) cases: the best peer's iteration / pipeplan's boundaries is "
        f"{s['min_best_peer_over_boundaries']:.3f} at least, {s['median_best_peer_over_boundaries']:.3f} median, "
        f"{s['max_best_peer_over_boundaries']:.3f} at most; against pipeplan's full plan "
        f"{s['min_best_peer_over_full']:.3f} / {s['median_best_peer_over_full']:.3f} / "
        f"{s['max_best_peer_over_full']:.3f}. pipeplan's boundaries are within 5 % of the bound in "
        f"{s['within_5pct_of_bound']} of {s['cases']} cases (worst {s['max_over_bound']:.3f} x the bound). "
        f"Slowest full plan search: {s['max_plan_s']:.2f} s."
    )


def _backend_table(results: list, size: tuple[int, int]) -> str:
    lines = [
        f"ILP on {size[0]} units x {size[1]} stages (time limit 120 s):",
        "",
        "| backend | seconds | optimal | gap | objective equals the DP's |",
        "|---|---|---|---|---|",
    ]
    for backend, t, gap in results:
        lines.append(f"| {backend} | {t.seconds:.2f} | {t.optimal} | {gap} | {t.matches_dp} |")
    return "\n".join(lines)


def _plan_search_table(searches: list, units: int, model: str = "gpt2-small", header: bool = True) -> str:
    lines = []
    if header:
        lines = ["| profile | units | P | global batch | whole search (s, median) |", "|---|---|---|---|---|"]
    for p, batch, seconds in searches:
        lines.append(f"| {model} | {units} | {p} | {batch} | {seconds:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
