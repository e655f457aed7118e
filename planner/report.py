"""A plan as a table for people: stages, units, time, memory with its breakdown, baselines."""

from __future__ import annotations

from planner.plan import Plan
from planner.table import format_table, human_bytes, human_seconds

__all__ = ["format_plan"]


def _unit_span(units: tuple[str, ...]) -> str:
    return units[0] if len(units) == 1 else f"{units[0]} .. {units[-1]} ({len(units)})"


def format_plan(plan: Plan) -> str:
    p = plan.predicted
    rows = []
    for s in plan.stages:
        m = s.memory_bytes
        rows.append(
            [
                s.index,
                s.rank,
                _unit_span(s.units),
                "yes" if s.recompute else "no",
                human_seconds(s.forward_s),
                human_seconds(s.backward_s),
                human_bytes(s.send_bytes),
                s.in_flight,
                human_bytes(m.params + m.grads + m.optimizer),
                human_bytes(m.activations),
                human_bytes(m.peak),
                "<- bottleneck" if s.index == p.bottleneck_stage else "",
            ]
        )
    table = format_table(
        [
            "stage",
            "rank",
            "units",
            "recompute",
            "fwd/mb",
            "bwd/mb",
            "send/mb",
            "in-flight",
            "params+grads+opt",
            "activations",
            "peak mem",
            "",
        ],
        rows,
        align=">><<>>>>>>><",
    )
    capacity = plan.constraints.get("capacity_bytes") or []
    head = (
        f"plan for {plan.model_name}: {plan.num_ranks} ranks, {plan.num_stages} stages, schedule {plan.schedule}"
        + (f" (v={plan.virtual_stages})" if plan.virtual_stages > 1 else "")
        + f", micro-batch {plan.micro_batch_size} x {plan.num_microbatches} = {plan.global_batch_size}"
    )
    lines = [head, table, ""]
    lines.append(
        f"predicted iteration {human_seconds(p.iteration_s)} (simulated; solver objective "
        f"{human_seconds(p.formula_iteration_s)}), bubble {p.bubble_fraction:.1%}, {p.samples_per_s:.3g} samples/s"
    )
    if capacity:
        lines.append(f"usable memory per rank {human_bytes(min(capacity))} (device less headroom)")
    optimal = "optimal" if plan.solver.optimal else "NOT proven optimal"
    lines.append(
        f"solver {plan.solver.name} ({optimal} for its objective), {plan.solver.candidates} candidates simulated"
    )
    if plan.baselines:
        lines.append("")
        baseline_rows = []
        for b in plan.baselines:
            if b.iteration_s is None:
                baseline_rows.append([b.name, "does not fit", human_bytes(b.peak_memory_bytes), "-"])
            else:
                speedup = b.iteration_s / p.iteration_s
                baseline_rows.append(
                    [b.name, human_seconds(b.iteration_s), human_bytes(b.peak_memory_bytes), f"{speedup:.2f}x"]
                )
        lines.append(
            format_table(
                ["baseline (one stage per rank, same micro-batches)", "iteration", "peak mem", "pipeplan speed-up"],
                baseline_rows,
                align="<>>>",
            )
        )
    return "\n".join(lines)
