"""A plan as a table for people: stages, units, time, memory with its breakdown, baselines."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from planner.formatting import format_table, human_bytes, human_seconds
from planner.plan import Plan
from planner.tensor_parallel import planned_switches

if TYPE_CHECKING:
    from planner.cluster import ClusterResult

__all__ = ["format_plan", "format_cluster", "plan_notes"]


def _unit_span(units: tuple[str, ...]) -> str:
    return units[0] if len(units) == 1 else f"{units[0]} .. {units[-1]} ({len(units)})"


def format_plan(plan: Plan) -> str:
    """The plan as people read it: a head line, the stage table, the mesh, the prediction and its terms, the
    solver, notes, and the baselines it beats."""
    lines = [_head_line(plan), _stage_table(plan), ""]
    if plan.mesh is not None:
        lines += _mesh_lines(plan)
    p = plan.predicted
    lines.append(
        f"predicted iteration {human_seconds(p.iteration_s)}, bubble {p.bubble_fraction:.1%}, "
        f"{p.samples_per_s:.3g} samples/s: the schedule simulated action by action (what verify checks)"
    )
    lines.append(_runtime_terms_line(plan))
    capacity = plan.constraints.get("capacity_bytes") or []
    if capacity:
        lines.append(f"usable memory per rank {human_bytes(min(capacity))} (its memory less headroom)")
    proven = "optimal" if plan.solver.optimal else "NOT proven optimal"
    count = plan.solver.candidates
    lines.append(
        f"solver {plan.solver.name}: boundaries {proven} for its objective, a bound without the schedule's order "
        f"({human_seconds(p.formula_iteration_s)}); the simulator ranked {count} candidate"
        + ("s" if count != 1 else "")
        + " (micro-batching x schedule x best partitions)"
    )
    lines += [f"note: {note}" for note in plan_notes(plan)]
    if plan.baselines:
        lines += ["", _baseline_table(plan)]
    return "\n".join(lines)


def _head_line(plan: Plan) -> str:
    """Model, ranks, stages, schedule and batching in one line."""
    return (
        f"plan for {plan.model_name}: {plan.num_ranks} ranks, {plan.num_stages} stages, schedule {plan.schedule}"
        + (f" (v={plan.virtual_stages})" if plan.virtual_stages > 1 else "")
        + f", micro-batch {plan.micro_batch_size} x {plan.num_microbatches} = {plan.global_batch_size}"
    )


def _stage_table(plan: Plan) -> str:
    """One row per stage: its rank, units, recomputation, times, sends, in-flight micro-batches and memory."""
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
                "<- bottleneck" if s.index == plan.predicted.bottleneck_stage else "",
            ]
        )
    header = ["stage", "rank", "units", "recompute", "fwd/mb", "bwd/mb", "send/mb", "in-flight"]
    header += ["params+grads+opt", "activations", "peak mem", ""]
    return format_table(header, rows, align=">><<>>>>>>><")


def _mesh_lines(plan: Plan) -> list[str]:
    """A cluster plan's mesh: the tensor-parallel layout, each degree's best step, and the devices used."""
    m = plan.mesh
    assert m is not None  # only called for cluster plans
    lines = []
    degrees = f"pp {m.pp} x dp {m.dp}" if m.tp == 1 else f"pp {m.pp} x tp {m.tp} x dp {m.dp}"
    if m.tp > 1:
        sequence, vocab = planned_switches(plan.constraints)
        if not (sequence or vocab):
            layout = "pipeplan's runtime layout (blocks split; embeddings, head and sequence whole)"
        else:
            layout = (
                "embedding and head split by vocabulary" if vocab else "embeddings and head whole"
            ) + f", sequence parallelism {'on' if sequence else 'off'} (Megatron's layout, for export)"
        lines.append(
            f"tensor parallelism: each pipeline rank is a group of {m.tp} consecutive devices in one node"
            f"; the table's times and memory are one device's share; {layout}"
        )
    steps = plan.constraints.get("tensor_parallel_best_s")
    if isinstance(steps, dict) and steps:
        lines.append(degree_steps_line({int(t): v for t, v in steps.items()}, m.tp))
    shards = plan.constraints.get("shard_best_s")
    if isinstance(shards, dict) and shards:
        lines.append(best_steps_line("sharding of the replicas", dict(shards), m.shard, str))
    lines.append(
        f"mesh: {degrees} = {m.used_devices} of {m.num_devices} devices ({m.placement}, shard "
        f"{m.shard}); each replica runs the table's {plan.global_batch_size} of the step's {m.global_batch_size} "
        "samples; step tail = gradient sync over the replicas"
        + (f" (as {collectives} runs it)" if (collectives := plan.constraints.get("collectives")) else "")
        + (" + optimizer" if plan.predicted.calibration != "none" else "")
        + ": "
        + ", ".join(human_seconds(t) for t in plan.predicted.runtime.step_tail_s)
    )
    return lines


def _runtime_terms_line(plan: Plan) -> str:
    """What the runtime adds in the prediction, from which calibration (or none: the textbook model)."""
    p = plan.predicted
    if p.calibration == "none":
        return "runtime terms: none (the textbook model: compute and links only)"
    return (
        f"runtime terms from calibration {p.calibration}: {human_seconds(p.runtime.action_overhead_s)} per action, "
        f"compute x {p.runtime.compute_scale:.2f} beside the other ranks (co-location"
        + (
            f", learned while the model's units ran {plan.learned_together_ratio:.2f}x slower together than alone"
            if plan.learned_together_ratio
            else ""
        )
        + "), "
        + (
            f"{p.runtime.transfer_compute_s_per_byte * 1e9:.2f} ns of compute per byte sent or received, "
            if p.runtime.transfer_compute_s_per_byte
            else ""
        )
        + "step tail "
        + ", ".join(human_seconds(t) for t in p.runtime.step_tail_s)
    )


def _baseline_table(plan: Plan) -> str:
    """Each baseline's iteration and peak memory, and how much faster the plan is."""
    rows = []
    for b in plan.baselines:
        if b.iteration_s is None:
            rows.append([b.name, "does not fit", human_bytes(b.peak_memory_bytes), "-"])
        else:
            speedup = b.iteration_s / plan.predicted.iteration_s
            rows.append([b.name, human_seconds(b.iteration_s), human_bytes(b.peak_memory_bytes), f"{speedup:.2f}x"])
    return format_table(
        ["baseline (one stage per rank, same micro-batches)", "iteration", "peak mem", "pipeplan speed-up"],
        rows,
        align="<>>>",
    )


def plan_notes(plan: Plan) -> list[str]:
    """What a user should know about a plan before running it."""
    notes = []
    if plan.num_microbatches < plan.num_ranks and plan.num_ranks > 1:
        notes.append(
            f"{plan.num_microbatches} micro-batches for {plan.num_ranks} ranks: every rank waits through most of the "
            f"step (bubble {plan.predicted.bubble_fraction:.0%}); pipelines want at least as many micro-batches as "
            f"ranks: a --global-batch of {plan.num_ranks * plan.micro_batch_size} or more, or fewer --ranks"
        )
    return notes


def format_cluster(result: ClusterResult, *, top: int = 8) -> str:
    """The layouts the cluster search simulated, fastest first, and what it chose (with tensor parallelism
    searched, :func:`format_plan` prints the best step of each degree: why this one)."""
    simulated = sorted((t for t in result.tried if t[1] is not None), key=lambda t: t[1])
    best = simulated[0][1] if simulated else None
    with_tp = any(layout.tp > 1 for layout, _, _ in result.tried)
    with_shards = len({layout.shard for layout, _, _ in result.tried}) > 1
    rows = [
        [
            layout.degrees,
            layout.used_devices,
            layout.placement,
            *([layout.shard] if with_shards else []),
            human_seconds(step),
            f"{step / best:.2f}x",
        ]
        for layout, step, _ in simulated[:top]
    ]
    header = "pp x tp x dp" if with_tp else "pp x dp"
    shard = ["shard"] if with_shards else []
    table = format_table(
        [header, "devices", "placement", *shard, "step", "vs best"], rows, align=">><" + "<" * len(shard) + ">>"
    )
    pruned = sum(1 for t in result.tried if t[1] is None and t[2].startswith("pruned"))
    failed = len(result.tried) - len(simulated) - pruned
    mesh = result.plan.mesh
    lines = [
        f"cluster search: {len(result.tried)} layouts, {len(simulated)} simulated, {pruned} pruned by a lower "
        f"bound, {failed} without a plan (memory or batch)",
        table,
    ]
    if mesh is not None and mesh.used_devices < mesh.num_devices:
        lines.append(
            f"uses {mesh.used_devices} of {mesh.num_devices} devices: no layout with more was faster "
            "(or the global batch does not split into more replicas)"
        )
    return "\n".join(lines)


def degree_steps_line(steps: dict[int, float | str], chosen: int) -> str:
    """``best step per tensor-parallel degree: tp 4: 314 ms (chosen); tp 2: 350 ms (1.11x); tp 1: why none``."""
    return best_steps_line("tensor-parallel degree", steps, chosen, lambda tp: f"tp {tp}")


def best_steps_line(what: str, steps: dict[Any, float | str], chosen: Any, name: Callable[[Any], str]) -> str:
    """``best step per WHAT: NAME: 314 ms (chosen); NAME: 350 ms (1.11x); NAME: why none``, the chosen first."""
    best = steps.get(chosen)
    parts = []
    for value in sorted(steps, key=lambda v: (v != chosen, v)):
        step = steps[value]
        if isinstance(step, str):
            parts.append(f"{name(value)}: {step}")
        elif value == chosen:
            parts.append(f"{name(value)}: {human_seconds(step)} (chosen)")
        else:
            ratio = f" ({step / best:.2f}x)" if isinstance(best, float) and best > 0 else ""
            parts.append(f"{name(value)}: {human_seconds(step)}{ratio}")
    return f"best step per {what}: " + "; ".join(parts)
