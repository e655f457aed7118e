"""The plan data model (format ``pipeplan.plan``, version 1) and its JSON round-trip.

A plan says how to run one model as a pipeline: which units each stage holds, on which rank,
with which schedule, micro-batch size and count, and whether each stage recomputes its
activations. Units carry their units: ``_s`` seconds, ``_bytes`` bytes. See docs/plan-format.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import PipeplanError, PlanFormatError, shorten
from planner.fileio import check_document, load_document, write_json_atomic
from planner.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_MICROBATCHES, MAX_RANKS, MAX_SECONDS, MAX_UNITS
from planner.schedule.orders import Schedule, check_microbatches, stage_to_rank, virtual_stages
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, SimulationResult, resume_gaps_valid

__all__ = [
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "MemoryBreakdown",
    "StagePlan",
    "Prediction",
    "Measurement",
    "SolverInfo",
    "BaselinePlan",
    "Mesh",
    "SHARDING",
    "PLACEMENTS",
    "Plan",
    "load_plan",
    "save_plan",
    "plan_from_dict",
]

PLAN_FORMAT = "pipeplan.plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class MemoryBreakdown:
    params: int
    """Weights of the stage's units."""
    grads: int
    optimizer: int
    activations: int
    """Saved activations of the micro-batches in flight (or stage inputs under recomputation)."""
    transient: int
    """Working memory of the largest unit's forward+backward."""
    peak: int
    """Sum of the above: what the stage needs at its peak."""


@dataclass(frozen=True)
class StagePlan:
    index: int
    rank: int
    units: tuple[str, ...]
    recompute: bool
    forward_s: float
    """Forward time of one micro-batch."""
    backward_s: float
    """Backward time of one micro-batch, including the re-run forward under recomputation."""
    send_bytes: int
    """Bytes sent to the next stage per micro-batch (0 for the last stage)."""
    in_flight: int
    """Micro-batches whose activations this stage holds at its peak, under the plan's schedule."""
    memory_bytes: MemoryBreakdown
    input_s: float | None = None
    """Split-backward schedules (zero-bubble, zbv, dualpipev) with a measured split: the input-gradient
    action I of one micro-batch. None (absent in the file): the backward is not split."""
    weight_s: float | None = None
    """The weight-gradient action W, as above; both or neither."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("input_s", "weight_s"):  # optional: absent rather than null, as in plans made before
            if data[key] is None:
                del data[key]
        return data


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    """Simulated time of one training iteration (all micro-batches, forward and backward)."""
    formula_iteration_s: float
    """The solver's declared objective for the same plan (docs/cost-model.md)."""
    bubble_fraction: float
    samples_per_s: float
    bottleneck_stage: int
    busy_s: tuple[float, ...] = ()
    """Per rank: time spent computing in one iteration."""
    comm_forward_s: tuple[float, ...] = ()
    """Per cut between stage k and k+1: time to send one micro-batch's activations (the simulator's input)."""
    comm_backward_s: tuple[float, ...] = ()
    """Per cut: time to send their gradients back."""
    calibration: str = "none"
    """Where the runtime terms below came from: ``none`` (textbook model), ``shipped``, or a calibration file."""
    action_overhead_s: float = 0.0
    """Runtime overhead added to every compute action (the schedule's, from the calibration)."""
    compute_scale: float = 1.0
    """Co-location factor applied to the profiled compute."""
    step_tail_s: tuple[float, ...] = ()
    """Per rank: tied-gradient sum + optimizer step + zero_grad after the last action."""
    overhead_s: tuple[float, ...] = ()
    """Per rank: total runtime overhead of its actions in one iteration."""
    comm_wait_s: tuple[float, ...] = ()
    """Per rank: time waiting on the link in one iteration."""
    tail_groups: tuple[tuple[int, ...], ...] = ()
    """Pairs of ranks whose step tails start together: a weight tied across them has its gradient summed first."""
    resume: tuple[tuple[float, float, float], ...] = ()
    """``(idle gap, forward extra, backward extra)``: what an action costs more after its rank waited
    (the profile's ``resume`` at the plan's micro-batch size; empty: nothing added)."""

    def runtime_terms(self) -> RuntimeTerms:
        """The runtime terms this prediction was simulated with (so ``simulate PLAN`` reproduces it)."""
        return RuntimeTerms(self.action_overhead_s, self.step_tail_s, self.compute_scale, self.tail_groups, self.resume)


@dataclass(frozen=True)
class Measurement:
    """What a real run of the plan measured (written by ``pipeplan tune``)."""

    mode: str
    """``processes`` or ``replay``."""
    iteration_s: float
    """Median over timed steps, optimizer step included."""
    forward_s: tuple[float, ...]
    """Per stage: median forward of one micro-batch."""
    backward_s: tuple[float, ...]
    steps: int
    error_pct: float
    """(measured - predicted) / predicted of the iteration, in percent, against this plan's prediction."""
    speed_factor: float | None = None
    """How many times slower the speed reference ran during the run than while profiling (information; the
    times above are as measured). None: not measured."""


@dataclass(frozen=True)
class SolverInfo:
    name: str
    objective: str
    optimal: bool
    solve_s: float | None = None
    """Wall time of the whole search; null unless recorded (keeps plan files byte-identical)."""
    gap: float | None = 0.0
    candidates: int = 0
    """How many (micro-batch size, schedule, recompute) candidates were solved and simulated."""


@dataclass(frozen=True)
class BaselinePlan:
    name: str
    split_points: tuple[str, ...]
    iteration_s: float | None
    """Simulated under the plan's schedule and micro-batching; null when the partition does not fit in memory."""
    fits: bool = True
    peak_memory_bytes: int = 0


SHARDING = ("none", "optimizer", "full")
"""``none``: DDP (every replica keeps everything); ``optimizer``: ZeRO-1 (optimizer state split over the
replicas); ``full``: FSDP / ZeRO-3 (weights, gradients and optimizer state split, weights gathered per use)."""

PLACEMENTS = ("pipeline-in-node", "replicas-in-node")
"""Where a cluster plan's devices go: a replica's pipeline ranks on consecutive devices (pipeline hops stay
inside a node as far as they can), or a stage's replicas on consecutive devices (gradient rings do)."""


@dataclass(frozen=True)
class Mesh:
    """A cluster plan's layout: ``pp`` pipeline ranks x ``dp`` data-parallel replicas (docs/plan-format.md)."""

    pp: int
    dp: int
    placement: str
    """One of :data:`PLACEMENTS`."""
    shard: str
    """One of :data:`SHARDING`."""
    num_devices: int
    """Devices offered (``--devices``); ``pp * dp`` of them are used."""
    devices_per_node: int
    global_batch_size: int
    """Samples per step over all replicas: ``dp`` x the plan's (one replica's) ``global_batch_size``."""
    devices: tuple[tuple[int, ...], ...]
    """``devices[replica][pipeline rank]``: the global rank (device) that runs it."""
    hop_bytes_per_s: float
    """The slowest pipeline hop's link, used for every hop."""
    hop_latency_s: float
    ring_bytes_per_s: float
    """The slowest link of any stage's ring of replicas."""
    ring_latency_s: float

    @property
    def used_devices(self) -> int:
        return self.pp * self.dp

    def coordinates(self, device: int) -> tuple[int, int]:
        """``(replica, pipeline rank)`` of a global rank."""
        for replica, row in enumerate(self.devices):
            if device in row:
                return replica, row.index(device)
        raise PlanFormatError(f"device {device} is not in the plan's mesh (devices 0..{self.used_devices - 1})")


@dataclass(frozen=True)
class Plan:
    model_name: str
    model_fingerprint: str
    profile_sha256: str
    num_stages: int
    num_ranks: int
    schedule: Schedule
    virtual_stages: int
    micro_batch_size: int
    num_microbatches: int
    global_batch_size: int
    stages: tuple[StagePlan, ...]
    split_points: tuple[str, ...]
    predicted: Prediction
    solver: SolverInfo
    constraints: dict[str, Any] = field(default_factory=dict, hash=False)
    baselines: tuple[BaselinePlan, ...] = ()
    device: dict[str, Any] = field(default_factory=dict, hash=False)
    measured: Measurement | None = None
    mesh: Mesh | None = None
    """Cluster plans: the pp x dp mesh; None: one pipeline of ``num_ranks`` ranks."""

    def stages_of_rank(self, rank: int) -> tuple[StagePlan, ...]:
        return tuple(s for s in self.stages if s.rank == rank)

    @property
    def profile_threads(self) -> int | None:
        """CPU intra-op threads the plan's profile was timed with (``device.threads``); None if not recorded."""
        threads = self.device.get("threads")
        return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None

    @property
    def profile_reference_s(self) -> float | None:
        """The speed reference's time while the profile was made (``device.reference_s``); None if absent."""
        value = self.device.get("reference_s")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        return float(value) if ok else None

    def pipeline(self, runtime: RuntimeTerms | None = None) -> Pipeline:
        """The plan's stages, links and runtime terms as the simulator takes them (``runtime`` default: the
        terms it was predicted with)."""
        split = all(s.input_s is not None and s.weight_s is not None for s in self.stages)
        return Pipeline(
            schedule=self.schedule,
            num_ranks=self.num_ranks,
            num_microbatches=self.num_microbatches,
            forward_s=tuple(s.forward_s for s in self.stages),
            backward_s=tuple(s.backward_s for s in self.stages),
            input_s=tuple(s.input_s or 0.0 for s in self.stages) if split else (),
            weight_s=tuple(s.weight_s or 0.0 for s in self.stages) if split else (),
            comm_forward_s=self.predicted.comm_forward_s,
            comm_backward_s=self.predicted.comm_backward_s,
            runtime=self.predicted.runtime_terms() if runtime is None else runtime,
        )

    def simulation(self, runtime: RuntimeTerms | None = None, *, speed: float = 1.0) -> SimulationResult:
        """The plan's pipeline simulated under ``runtime`` (default: the terms it was predicted with).

        ``speed`` multiplies the stage times: the stages on a machine running ``speed`` times slower than
        when profiled (with ``runtime.at_speed(speed)`` for the runtime's own compute as well).
        """
        return self.pipeline(runtime).at_speed(speed).simulate()

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "model": {"name": self.model_name, "fingerprint": self.model_fingerprint},
            "profile_sha256": self.profile_sha256,
            "device": self.device,
            "num_stages": self.num_stages,
            "num_ranks": self.num_ranks,
            "schedule": self.schedule.value,
            "virtual_stages": self.virtual_stages,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "global_batch_size": self.global_batch_size,
            "stages": [s.to_dict() for s in self.stages],
            "split_points": list(self.split_points),
            "predicted": _prediction_dict(self.predicted),
            "solver": asdict(self.solver),
            "constraints": self.constraints,
            "baselines": [asdict(b) for b in self.baselines],
            **({"mesh": _mesh_dict(self.mesh)} if self.mesh is not None else {}),
            **({"measured": _measurement_dict(self.measured)} if self.measured is not None else {}),
        }


def _prediction_dict(predicted: Prediction) -> dict[str, Any]:
    data = asdict(predicted)
    if not data["resume"]:  # optional: absent, as in plans made before it
        del data["resume"]
    else:
        data["resume"] = [list(point) for point in data["resume"]]
    return data


def _mesh_dict(mesh: Mesh) -> dict[str, Any]:
    data = asdict(mesh)
    data["devices"] = [list(row) for row in mesh.devices]
    return data


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
    used = sorted(d for row in devices for d in row)
    if used != list(range(pp * dp)):
        raise _fail(f"mesh.devices must hold the devices 0..{pp * dp - 1} once each")
    if pp * dp > mesh["num_devices"]:
        raise _fail(f"the mesh uses {pp * dp} devices, more than the {mesh['num_devices']} offered")
    if mesh["num_devices"] > MAX_DEVICES:
        raise _fail(f"mesh.num_devices is {mesh['num_devices']}, over pipeplan's limit of {MAX_DEVICES:,}")
    if mesh["global_batch_size"] != dp * data["global_batch_size"]:
        raise _fail(
            f"mesh.global_batch_size {mesh['global_batch_size']} != dp {dp} x the replica's global_batch_size "
            f"{data['global_batch_size']}"
        )


def _validate(data: Any) -> Schedule:
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


def _known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The keys ``cls`` has: the schema lets a writer add keys, which this version ignores."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def plan_from_dict(data: Any) -> Plan:
    """Validate ``data`` (parsed JSON) and build a :class:`Plan`; raise :class:`PlanFormatError`."""
    schedule = _validate(data)
    stages = tuple(
        StagePlan(
            index=s["index"],
            rank=s["rank"],
            units=tuple(s["units"]),
            recompute=s["recompute"],
            forward_s=float(s["forward_s"]),
            backward_s=float(s["backward_s"]),
            send_bytes=s["send_bytes"],
            in_flight=s["in_flight"],
            memory_bytes=MemoryBreakdown(**s["memory_bytes"]),
            input_s=None if s.get("input_s") is None else float(s["input_s"]),
            weight_s=None if s.get("weight_s") is None else float(s["weight_s"]),
        )
        for s in data["stages"]
    )
    p = data["predicted"]
    return Plan(
        model_name=data["model"]["name"],
        model_fingerprint=data["model"]["fingerprint"],
        profile_sha256=data["profile_sha256"],
        num_stages=data["num_stages"],
        num_ranks=data["num_ranks"],
        schedule=schedule,
        virtual_stages=data["virtual_stages"],
        micro_batch_size=data["micro_batch_size"],
        num_microbatches=data["num_microbatches"],
        global_batch_size=data["global_batch_size"],
        stages=stages,
        split_points=tuple(data["split_points"]),
        predicted=Prediction(
            iteration_s=float(p["iteration_s"]),
            formula_iteration_s=float(p["formula_iteration_s"]),
            bubble_fraction=float(p["bubble_fraction"]),
            samples_per_s=float(p["samples_per_s"]),
            bottleneck_stage=p["bottleneck_stage"],
            busy_s=tuple(map(float, p.get("busy_s", ()))),
            comm_forward_s=tuple(map(float, p.get("comm_forward_s", ()))),
            comm_backward_s=tuple(map(float, p.get("comm_backward_s", ()))),
            calibration=str(p.get("calibration", "none")),
            action_overhead_s=float(p.get("action_overhead_s", 0.0)),
            compute_scale=float(p.get("compute_scale", 1.0)),
            step_tail_s=tuple(map(float, p.get("step_tail_s", ()))),
            overhead_s=tuple(map(float, p.get("overhead_s", ()))),
            comm_wait_s=tuple(map(float, p.get("comm_wait_s", ()))),
            tail_groups=tuple(tuple(g) for g in p.get("tail_groups", ())),
            resume=tuple((float(g), float(f), float(b)) for g, f, b in p.get("resume", ())),
        ),
        solver=SolverInfo(**_known(SolverInfo, data["solver"])),
        constraints=dict(data.get("constraints", {})),
        baselines=tuple(
            BaselinePlan(**_known(BaselinePlan, {**b, "split_points": tuple(b["split_points"])}))
            for b in data["baselines"]
        ),
        device=dict(data.get("device", {})),
        measured=_measurement(data.get("measured")),
        mesh=_mesh(data.get("mesh")),
    )


def _mesh(data: dict[str, Any] | None) -> Mesh | None:
    if data is None:
        return None
    values = {**_known(Mesh, data), "devices": tuple(tuple(row) for row in data["devices"])}
    for key in ("hop_bytes_per_s", "hop_latency_s", "ring_bytes_per_s", "ring_latency_s"):
        values[key] = float(values[key])
    return Mesh(**values)


def _measurement_dict(measured: Measurement) -> dict[str, Any]:
    data = asdict(measured)
    if data["speed_factor"] is None:  # optional: absent, as in plans written before it
        del data["speed_factor"]
    return data


def _measurement(data: dict[str, Any] | None) -> Measurement | None:
    if data is None:
        return None
    factor = data.get("speed_factor")
    return Measurement(
        mode=data["mode"],
        iteration_s=float(data["iteration_s"]),
        forward_s=tuple(map(float, data["forward_s"])),
        backward_s=tuple(map(float, data["backward_s"])),
        steps=int(data["steps"]),
        error_pct=float(data["error_pct"]),
        speed_factor=None if factor is None else float(factor),
    )


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; every failure is a one-line :class:`PlanFormatError`."""
    return load_document(path, PlanFormatError, "plan", plan_from_dict)


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` atomically; the same plan always gives the same bytes."""
    data = plan.to_dict()
    if any(isinstance(v, float) and not math.isfinite(v) for v in data["predicted"].values()):
        raise PlanFormatError("refusing to write a plan with a non-finite prediction")
    write_json_atomic(path, data)
