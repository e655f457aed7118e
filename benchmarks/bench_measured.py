"""Plan quality, measured (issue 6, item 2; issue 5's Measure): P = 2 gloo ranks on this CPU.

pipeplan's plan, the uniform baseline and the best peer (by simulation) are each run by
``planner.runtime.verify.verify_plan(..., VerifyOptions(mode="processes"))`` in the same run, in rounds whose order
rotates (interleaved runs), so that a change of machine load hits every plan alike. Every plan is
a real :class:`~planner.plan.Plan` made by ``make_plan``: a peer's boundaries are imposed by pinning
the first and last unit of each stage (the ILP honours pins), with the peer's schedule (1F1B),
micro-batch size and no recomputation, so its prediction comes from the same code as pipeplan's.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_quality import pipeplan_boundaries, pipeplan_full, plan_boundaries  # noqa: E402
from common import make_setting, score  # noqa: E402
from peers import peer_partitions  # noqa: E402

from planner.cost import default_settings  # noqa: E402
from planner.errors import PipeplanError  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.runtime.run_options import VerifyOptions  # noqa: E402
from planner.runtime.verify import verify_plan  # noqa: E402
from planner.search import make_plan  # noqa: E402
from profiles.format import Profile  # noqa: E402

__all__ = ["MeasuredPlan", "forced_plan", "choose_plans", "measure", "measured_table", "other_profiles_table"]


@dataclass
class MeasuredPlan:
    name: str
    plan: Plan
    runs_s: list[float] = field(default_factory=list)
    """Measured iteration of each verify run (each the median of its timed steps)."""
    stage_errors_pct: list[list[float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """One line per verify run that raised (the run is then left out of the median)."""

    @property
    def measured_s(self) -> float:
        return statistics.median(self.runs_s) if self.runs_s else math.nan

    @property
    def error_pct(self) -> float:
        return (self.measured_s - self.plan.predicted.iteration_s) / self.plan.predicted.iteration_s * 100


def forced_plan(profile: Profile, boundaries: tuple[int, ...], micro_batch_size: int, global_batch: int) -> Plan:
    """A plan with exactly these boundaries (1F1B, no recomputation), through make_plan's ILP with pins."""
    names = [u.name for u in profile.units]
    pins: list[tuple[str, int]] = []
    for s, first in enumerate(boundaries):
        pins.append((names[first], s))
        if s > 0:
            pins.append((names[first - 1], s - 1))
    request = PlanRequest(
        num_ranks=len(boundaries),
        global_batch_size=global_batch,
        schedule="1f1b",
        micro_batch_size=micro_batch_size,
        recompute="off",
        solver="ilp",
        pinned=tuple(pins),
        settings=default_settings(profile),
    )
    plan = make_plan(profile, request, sha256="benchmark")
    if plan_boundaries(profile, plan) != tuple(boundaries):
        raise RuntimeError(f"pins did not force {boundaries}: got {plan_boundaries(profile, plan)}")
    return plan


def choose_plans(profile: Profile, micro_batch_size: int, num_microbatches: int) -> list[MeasuredPlan]:
    """pipeplan's full plan (and its boundaries-only plan where different), uniform layers, the best other peer."""
    p, b, m = 2, micro_batch_size, num_microbatches
    setting = make_setting(profile, b, p, m)
    costs = setting.costs
    times = [f + bw for f, bw in zip(costs.forward_s, costs.backward_s, strict=True)]
    names = [u.name for u in profile.units]
    peers = {k: v for k, v in peer_partitions(names, times, list(costs.param_count), p).items() if isinstance(v, tuple)}
    chosen = [MeasuredPlan("pipeplan (full plan)", pipeplan_full(profile, p, b * m))]
    ours = pipeplan_boundaries(profile, setting)
    key = (ours.schedule, ours.micro_batch_size, ours.split_points)
    if key != (chosen[0].plan.schedule, chosen[0].plan.micro_batch_size, chosen[0].plan.split_points):
        chosen.append(MeasuredPlan(f"pipeplan (boundaries only: 1F1B, b={b})", ours))
    uniform = peers.get("Megatron uniform layers") or peers["DeepSpeed uniform"]
    uniform_name = "uniform layers (Megatron/torchtitan)" if "Megatron uniform layers" in peers else "DeepSpeed uniform"
    ranked = sorted(peers.items(), key=lambda kv: score(setting, kv[1]).iteration_s)
    best_name, best = next(((k, v) for k, v in ranked if v != uniform), ranked[0])
    chosen.append(MeasuredPlan(uniform_name, forced_plan(profile, uniform, b, b * m)))
    if best != uniform:
        same = [k for k, v in peers.items() if v == best]
        name = f"best peer: {' = '.join(same)}"
        if best == plan_boundaries(profile, chosen[-1].plan) or best == plan_boundaries(profile, chosen[0].plan):
            name += " (pipeplan's boundaries too: a control for run-to-run noise)"
        chosen.append(MeasuredPlan(name, forced_plan(profile, best, b, b * m)))
    return chosen


def measure(
    plans: list[MeasuredPlan], model: str, *, rounds: int, steps: int, warmup: int, log: bool = True
) -> list[MeasuredPlan]:
    """Run every plan ``rounds`` times, rotating the order each round."""
    for r in range(rounds):
        order = plans[r % len(plans) :] + plans[: r % len(plans)]
        for mp in order:
            start = time.perf_counter()
            try:
                report = verify_plan(
                    mp.plan,
                    model,
                    VerifyOptions(steps=steps, warmup=warmup, mode="processes", timeout_s=900, tolerance=0.25),
                )
            except PipeplanError as exc:
                mp.failures.append(str(exc).splitlines()[0])
                print(f"  round {r + 1}: {mp.name}: FAILED: {mp.failures[-1]}", flush=True)
                continue
            mp.runs_s.append(report.measured_iteration_s)
            mp.stage_errors_pct.append([s.error_pct for s in report.stages])
            if log:
                print(
                    f"  round {r + 1}: {mp.name}: measured {report.measured_iteration_s:.3f} s, predicted "
                    f"{mp.plan.predicted.iteration_s:.3f} s ({time.perf_counter() - start:.0f} s wall, "
                    f"load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    return plans


def measured_table(plans: list[MeasuredPlan], profile: Profile) -> str:
    ours = plans[0]
    lines = [
        "| plan | units per stage | schedule, b x M | predicted (s) | measured, median (s) | runs (s) "
        "| prediction error | stage errors (median) | measured / pipeplan | predicted / pipeplan |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mp in plans:
        sizes = ", ".join(str(len(s.units)) for s in mp.plan.stages)
        if not mp.runs_s:
            lines.append(
                f"| {mp.name} | {sizes} | {mp.plan.schedule} | {mp.plan.predicted.iteration_s:.3f} "
                f"| failed: {'; '.join(mp.failures)} | | | | | |"
            )
            continue
        runs = ", ".join(f"{x:.2f}" for x in mp.runs_s)
        stage_err = ", ".join(
            f"{statistics.median(e[k] for e in mp.stage_errors_pct):+.0f} %" for k in range(len(mp.plan.stages))
        )
        sched = f"{mp.plan.schedule}, {mp.plan.micro_batch_size} x {mp.plan.num_microbatches}"
        lines.append(
            f"| {mp.name} | {sizes} | {sched} | {mp.plan.predicted.iteration_s:.3f} | {mp.measured_s:.3f} | {runs} "
            f"| {mp.error_pct:+.1f} % | {stage_err} | {mp.measured_s / ours.measured_s:.3f} "
            f"| {mp.plan.predicted.iteration_s / ours.plan.predicted.iteration_s:.3f} |"
        )
    for mp in plans:
        if mp.failures:
            split = ", ".join(mp.plan.split_points)
            lines.append("")
            lines.append(
                f"{mp.name} ({mp.plan.schedule}, v={mp.plan.virtual_stages}, splits at {split}) failed "
                f"{len(mp.failures)} run(s): {mp.failures[0]}"
            )
    return "\n".join(lines)


def other_profiles_table(plans: list[MeasuredPlan], profiles: list[tuple[str, Profile]]) -> str:
    """The same plans predicted from other profiles of the model: how much of the error is the profile's."""
    head = ["plan", "measured (s)"] + [f"predicted from {name} (error)" for name, _ in profiles]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mp in plans:
        cells = [mp.name, f"{mp.measured_s:.3f}"]
        for _, profile in profiles:
            if mp.plan.virtual_stages != 1:
                cells.append("-")
                continue
            setting = make_setting(
                profile,
                mp.plan.micro_batch_size,
                mp.plan.num_stages,
                mp.plan.num_microbatches,
                schedule=mp.plan.schedule,
            )
            recompute = tuple(s.recompute for s in mp.plan.stages)
            predicted = score(setting, plan_boundaries(profile, mp.plan), recompute).iteration_s
            cells.append(f"{predicted:.3f} ({(mp.measured_s - predicted) / predicted * 100:+.1f} %)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
