"""Plan quality, simulated (issue 6, item 1), and the memory case (item 3).

For each model and P (M = 4P micro-batches of the reference size ``b``): every peer's boundaries and
pipeplan's are simulated by the same cost model and simulator under 1F1B without recomputation
("boundaries only"); pipeplan's full plan also chooses the micro-batch size (same global batch
``b * M``), the schedule and recomputation. Lower bound: ``W + (M - 1) * max(W / P, largest unit)``.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Score, Setting, lower_bound_s, make_setting, score, stage_sizes  # noqa: E402
from peers import peer_partitions  # noqa: E402

from planner.cost import default_settings  # noqa: E402
from planner.errors import PlanInfeasibleError  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.search import make_plan  # noqa: E402
from profiles.format import Profile  # noqa: E402

__all__ = [
    "QualityRow",
    "quality_rows",
    "quality_table",
    "detail_table",
    "speedup_png",
    "MemoryCase",
    "memory_case",
    "memory_table",
    "pipeplan_boundaries",
    "pipeplan_full",
    "plan_boundaries",
    "skipped_notes",
    "findings",
    "summary",
]

REFERENCE_MICRO_BATCH = 2
GIB = 1024**3


@dataclass(frozen=True)
class QualityRow:
    model: str
    num_stages: int
    num_microbatches: int
    micro_batch_size: int
    lower_bound_s: float
    ours: Score
    """pipeplan's boundaries, 1F1B, same b and M as the peers, no recomputation."""
    full: Plan
    full_lower_bound_s: float
    """The bound at the full plan's own micro-batch size and count."""
    peers: dict[str, Score | str]
    plan_s: float
    """Wall time of the full plan search (make_plan)."""

    @property
    def fitting_peers(self) -> dict[str, Score]:
        return {k: v for k, v in self.peers.items() if isinstance(v, Score) and v.fits}

    @property
    def best_peer(self) -> tuple[str, Score] | None:
        peers = self.fitting_peers
        return min(peers.items(), key=lambda kv: kv[1].iteration_s) if peers else None


def pipeplan_boundaries(profile: Profile, setting: Setting, settings: object = None) -> Plan:
    """pipeplan restricted to what a peer chooses: boundaries (1F1B, the setting's b and M, no recompute)."""
    request = PlanRequest(
        num_ranks=setting.num_stages,
        global_batch_size=setting.micro_batch_size * setting.num_microbatches,
        schedule="1f1b",
        micro_batch_size=setting.micro_batch_size,
        recompute="off",
        settings=settings or default_settings(profile),  # type: ignore[arg-type]
    )
    return make_plan(profile, request, sha256="benchmark")


def pipeplan_full(profile: Profile, num_ranks: int, global_batch: int, settings: object = None) -> Plan:
    """pipeplan's whole search: micro-batch size, schedule, virtual stages, recomputation, boundaries."""
    request = PlanRequest(num_ranks, global_batch, settings=settings or default_settings(profile))  # type: ignore[arg-type]
    return make_plan(profile, request, sha256="benchmark")


def plan_boundaries(profile: Profile, plan: Plan) -> tuple[int, ...]:
    names = [u.name for u in profile.units]
    return (0, *(names.index(s) for s in plan.split_points))


def quality_rows(model: str, profile: Profile, stages: tuple[int, ...]) -> list[QualityRow]:
    rows = []
    b = REFERENCE_MICRO_BATCH if REFERENCE_MICRO_BATCH in profile.micro_batch_sizes else profile.micro_batch_sizes[0]
    for p in stages:
        if p > profile.num_units:
            continue
        m = 4 * p
        setting = make_setting(profile, b, p, m)
        ours_plan = pipeplan_boundaries(profile, setting)
        ours = score(setting, plan_boundaries(profile, ours_plan))
        if abs(ours.iteration_s - ours_plan.predicted.iteration_s) > 1e-9 * ours.iteration_s:
            print(f"  WARNING: {model} P={p}: rescored {ours.iteration_s} != plan {ours_plan.predicted.iteration_s}")
        start = time.perf_counter()
        full = pipeplan_full(profile, p, b * m)
        plan_s = time.perf_counter() - start
        costs = setting.costs
        times = [f + bw for f, bw in zip(costs.forward_s, costs.backward_s, strict=True)]
        names = [u.name for u in profile.units]
        peers: dict[str, Score | str] = {}
        for name, result in peer_partitions(names, times, list(costs.param_count), p).items():
            peers[name] = result if isinstance(result, str) else score(setting, result)
        full_costs = make_setting(profile, full.micro_batch_size, p, full.num_microbatches).costs
        rows.append(
            QualityRow(
                model,
                p,
                m,
                b,
                lower_bound_s(costs, p, m),
                ours,
                full,
                lower_bound_s(full_costs, p, full.num_microbatches),
                peers,
                plan_s,
            )
        )
    return rows


def _full_desc(plan: Plan) -> str:
    v = f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    rec = sum(s.recompute for s in plan.stages)
    return f"{plan.schedule}{v}, b={plan.micro_batch_size}, M={plan.num_microbatches}" + (
        f", recompute {rec} stages" if rec else ""
    )


def quality_table(rows: list[QualityRow], peer_names: list[str]) -> str:
    """Peer iteration / pipeplan's (boundaries only); best peer vs boundaries and vs the full plan."""
    head = ["model", "P", "b x M", "pipeplan (s)", "/ bound"] + peer_names
    head += ["best peer / pipeplan", "pipeplan full plan (s)", "best peer / full", "full / its bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.model, str(r.num_stages), f"{r.micro_batch_size} x {r.num_microbatches}"]
        cells += [f"{r.ours.iteration_s:.3f}", f"{r.ours.iteration_s / r.lower_bound_s:.3f}"]
        for name in peer_names:
            v = r.peers.get(name)
            if isinstance(v, Score):
                cells.append(f"{v.iteration_s / r.ours.iteration_s:.3f}" if v.fits else "does not fit")
            else:
                cells.append("n/a")
        best = r.best_peer
        full_s = r.full.predicted.iteration_s
        cells.append(f"**{best[1].iteration_s / r.ours.iteration_s:.3f}**" if best else "-")
        cells.append(f"{full_s:.3f} ({_full_desc(r.full)})")
        cells.append(f"**{best[1].iteration_s / full_s:.3f}**" if best else "-")
        cells.append(f"{full_s / r.full_lower_bound_s:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def skipped_notes(rows: list[QualityRow]) -> str:
    """Why a peer shows n/a, once per (peer, reason)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for name, v in r.peers.items():
            if isinstance(v, str):
                seen.setdefault((name, v), []).append(f"{r.model} P={r.num_stages}")
    return "\n".join(f"- {name}: {reason} ({', '.join(where)})" for (name, reason), where in seen.items())


def detail_table(row: QualityRow, profile: Profile) -> str:
    """Units per stage and per-stage compute of every partition in one setting."""
    n = profile.num_units
    lines = ["| partitioner | units per stage | iteration (s) | vs pipeplan |", "|---|---|---|---|"]
    entries: list[tuple[str, Score]] = [("**pipeplan**", row.ours)]
    entries += [(k, v) for k, v in row.peers.items() if isinstance(v, Score)]
    for name, s in entries:
        sizes = ", ".join(map(str, stage_sizes(s.boundaries, n)))
        lines.append(f"| {name} | {sizes} | {s.iteration_s:.3f} | {s.iteration_s / row.ours.iteration_s:.3f} |")
    return "\n".join(lines)


def findings(rows: list[QualityRow]) -> list[str]:
    """Numbers that go the wrong way, stated plainly."""
    out = []
    for r in rows:
        best = r.best_peer
        if best and best[1].iteration_s < r.ours.iteration_s * (1 - 1e-9):
            out.append(
                f"{r.model} P={r.num_stages}: {best[0]} is faster than pipeplan's boundaries "
                f"({best[1].iteration_s:.4f} s vs {r.ours.iteration_s:.4f} s)"
            )
        if best and best[1].iteration_s < r.full.predicted.iteration_s * (1 - 1e-9):
            out.append(
                f"{r.model} P={r.num_stages}: {best[0]} is faster than pipeplan's full plan "
                f"({best[1].iteration_s:.4f} s vs {r.full.predicted.iteration_s:.4f} s)"
            )
        if r.ours.iteration_s < r.lower_bound_s:
            out.append(f"{r.model} P={r.num_stages}: pipeplan's 1F1B iteration is below the bound")
        if r.full.predicted.iteration_s < r.full_lower_bound_s:
            out.append(
                f"{r.model} P={r.num_stages}: the full plan ({_full_desc(r.full)}) is below the bound "
                f"({r.full.predicted.iteration_s / r.full_lower_bound_s:.3f}): the bound assumes one stage per rank"
            )
    return out


def summary(rows: list[QualityRow]) -> dict[str, float]:
    best_ratio = [r.best_peer[1].iteration_s / r.ours.iteration_s for r in rows if r.best_peer]
    full_ratio = [r.best_peer[1].iteration_s / r.full.predicted.iteration_s for r in rows if r.best_peer]
    bound = [r.ours.iteration_s / r.lower_bound_s for r in rows]
    return {
        "cases": len(rows),
        "min_best_peer_over_boundaries": min(best_ratio),
        "median_best_peer_over_boundaries": statistics.median(best_ratio),
        "max_best_peer_over_boundaries": max(best_ratio),
        "min_best_peer_over_full": min(full_ratio),
        "median_best_peer_over_full": statistics.median(full_ratio),
        "max_best_peer_over_full": max(full_ratio),
        "within_5pct_of_bound": sum(x <= 1.05 for x in bound),
        "max_over_bound": max(bound),
        "max_plan_s": max(r.plan_s for r in rows),
    }


def speedup_png(rows: list[QualityRow], path: Path) -> None:
    """Grouped bars per (model, P): speed-up of pipeplan over the best peer and over DeepSpeed's default."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.model.split(' (')[0]}\nP={r.num_stages}" for r in rows]
    series = {
        "vs best peer, boundaries only": [
            (r.best_peer[1].iteration_s / r.ours.iteration_s if r.best_peer else 0) for r in rows
        ],
        "vs best peer, full plan": [
            (r.best_peer[1].iteration_s / r.full.predicted.iteration_s if r.best_peer else 0) for r in rows
        ],
        "vs DeepSpeed default ('parameters'), full plan": [
            _ratio(r.peers.get("DeepSpeed parameters (default)"), r.full.predicted.iteration_s) for r in rows
        ],
    }
    fig, ax = plt.subplots(figsize=(max(8, 0.75 * len(rows)), 4.5))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.15, color="grey", linewidth=0.8, linestyle="--", label="1.15 (issue goal where unbalanced)")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("peer iteration / pipeplan iteration (simulated)")
    ax.set_title("Speed-up of pipeplan over today's partitioners (same profile, cost model and simulator)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratio(peer: Score | str | None, ours_s: float) -> float:
    return peer.iteration_s / ours_s if isinstance(peer, Score) and peer.fits else 0.0


@dataclass(frozen=True)
class MemoryCase:
    model: str
    num_stages: int
    micro_batch_size: int
    num_microbatches: int
    device_memory_bytes: int
    capacity_bytes: float
    unconstrained: Score
    ours: Score
    full: Plan | None
    peers: dict[str, Score | str]


def _min_feasible_memory(fn: object, low: int, high: int) -> int:
    """Smallest device memory (to 1 MiB) at which ``fn(memory)`` does not raise PlanInfeasibleError."""
    step = 2**20
    while high - low > step:
        mid = (low + high) // 2
        try:
            fn(mid)  # type: ignore[operator]
            high = mid
        except PlanInfeasibleError:
            low = mid
    return high


def memory_case(model: str, profile: Profile, num_stages: int) -> MemoryCase:
    """Cap the device memory 2 % above the least that pipeplan's boundaries (1F1B, b, M = 4P) need."""
    b = REFERENCE_MICRO_BATCH if REFERENCE_MICRO_BATCH in profile.micro_batch_sizes else profile.micro_batch_sizes[0]
    m = 4 * num_stages
    base = default_settings(profile, optimizer="adam")
    free = make_setting(profile, b, num_stages, m, settings=base)
    unconstrained = score(free, plan_boundaries(profile, pipeplan_boundaries(profile, free, base)))

    def boundaries_at(memory: int) -> Plan:
        settings = replace(base, device_memory_bytes=(memory,))
        return pipeplan_boundaries(profile, make_setting(profile, b, num_stages, m, settings=settings), settings)

    memory = int(_min_feasible_memory(boundaries_at, 2**20, int(profile.device.memory_bytes)) * 1.02)
    settings = replace(base, device_memory_bytes=(memory,))
    capped = make_setting(profile, b, num_stages, m, settings=settings)
    ours = score(capped, plan_boundaries(profile, boundaries_at(memory)))
    try:
        full = pipeplan_full(profile, num_stages, b * m, settings)
    except PlanInfeasibleError:
        full = None
    costs = capped.costs
    times = [f + bw for f, bw in zip(costs.forward_s, costs.backward_s, strict=True)]
    names = [u.name for u in profile.units]
    peers: dict[str, Score | str] = {}
    for name, result in peer_partitions(names, times, list(costs.param_count), num_stages).items():
        peers[name] = result if isinstance(result, str) else score(capped, result)
    return MemoryCase(
        model, num_stages, b, m, memory, capped.problem.capacity_bytes[0], unconstrained, ours, full, peers
    )


def memory_table(case: MemoryCase, profile: Profile) -> str:
    n = profile.num_units
    cap = case.capacity_bytes
    lines = [
        f"Device memory {case.device_memory_bytes / GIB:.3f} GiB, usable {cap / GIB:.3f} GiB per stage "
        f"(10 % headroom); Adam fp32 (16 B per parameter); 1F1B, b = {case.micro_batch_size}, "
        f"M = {case.num_microbatches}, P = {case.num_stages}.",
        "",
        "| partitioner | units per stage | peak stage memory (GiB) | fits | iteration (s) |",
        "|---|---|---|---|---|",
    ]

    def row(name: str, s: Score) -> str:
        sizes = ", ".join(map(str, stage_sizes(s.boundaries, n)))
        fits = "yes" if s.peak_memory_bytes <= cap else f"**no** (+{(s.peak_memory_bytes - cap) / GIB:.3f} GiB)"
        return f"| {name} | {sizes} | {s.peak_memory_bytes / GIB:.3f} | {fits} | {s.iteration_s:.3f} |"

    lines.append(row("pipeplan, memory-aware boundaries", case.ours))
    lines.append(row("pipeplan without the cap (for reference)", case.unconstrained))
    for name, v in case.peers.items():
        if isinstance(v, Score):
            lines.append(row(name, v))
        else:
            lines.append(f"| {name} | n/a: {v} | | | |")
    if case.full is not None:
        peak = max(s.memory_bytes.peak for s in case.full.stages)
        sizes = ", ".join(str(len(s.units)) for s in case.full.stages)
        lines.append(
            f"| pipeplan full plan ({_full_desc(case.full)}) | {sizes} | {peak / GIB:.3f} | yes | "
            f"{case.full.predicted.iteration_s:.3f} |"
        )
    return "\n".join(lines)
