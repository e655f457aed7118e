"""Planner scale (issue 12): ``pipeplan plan`` time from 100 to 2,000 units and 2 to 64 ranks, and where it goes.

Profiles are synthetic and transformer-shaped (seeded): an embedding, blocks alternating attention-like and
MLP-like costs (+-10 %), an LM head; each unit's output feeds the next, and a mask-like tensor from the input
reaches every block, so it crosses every cut (as GPT-2's causal mask does). Micro-batch sizes 1, 2, 4, the
shipped CPU calibration (what ``pipeplan plan`` uses by default). Global batch: 4 x ranks, or less where ranks x
micro-batches would pass pipeplan's limit of 4,096 (README, "Limits"): 64 for 64 ranks.

Each point is the median of ``repeats`` runs of ``make_plan``: the whole search (every micro-batch size,
schedule, virtual-stage count and recompute choice; the exact DP per candidate; the simulator re-scoring the best
partitions; the baselines). Phases are timed by wrapping the search's calls: the DP (``solve_dp``), the
simulator (``simulate`` and ``in_flight_per_stage``, baselines included), and the rest (cost model, graph,
plan assembly). Wall and CPU seconds are both kept: on a shared machine the CPU time is the steadier one.

Usage::

    python benchmarks/bench_planner_scale.py                   # the grid below, ~5 min on 2 shared cores
    python benchmarks/bench_planner_scale.py --units 100,2000 --ranks 2,64 --repeats 1
    python benchmarks/bench_planner_scale.py --write-profile synthetic-2000.profile.json --units 2000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import run_started, table_from_markdown, write_record  # noqa: E402

import planner.prediction as prediction  # noqa: E402
import planner.search as search  # noqa: E402
from planner.calibration import shipped_calibration  # noqa: E402
from planner.cost import default_settings  # noqa: E402
from planner.limits import MAX_PLAN_WORK  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from profiles.format import DeviceInfo, ModelInfo, Profile, TensorFlow, UnitProfile, WholeModel  # noqa: E402

__all__ = ["synthetic_profile", "ScalePoint", "measure", "global_batch", "scale_table", "phase_table", "scale_png"]

UNITS = (100, 500, 1000, 2000)
RANKS = (2, 8, 32, 64)
SIZES = (1, 2, 4)


def synthetic_profile(num_units: int, seed: int = 0, sizes: tuple[int, ...] = SIZES) -> Profile:
    """A seeded transformer-shaped profile of ``num_units`` units (see the module docstring)."""
    rng = random.Random(seed)
    units = []
    for u in range(num_units):
        if u == 0:
            time_s, params, saved, name = 0.002, 40e6, 1e6, "embed"
        elif u == num_units - 1:
            time_s, params, saved, name = 0.03, 40e6, 8e6, "lm_head"
        else:
            time_s, params, saved = (0.010, 7e6, 3e6) if u % 2 else (0.006, 4e6, 2e6)
            name = f"layers.{u - 1}"
        f = time_s * rng.uniform(0.9, 1.1)
        units.append(
            UnitProfile(
                name=name,
                type="Block",
                param_count=int(params),
                param_bytes=int(4 * params),
                forward_s=tuple(f * b for b in sizes),
                backward_s=tuple(2 * f * b * rng.uniform(0.95, 1.05) for b in sizes),
                flops=tuple(int(1e9 * f * b) for b in sizes),
                output_bytes=tuple(int(1e6 * b) for b in sizes),
                saved_bytes=tuple(int(saved * b) for b in sizes),
            )
        )
    tensors = [TensorFlow(-1, (0,), tuple(8 * b for b in sizes), "int64", False, "input_ids")]
    tensors.append(TensorFlow(-1, tuple(range(1, num_units - 1)), tuple(64 * b for b in sizes), "bool", False, "mask"))
    tensors += [
        TensorFlow(k, (k + 1,), tuple(int(1e6 * b) for b in sizes), "float32", True, f"hidden{k}")
        for k in range(num_units - 1)
    ]
    forward = [sum(u.forward_s[i] for u in units) for i in range(len(sizes))]
    backward = [sum(u.backward_s[i] for u in units) for i in range(len(sizes))]
    return Profile(
        model=ModelInfo(f"synthetic-{num_units}", "ab" * 32, sum(u.param_count for u in units), 0),
        # 512 GiB: 2,000 units (175 GiB of weights, gradients and Adam state) fit on 2 ranks.
        device=DeviceInfo("cpu", "synthetic", 512 * 1024**3, "float32", "2.13.0"),
        micro_batch_sizes=sizes,
        units=tuple(units),
        tensors=tuple(tensors),
        whole_model=WholeModel(tuple(forward), tuple(backward)),
    )


def global_batch(num_ranks: int) -> int:
    """4 x ranks, or the largest that keeps ranks x micro-batches (at micro-batch 1) within the CLI's limit."""
    return min(4 * num_ranks, MAX_PLAN_WORK // num_ranks)


@dataclass(frozen=True)
class ScalePoint:
    units: int
    ranks: int
    global_batch: int
    wall_s: float
    """Median over repeats."""
    cpu_s: float
    dp_s: float
    """Of the median run: time inside the DP."""
    simulator_s: float
    other_s: float
    stages: int
    schedule: str
    candidates: int


class _Phases:
    """Wraps the search's calls to the DP and the simulator and adds up their wall time."""

    def __init__(self) -> None:
        self.dp_s = self.simulator_s = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        # The search solves with solve_dp and simulates with simulate, taken into its namespace and into that of
        # planner.prediction (which predicts the plan it builds).
        homes = [(search, "solve_dp"), (search, "simulate"), (prediction, "simulate"), (search, "in_flight_per_stage")]
        originals = {(module, name): getattr(module, name) for module, name in homes}

        def timed(module: object, name: str, attribute: str):  # noqa: ANN202
            inner = originals[module, name]

            def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                start = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    setattr(self, attribute, getattr(self, attribute) + time.perf_counter() - start)

            return call

        search.solve_dp = timed(search, "solve_dp", "dp_s")
        search.simulate = timed(search, "simulate", "simulator_s")
        prediction.simulate = timed(prediction, "simulate", "simulator_s")
        search.in_flight_per_stage = timed(search, "in_flight_per_stage", "simulator_s")
        try:
            yield
        finally:
            for (module, name), value in originals.items():
                setattr(module, name, value)


def measure(units: int, ranks: int, repeats: int = 3) -> ScalePoint:
    profile = synthetic_profile(units)
    batch = global_batch(ranks)
    settings = default_settings(profile, calibration=shipped_calibration("cpu"), calibration_label="shipped")
    request = PlanRequest(ranks, batch, settings=settings)
    runs = []
    for _ in range(repeats):
        phases = _Phases()
        with phases.installed():
            wall, cpu = time.perf_counter(), time.process_time()
            plan = search.make_plan(profile, request, sha256="0" * 64)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        runs.append((wall, cpu, phases.dp_s, phases.simulator_s, plan))
    runs.sort(key=lambda r: r[0])
    wall, _, dp_s, simulator_s, plan = runs[len(runs) // 2]
    return ScalePoint(
        units=units,
        ranks=ranks,
        global_batch=batch,
        wall_s=wall,
        cpu_s=statistics.median(r[1] for r in runs),
        dp_s=dp_s,
        simulator_s=simulator_s,
        other_s=max(0.0, wall - dp_s - simulator_s),
        stages=plan.num_stages,
        schedule=plan.schedule.value,
        candidates=plan.solver.candidates,
    )


def _seconds(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def scale_table(points: list[ScalePoint]) -> str:
    """Median wall seconds (CPU seconds in brackets), units down, ranks across."""
    ranks = sorted({p.ranks for p in points})
    cell = {(p.units, p.ranks): p for p in points}
    lines = [
        "| units | " + " | ".join(f"P={r} (B={global_batch(r)})" for r in ranks) + " |",
        "|---|" + "---|" * len(ranks),
    ]
    for n in sorted({p.units for p in points}):
        cells = []
        for r in ranks:
            p = cell.get((n, r))
            cells.append("-" if p is None else f"{_seconds(p.wall_s)} ({_seconds(p.cpu_s)})")
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def phase_table(points: list[ScalePoint]) -> str:
    lines = [
        "| units | P | plan (stages, schedule) | candidates | wall | DP | simulator | rest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(points, key=lambda p: (p.units, p.ranks)):
        shares = [
            f"{_seconds(x)} ({x / p.wall_s:.0%})" if p.wall_s > 0 else _seconds(x)
            for x in (p.dp_s, p.simulator_s, p.other_s)
        ]
        lines.append(
            f"| {p.units:,} | {p.ranks} | {p.stages}, {p.schedule} | {p.candidates} | {_seconds(p.wall_s)} | "
            + " | ".join(shares)
            + " |"
        )
    return "\n".join(lines)


def scale_png(points: list[ScalePoint], path: Path, before: list[ScalePoint] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ranks = sorted({p.ranks for p in points})
    colors = {r: plt.cm.viridis(i / max(1, len(ranks) - 1)) for i, r in enumerate(ranks)}
    for label, group, style in (("", points, "-"), (" before", before, ":")):
        for r in ranks:
            pts = sorted((p.units, p.wall_s) for p in group if p.ranks == r)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.loglog(xs, ys, style, marker="o", markersize=3, color=colors[r], label=f"P={r}{label}")
    ax.axhline(10.0, color="grey", linewidth=0.8, linestyle="--")
    ax.text(min(p.units for p in points), 10.5, "10 s", fontsize=7, color="grey")
    ax.set_xlabel("units")
    ax.set_ylabel("pipeplan plan, seconds (median wall)")
    ax.set_title("Plan search time vs units and ranks (synthetic profiles, shared 2-core CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", default=",".join(map(str, UNITS)))
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the points as JSON")
    parser.add_argument("--png", type=Path, default=None, help="write the log-log picture")
    parser.add_argument("--before", type=Path, default=None, help="JSON of an earlier run, drawn dotted")
    parser.add_argument("--write-profile", type=Path, default=None, help="write the synthetic profile(s) and stop")
    parser.add_argument("--from-json", type=Path, default=None, help="tables and picture of a saved run, no measuring")
    args = parser.parse_args(argv)
    if args.from_json:
        points = [ScalePoint(**p) for p in json.loads(args.from_json.read_text())]
        print(scale_table(points))
        print()
        print(phase_table(points))
        if args.png:
            before = [ScalePoint(**p) for p in json.loads(args.before.read_text())] if args.before else []
            scale_png(points, args.png, before)
            print(f"wrote {args.png}")
        return
    units = [int(x) for x in args.units.split(",")]
    if args.write_profile:
        from profiles.format import save_profile

        for n in units:
            path = args.write_profile if len(units) == 1 else args.write_profile.with_suffix(f".{n}.json")
            save_profile(synthetic_profile(n), path)
            print(f"wrote {path}")
        return
    record_start = run_started()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    points = []
    for n in units:
        for r in (int(x) for x in args.ranks.split(",")):
            point = measure(n, r, args.repeats)
            points.append(point)
            print(
                f"{n:>5} units, P={r:<2}: {point.wall_s:7.3f} s wall, {point.cpu_s:7.3f} s CPU (DP {point.dp_s:.3f}, "
                f"simulator {point.simulator_s:.3f}); {point.stages} stages {point.schedule}",
                flush=True,
            )
    print(
        f"\n{time.perf_counter() - started:.0f} s; load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at "
        "the end (1 min, 2 cores)\n"
    )
    print(scale_table(points))
    print()
    print(phase_table(points))
    if args.json:
        args.json.write_text(json.dumps([asdict(p) for p in points], indent=1))
    if args.png:
        before = [ScalePoint(**p) for p in json.loads(args.before.read_text())] if args.before else []
        scale_png(points, args.png, before)
        print(f"wrote {args.png}")
    write_record(
        "planner_scale",
        {"points": [asdict(p) for p in points], "wall_s": round(time.perf_counter() - started)},
        started=record_start,
        tables={"scale": table_from_markdown(scale_table(points)), "phases": table_from_markdown(phase_table(points))},
        plots=(args.png,) if args.png else (),
    )


if __name__ == "__main__":
    main()
