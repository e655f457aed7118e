"""Time the exact solvers: DP at 1,000 units x 64 stages, a DP scaling grid, and the ILP (HiGHS, CBC).

Usage::

    python benchmarks/bench_solvers.py            # full run
    python benchmarks/bench_solvers.py --quick    # a few seconds
    python benchmarks/bench_solvers.py --png scaling.png

Instances are synthetic but shaped like a transformer: an embedding, alternating attention and MLP
units (+-10 % noise), a heavy LM head, activations crossing every cut over a 1.2 GB/s link, 1F1B
in-flight counts and a memory capacity 15 % above the average stage's need (or the LM head's), recompute allowed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from solvers.dp import solve_dp  # noqa: E402
from solvers.ilp import solve_ilp  # noqa: E402
from solvers.problem import PartitionProblem  # noqa: E402

__all__ = ["transformer_like"]


def transformer_like(
    num_units: int, num_stages: int, num_microbatches: int | None = None, seed: int = 0
) -> PartitionProblem:
    """A seeded transformer-shaped instance (see the module docstring)."""
    rng = random.Random(seed)
    m = num_microbatches or 2 * num_stages
    fwd, bwd, params, saved, transient = [], [], [], [], []
    for u in range(num_units):
        if u == 0:
            time_s, param_count, saved_b = 0.002, 80e6, 4e6
        elif u == num_units - 1:
            time_s, param_count, saved_b = 0.03, 600e6, 30e6
        elif u % 2:
            time_s, param_count, saved_b = 0.010, 110e6, 12e6
        else:
            time_s, param_count, saved_b = 0.006, 55e6, 8e6
        f = time_s * rng.uniform(0.9, 1.1)
        fwd.append(f)
        bwd.append(2 * f * rng.uniform(0.95, 1.05))
        params.append(int(param_count * 4))  # fp32 weights + grads + 2 Adam moments, 4 B each / 4
        saved.append(int(saved_b))
        transient.append(int(saved_b // 2))
    cut = [int(3e6 * rng.uniform(0.8, 1.2)) for _ in range(num_units - 1)]
    link_s = tuple(c / 1.2e9 for c in cut)
    in_flight = tuple(min(num_stages - s, m) for s in range(num_stages))
    need = sum(params) / num_stages + sum(saved) / num_stages * max(in_flight)
    # Small instances: the LM head alone must still fit (with recomputation).
    need = max(need, (max(params) + max(saved) + max(cut) * max(in_flight)) / 1.15 * 1.3)
    return PartitionProblem(
        forward_s=tuple(fwd),
        backward_s=tuple(bwd),
        num_stages=num_stages,
        num_microbatches=m,
        cut_forward_s=link_s,
        cut_backward_s=link_s,
        cut_bytes=tuple(cut),
        input_bytes=1_000_000,
        param_state_bytes=tuple(params),
        saved_bytes=tuple(saved),
        transient_bytes=tuple(transient),
        in_flight=in_flight,
        capacity_bytes=(1.15 * need,) * num_stages,
        recompute_choices=(False, True),
    )


def _median_s(problem: PartitionProblem, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        solve_dp(problem)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid, ILP at 24 x 4")
    parser.add_argument("--png", type=Path, help="write a log-log plot of the DP scaling grid")
    args = parser.parse_args(argv)
    started, printed = run_started(), tee_stdout()

    headline = transformer_like(1000, 64)
    sol = solve_dp(headline)[0]
    print(
        f"DP 1000 units x 64 stages (M=128): median of 3 = {_median_s(headline, 3):.3f} s, "
        f"objective {sol.objective_s:.4f} s, bottleneck {sol.bottleneck_s:.4f} s, "
        f"{sum(sol.recompute)} stages recompute"
    )

    units = (10, 100, 500) if args.quick else (10, 100, 250, 500, 1000, 2000)
    stages = (2, 8, 32) if args.quick else (2, 4, 8, 16, 32, 64)
    grid: dict[tuple[int, int], float] = {}
    print("\nDP seconds (median of 3), units x stages\n")
    print("| units | " + " | ".join(f"P={p}" for p in stages) + " |")
    print("|---|" + "---|" * len(stages))
    for n in units:
        cells = []
        for p in stages:
            if p > n:
                cells.append("-")
                continue
            grid[n, p] = _median_s(transformer_like(n, p), 3)
            cells.append(f"{grid[n, p]:.4f}")
        print(f"| {n} | " + " | ".join(cells) + " |")

    n, p = (24, 4) if args.quick else (64, 8)
    problem = transformer_like(n, p)
    best = solve_dp(problem)[0].objective_s
    print(f"\nILP {n} units x {p} stages (time limit 120 s); DP optimum {best:.6f} s\n")
    print("| backend | seconds | optimal | gap | objective == DP |")
    print("|---|---|---|---|---|")
    for backend in ("highs", "cbc"):
        sol = solve_ilp(problem, time_limit_s=120.0, backend=backend)
        same = abs(sol.objective_s - best) <= 1e-9 * best
        print(f"| {backend} | {sol.solve_s:.2f} | {sol.optimal} | {sol.gap} | {same} |")

    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for p in stages:
            xs = [n for n in units if (n, p) in grid]
            ax.loglog(xs, [grid[n, p] for n in xs], marker="o", label=f"P={p}")
        ax.set_xlabel("units")
        ax.set_ylabel("DP seconds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png)
        print(f"\nwrote {args.png}")
    dp = {f"{n}x{p}": s for (n, p), s in grid.items()}
    tables = tables_in(printed.getvalue(), ("dp", "backends"))
    write_record(
        "solvers", {"dp_s": dp}, started=started, tables=tables, plots=(args.png,) if args.png else (), trial=args.quick
    )


if __name__ == "__main__":
    main()
