"""Cluster plans (``pipeplan plan --devices N``): what the pp x dp search chooses, and how long it takes.

    python benchmarks/bench_cluster.py                       # the table of docs/BENCHMARKS.md section 9
    python benchmarks/bench_cluster.py --jobs 4              # wall times with 1 and with 4 worker processes
    python benchmarks/bench_cluster.py --curve docs/bench_cluster_scale.png   # 2,000 units, 8 .. 4,096 devices
    python benchmarks/bench_cluster.py --tensor-parallel auto --min-units 2000   # 4,096 devices, tp searched

Profiles are the planner-scale benchmark's synthetic transformer-shaped ones (bench_planner_scale.py),
with the cluster's default CUDA links (NVLink 450 GB/s in a node, 50 GB/s between nodes) and 80 or
16 GiB devices. Each case runs once in one process and once with ``--jobs`` workers (default: the CPUs),
and the two plans are checked equal (a cluster search is deterministic; the wall time is what varies).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_planner_scale import synthetic_profile  # noqa: E402
from common import run_started, write_record  # noqa: E402

from planner.cluster import Cluster, MeshSearch, plan_cluster  # noqa: E402
from planner.cost import CostSettings  # noqa: E402
from planner.formatting import format_table  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.search import plan_key  # noqa: E402

CASES = (  # (units, devices, devices per node, global batch, device memory GiB)
    (100, 8, 4, 64, 80),
    (100, 64, 8, 512, 80),
    (100, 64, 8, 512, 16),
    (200, 64, 8, 512, 80),
    (200, 64, 8, 512, 16),
    (2000, 4096, 8, 4096, 80),
)


def run(
    units: int, devices: int, per_node: int, batch: int, memory_gib: int, jobs: int, tensor_parallel: bool = False
) -> tuple[list[object], list[float]]:
    """The table's row for one case, and its wall seconds in one process and with ``jobs`` workers;
    ``tensor_parallel``: the degree searched too (the profile given 32 attention heads)."""
    profile = synthetic_profile(units)
    profile = replace(profile, device=replace(profile.device, kind="cuda", memory_bytes=memory_gib * 2**30))
    if tensor_parallel:
        profile = replace(profile, settings={**profile.settings, "attention_heads": 32})
    request = PlanRequest(
        num_ranks=1, global_batch_size=batch, settings=CostSettings(link_bytes_per_s=50e9, link_latency_s=1e-5)
    )
    cluster = Cluster(devices, per_node, 450e9, 50e9, 1e-5)
    walls, results = [], []
    for workers in (1, jobs):
        started = time.perf_counter()
        degree = None if tensor_parallel else 1
        # GPU clusters of this size run Megatron's layout (vocabulary-parallel embedding and head, sequence split).
        megatron = {"sequence_parallel": True, "vocab_parallel": True}
        results.append(
            plan_cluster(
                profile, request, cluster, MeshSearch(tensor_parallel=degree, **megatron), sha256="0" * 64, jobs=workers
            )
        )
        walls.append(time.perf_counter() - started)
    result = results[0]
    plan, mesh = result.plan, result.plan.mesh
    assert mesh is not None
    assert plan_key(results[1].plan) == plan_key(plan) and results[1].plan.mesh == mesh, "--jobs changed the plan"
    simulated = sum(1 for t in result.tried if t[1] is not None)
    row = [
        units,
        f"{sum(u.param_count for u in profile.units) / 1e9:.2f}",
        devices,
        batch,
        memory_gib,
        f"{len(result.tried)} / {simulated}",
        f"{mesh.pp} x {mesh.dp}" if not tensor_parallel else f"{mesh.pp} x {mesh.tp} x {mesh.dp}",
        mesh.placement,
        f"{plan.schedule.value} b={plan.micro_batch_size} M={plan.num_microbatches}",
        f"{plan.predicted.iteration_s:.3g} s",
        f"{walls[0]:.1f} s",
        f"{walls[1]:.1f} s",
    ]
    return row, walls


CURVE_DEVICES = (8, 32, 128, 512, 2048, 4096)


def curve(jobs: int, path: Path) -> list[list[object]]:
    """Wall seconds of one 2,000-unit cluster search per device count (global batch max(512, N), 80 GiB),
    in one process and with ``jobs`` workers, drawn log-log to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [run(2000, n, 8, max(512, n), 80, jobs) for n in CURVE_DEVICES]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, label in enumerate(("1 process", f"{jobs} workers")):
        ys = [walls[k] for _, walls in cases]
        ax.loglog(CURVE_DEVICES, ys, marker="o", markersize=3, label=label)
    ax.axhline(10.0, color="grey", linewidth=0.8, linestyle="--")
    ax.text(CURVE_DEVICES[0], 10.5, "10 s", fontsize=7, color="grey")
    ax.set_xlabel("devices (8 a node)")
    ax.set_ylabel("plan_cluster, seconds (wall)")
    ax.set_title("Cluster plan search time, 2,000-unit synthetic profile (shared 2-core CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [row for row, _ in cases]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-units", type=int, default=2000, help="skip larger cases")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="workers of the second run")
    parser.add_argument("--curve", type=Path, default=None, metavar="PNG", help="2,000 units on 8 .. 4,096 devices")
    parser.add_argument(
        "--tensor-parallel", choices=("1", "auto"), default="1", help="auto: search tp too (1, 2, 4, 8 a node)"
    )
    parser.add_argument("--min-units", type=int, default=0, help="skip smaller cases")
    args = parser.parse_args(argv)
    started = run_started()
    tp = args.tensor_parallel == "auto"
    if args.curve is not None:
        rows = curve(args.jobs, args.curve)
    else:
        rows = [run(*case, args.jobs, tp)[0] for case in CASES if args.min_units <= case[0] <= args.max_units]
    mesh = "pp x tp x dp" if tp else "pp x dp"
    headers = ["units", "params (B)", "devices", "batch", "GiB", "layouts / simulated", mesh, "placement"]
    headers += ["schedule", "step", "wall, 1 process", f"wall, {args.jobs} workers"]
    print(format_table(headers, rows, align=">>>>>>><<>>>"))
    name = "cluster_curve" if args.curve is not None else "cluster_tp" if tp else "cluster"
    plots = (args.curve,) if args.curve is not None else ()
    table = {"columns": headers, "rows": [list(map(str, r)) for r in rows]}
    write_record(name, {}, started=started, tables={"curve" if args.curve else "layouts": table}, plots=plots)


if __name__ == "__main__":
    main()
