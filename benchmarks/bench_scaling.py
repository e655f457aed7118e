"""Solver scaling (issue 6, item 4): DP and ILP time against units and stages, and the whole plan search.

Instances are ``bench_solvers.transformer_like`` (seeded, transformer-shaped, memory-capped, recompute
allowed). Times are medians; the ILP has a time limit, and a run that reaches it is marked.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_solvers import transformer_like  # noqa: E402

from planner.cost import default_settings  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.search import make_plan  # noqa: E402
from profiles.format import Profile  # noqa: E402
from solvers.dp import solve_dp  # noqa: E402
from solvers.ilp import solve_ilp  # noqa: E402

__all__ = ["Timing", "dp_grid", "ilp_grid", "ilp_backends", "plan_search_times", "grid_table", "scaling_png"]


@dataclass(frozen=True)
class Timing:
    units: int
    stages: int
    seconds: float
    optimal: bool = True
    matches_dp: bool = True


def _median_time(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def dp_grid(units: tuple[int, ...], stages: tuple[int, ...], repeats: int = 3) -> list[Timing]:
    out = []
    for n in units:
        for p in stages:
            if p <= n:
                problem = transformer_like(n, p)
                out.append(Timing(n, p, _median_time(lambda pr=problem: solve_dp(pr), repeats)))
    return out


def ilp_grid(units: tuple[int, ...], stages: tuple[int, ...], time_limit_s: float) -> list[Timing]:
    """HiGHS, one run each (the ILP is the slow path; DP's optimum checks each answer)."""
    out = []
    for n in units:
        for p in stages:
            if p > n:
                continue
            problem = transformer_like(n, p)
            best = solve_dp(problem)[0].objective_s
            start = time.perf_counter()
            sol = solve_ilp(problem, time_limit_s=time_limit_s, backend="highs")
            seconds = time.perf_counter() - start
            same = abs(sol.objective_s - best) <= 1e-6 * best
            out.append(Timing(n, p, seconds, sol.optimal, same))
            print(f"  ILP {n} x {p}: {seconds:.2f} s, optimal {sol.optimal}, equals DP {same}", flush=True)
    return out


def ilp_backends(units: int, stages: int, time_limit_s: float) -> list[tuple[str, Timing, float | None]]:
    problem = transformer_like(units, stages)
    best = solve_dp(problem)[0].objective_s
    out = []
    for backend in ("highs", "cbc"):
        start = time.perf_counter()
        sol = solve_ilp(problem, time_limit_s=time_limit_s, backend=backend)
        seconds = time.perf_counter() - start
        same = abs(sol.objective_s - best) <= 1e-6 * best
        out.append((backend, Timing(units, stages, seconds, sol.optimal, same), sol.gap))
    return out


def plan_search_times(profile: Profile, cases: list[tuple[int, int]], repeats: int = 5) -> list[tuple[int, int, float]]:
    """Median wall time of ``make_plan`` (the whole ``pipeplan plan`` search) per (P, global batch)."""
    out = []
    for p, batch in cases:
        request = PlanRequest(p, batch, settings=default_settings(profile))
        out.append((p, batch, _median_time(lambda r=request: make_plan(profile, r, sha256="x"), repeats)))
    return out


def grid_table(timings: list[Timing], time_limit_s: float | None = None) -> str:
    units = sorted({t.units for t in timings})
    stages = sorted({t.stages for t in timings})
    cell = {(t.units, t.stages): t for t in timings}
    lines = ["| units | " + " | ".join(f"P={p}" for p in stages) + " |", "|---|" + "---|" * len(stages)]
    for n in units:
        cells = []
        for p in stages:
            t = cell.get((n, p))
            if t is None:
                cells.append("-")
                continue
            text = f"{t.seconds:.4f}" if t.seconds < 1 else f"{t.seconds:.2f}"
            if not t.optimal:
                text += f" (limit {time_limit_s:g} s, not optimal)"
            elif not t.matches_dp:
                text += " (differs from DP!)"
            cells.append(text)
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scaling_png(dp: list[Timing], ilp: list[Timing], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    stages = sorted({t.stages for t in dp} | {t.stages for t in ilp})
    colors = {p: plt.cm.viridis(i / max(1, len(stages) - 1)) for i, p in enumerate(stages)}
    for kind, timings, style in (("DP", dp, "-"), ("ILP (HiGHS)", ilp, "--")):
        for p in stages:
            pts = sorted((t.units, t.seconds) for t in timings if t.stages == p)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.loglog(xs, ys, style, marker="o", markersize=3, color=colors[p], label=f"{kind} P={p}")
    ax.set_xlabel("units")
    ax.set_ylabel("solve seconds (median)")
    ax.set_title("Exact solvers: time vs units and stages")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
