"""The plan format's checks: a plan JSON is validated against its schema (planner/plan.schema.json) and
then against what the schema cannot say (units in model order, placements torch runs, finite numbers,
a consistent mesh), so that a hand-edited plan fails with one line naming what is wrong.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from planner.errors import PipeplanError, PlanFormatError, shorten
from planner.fileio import check_document
from planner.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_MICROBATCHES, MAX_RANKS, MAX_SECONDS, MAX_UNITS
from planner.schedule.orders import Schedule, check_microbatches, stage_to_rank, virtual_stages
from planner.schedule.pipeline import resume_gaps_valid

__all__ = ["PLAN_FORMAT", "PLAN_VERSION", "validate_plan_dict"]

PLAN_FORMAT = "pipeplan.plan"
PLAN_VERSION = 1


@cache
def _schema() -> dict[str, Any]:
    return json.loads(resources.files("planner").joinpath("plan.schema.json").read_text())


def _schedule(name: str) -> Schedule:
    try:
        return Schedule.parse(name)
    except PipeplanError as exc:
        raise PlanFormatError(f"invalid plan: {exc}") from None


def _fail(message: str) -> PlanFormatError:
    return PlanFormatError(f"invalid plan: {message}")


def _check_units(stages: list[dict[str, Any]], split_points: list[str]) -> None:
    """Stages hold every unit once, in order: no unit twice, no empty name, split points agree."""
    seen: dict[str, int] = {}
    for s in stages:
        for name in s["units"]:
            if not name.strip():
                raise _fail(f"stage {s['index']} has an empty unit name")
            if name in seen:
                where = "twice in stage" if seen[name] == s["index"] else f"in stage {seen[name]} and in stage"
                raise _fail(f"unit {shorten(name)} is {where} {s['index']}: a unit belongs to exactly one stage")
            seen[name] = s["index"]
    expected = [s["units"][0] for s in stages[1:]]
    if split_points != expected:
        raise _fail(
            f"split_points {shorten(str(split_points))} must be the first unit of every stage but the first "
            f"({shorten(str(expected))})"
        )


def _check_placement(data: dict[str, Any], schedule: Schedule) -> None:
    """Ranks and virtual stages as torch places the schedule's stages (orders.stage_to_rank)."""
    n, ranks = data["num_stages"], data["num_ranks"]
    try:
        v = virtual_stages(schedule, n, ranks)
        placement = stage_to_rank(schedule, n, ranks)
        m = data["num_microbatches"]
        check_microbatches(schedule, ranks, v, 1 if schedule is Schedule.NAIVE else m)
    except PipeplanError as exc:
        raise _fail(str(exc)) from None
    if data["virtual_stages"] != v:
        raise _fail(f"virtual_stages is {data['virtual_stages']}, but {n} stages on {ranks} ranks make {v}")
    for s, rank in zip(data["stages"], placement, strict=True):
        if s["rank"] != rank:
            raise _fail(
                f"stage {s['index']} is on rank {s['rank']}, but schedule {schedule.value} places it on rank {rank}"
            )


def _check_numbers(data: dict[str, Any]) -> None:
    n, p = data["num_stages"], data["predicted"]
    for key, value, limit in (
        ("num_stages", n, MAX_UNITS),
        ("num_ranks", data["num_ranks"], MAX_RANKS),
        ("num_microbatches", data["num_microbatches"], MAX_MICROBATCHES),
        ("global_batch_size", data["global_batch_size"], MAX_GLOBAL_BATCH),
    ):
        if value > limit:
            raise _fail(f"{key} is {value}, over pipeplan's limit of {limit:,}")
    if data["micro_batch_size"] * data["num_microbatches"] != data["global_batch_size"]:
        raise _fail(
            f"micro_batch_size x num_microbatches = {data['micro_batch_size']} x {data['num_microbatches']} "
            f"!= global_batch_size {data['global_batch_size']}"
        )
    if p["bottleneck_stage"] >= n:
        raise _fail(f"predicted.bottleneck_stage is {p['bottleneck_stage']}, but stages are 0..{n - 1}")
    times = [(k, s[k]) for k in ("forward_s", "backward_s", "input_s", "weight_s") for s in data["stages"] if k in s]
    for s in data["stages"]:
        if ("input_s" in s) != ("weight_s" in s):
            raise _fail(f"stage {s['index']} has only one of input_s and weight_s: give both or neither")
    times += [(k, p[k]) for k in ("iteration_s", "formula_iteration_s")]
    per_rank = ("busy_s", "step_tail_s", "overhead_s", "comm_wait_s")
    times += [(k, x) for k in (*per_rank, "comm_forward_s", "comm_backward_s") for x in p.get(k, ())]
    times += [("action_overhead_s", p.get("action_overhead_s", 0.0)), ("compute_scale", p.get("compute_scale", 1.0))]
    times += [("resume", v) for point in p.get("resume", ()) for v in point]
    gaps = [point[0] for point in p.get("resume", ())]
    if not resume_gaps_valid(gaps):
        raise _fail(f"predicted.resume: the gaps (first of each point) must be positive and increasing, got {gaps}")
    times += [(f"baselines.{b['name']}", b["iteration_s"]) for b in data["baselines"] if b["iteration_s"] is not None]
    for key, value in times:
        if value > MAX_SECONDS:
            raise _fail(f"{shorten(key)} is {value:.3g} s, over pipeplan's limit of {MAX_SECONDS:.0e} s")
    sizes = [(k, data["num_ranks"]) for k in per_rank] + [("comm_forward_s", n - 1), ("comm_backward_s", n - 1)]
    for group in p.get("tail_groups", ()):
        if any(r >= data["num_ranks"] for r in group):
            raise _fail(f"predicted.tail_groups names rank {max(group)}, but ranks are 0..{data['num_ranks'] - 1}")
    measured = data.get("measured")
    if measured is not None:
        times += [("measured.iteration_s", measured["iteration_s"])]
        times += [(f"measured.{k}", x) for k in ("forward_s", "backward_s") for x in measured[k]]
        if len(measured["forward_s"]) != n or len(measured["backward_s"]) != n:
            raise _fail(f"measured.forward_s and measured.backward_s need one value per stage ({n})")
    for key, size in sizes:
        values = p.get(key, [])
        if values and len(values) != size:
            raise _fail(f"predicted.{key} has {len(values)} values, expected {size} (or none)")
    for s in data["stages"]:
        if s["in_flight"] > data["num_microbatches"]:
            raise _fail(f"stage {s['index']} holds {s['in_flight']} micro-batches in flight, more than the plan runs")


def _check_baselines(data: dict[str, Any]) -> None:
    order = {name: i for i, name in enumerate(u for s in data["stages"] for u in s["units"])}
    for b in data["baselines"]:
        positions = [order.get(name, -1) for name in b["split_points"]]
        if -1 in positions or positions != sorted(set(positions)) or 0 in positions:
            raise _fail(
                f"baseline {shorten(b['name'])}: split_points {shorten(str(b['split_points']))} must be units "
                "of the plan, after the first, in order, each once"
            )


def _check_mesh(data: dict[str, Any]) -> None:
    mesh = data["mesh"]
    pp, dp, devices = mesh["pp"], mesh["dp"], mesh["devices"]
    if pp != data["num_ranks"]:
        raise _fail(f"mesh.pp is {pp}, but the plan's pipeline has {data['num_ranks']} ranks")
    if len(devices) != dp or any(len(row) != pp for row in devices):
        raise _fail(f"mesh.devices must be {dp} replicas x {pp} pipeline ranks")
    tp = mesh.get("tp", 1)
    used = sorted(d + t for row in devices for d in row for t in range(tp))
    if used != list(range(pp * dp * tp)):
        groups = f" in groups of tp {tp} consecutive devices" if tp > 1 else ""
        raise _fail(f"mesh.devices must hold the devices 0..{pp * dp * tp - 1} once each{groups}")
    if pp * dp * tp > mesh["num_devices"]:
        raise _fail(f"the mesh uses {pp * dp * tp} devices, more than the {mesh['num_devices']} offered")
    if mesh["num_devices"] > MAX_DEVICES:
        raise _fail(f"mesh.num_devices is {mesh['num_devices']}, over pipeplan's limit of {MAX_DEVICES:,}")
    if mesh["global_batch_size"] != dp * data["global_batch_size"]:
        raise _fail(
            f"mesh.global_batch_size {mesh['global_batch_size']} != dp {dp} x the replica's global_batch_size "
            f"{data['global_batch_size']}"
        )


def validate_plan_dict(data: Any) -> Schedule:
    """The JSON Schema (shape), then the meaning: what every reader of a plan relies on."""
    check_document(data, _schema(), error=PlanFormatError, kind="plan", fmt=PLAN_FORMAT, version=PLAN_VERSION)
    stages = data["stages"]
    if len(stages) != data["num_stages"]:
        raise _fail(f"num_stages is {data['num_stages']} but {len(stages)} stages are listed")
    if [s["index"] for s in stages] != list(range(len(stages))):
        raise _fail("stage indices must be 0..num_stages-1 in order")
    schedule = _schedule(data["schedule"])
    _check_numbers(data)
    _check_units(stages, data["split_points"])
    _check_placement(data, schedule)
    _check_baselines(data)
    if "mesh" in data:
        _check_mesh(data)
    return schedule
