"""The plan data model (format ``pipeplan.plan``, version 1) and its JSON round-trip.

A plan says how to run one model as a pipeline: which units each stage holds, on which rank,
with which schedule, micro-batch size and count, and whether each stage recomputes its
activations. Units carry their units: ``_s`` seconds, ``_bytes`` bytes. See docs/plan-format.md.

The format only: a plan is assembled from the search's candidate in :mod:`planner.assemble`, and predicted
in :mod:`planner.prediction`; both import this module, never the other way round.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from planner.cost import MemoryBreakdown
from planner.errors import PlanFormatError
from planner.fileio import load_document, write_json_atomic
from planner.plan_checks import PLAN_FORMAT, PLAN_VERSION, validate_plan_dict
from planner.schedule.orders import Schedule
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, SimulationResult, simulate

__all__ = [
    "PLAN_FORMAT",
    "PLAN_VERSION",
    "Prediction",
    "StagePlan",
    "Measurement",
    "SolverInfo",
    "BaselinePlan",
    "Mesh",
    "PLACEMENTS",
    "Plan",
    "load_plan",
    "save_plan",
    "plan_from_dict",
]


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
    """Where the runtime terms came from: ``none`` (textbook model), ``shipped``, or a calibration file."""
    runtime: RuntimeTerms = RuntimeTerms()
    """What the runtime adds, as simulated: overhead per action, co-location factor, step tail per rank,
    tied tail groups, resume curve (all zero: the textbook model)."""
    overhead_s: tuple[float, ...] = ()
    """Per rank: total runtime overhead of its actions in one iteration."""
    comm_wait_s: tuple[float, ...] = ()
    """Per rank: time waiting on the link in one iteration."""
    schedule_overhead_s: dict[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    """Per schedule, from the calibration the plan was predicted with: its overhead per action at the plan's
    micro-batch count with one stage a rank and with several (empty without a calibration). ``simulate --compare``
    puts other schedules on the footing the plan was chosen on, whichever calibration that was (a profile's own
    is in no file)."""

    def to_dict(self) -> dict[str, Any]:
        """The plan format's ``predicted`` object: the runtime terms flat beside the rest (docs/plan-format.md)."""
        data: dict[str, Any] = {
            "iteration_s": self.iteration_s,
            "formula_iteration_s": self.formula_iteration_s,
            "bubble_fraction": self.bubble_fraction,
            "samples_per_s": self.samples_per_s,
            "bottleneck_stage": self.bottleneck_stage,
            "busy_s": list(self.busy_s),
            "comm_forward_s": list(self.comm_forward_s),
            "comm_backward_s": list(self.comm_backward_s),
            "calibration": self.calibration,
            "action_overhead_s": self.runtime.action_overhead_s,
            "compute_scale": self.runtime.compute_scale,
            "step_tail_s": list(self.runtime.step_tail_s),
            "overhead_s": list(self.overhead_s),
            "comm_wait_s": list(self.comm_wait_s),
            "tail_groups": [list(g) for g in self.runtime.tail_groups],
        }
        # Optional keys are absent at their default: a plan that does not use a term carries no trace of it.
        if self.runtime.transfer_compute_s_per_byte:
            data["transfer_compute_s_per_byte"] = self.runtime.transfer_compute_s_per_byte
        if self.runtime.resume:
            data["resume"] = [list(point) for point in self.runtime.resume]
        if self.schedule_overhead_s:
            data["schedule_overhead_s"] = {k: list(v) for k, v in sorted(self.schedule_overhead_s.items())}
        return data

    @classmethod
    def from_dict(cls, p: dict[str, Any]) -> Prediction:
        """The inverse of :meth:`to_dict` (``p`` already validated against the plan format)."""
        return cls(
            iteration_s=float(p["iteration_s"]),
            formula_iteration_s=float(p["formula_iteration_s"]),
            bubble_fraction=float(p["bubble_fraction"]),
            samples_per_s=float(p["samples_per_s"]),
            bottleneck_stage=p["bottleneck_stage"],
            busy_s=tuple(map(float, p.get("busy_s", ()))),
            comm_forward_s=tuple(map(float, p.get("comm_forward_s", ()))),
            comm_backward_s=tuple(map(float, p.get("comm_backward_s", ()))),
            calibration=str(p.get("calibration", "none")),
            runtime=RuntimeTerms(
                action_overhead_s=float(p.get("action_overhead_s", 0.0)),
                step_tail_s=tuple(map(float, p.get("step_tail_s", ()))),
                compute_scale=float(p.get("compute_scale", 1.0)),
                tail_groups=tuple(tuple(g) for g in p.get("tail_groups", ())),
                resume=tuple((float(g), float(f), float(b)) for g, f, b in p.get("resume", ())),
                transfer_compute_s_per_byte=float(p.get("transfer_compute_s_per_byte", 0.0)),
            ),
            overhead_s=tuple(map(float, p.get("overhead_s", ()))),
            comm_wait_s=tuple(map(float, p.get("comm_wait_s", ()))),
            schedule_overhead_s={k: (float(v[0]), float(v[1])) for k, v in p.get("schedule_overhead_s", {}).items()},
        )


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
    send_grad_bytes: int | None = None
    """Bytes of input gradient sent back to the previous stage per micro-batch (0 for the first stage). None
    (absent in the file): the previous stage's ``send_bytes``, what an activation's gradient weighs."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # Optional: absent rather than null where the stage has none.
        for key in ("input_s", "weight_s", "send_grad_bytes"):
            if data[key] is None:
                del data[key]
        return data


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
    tp: int = 1
    """Tensor-parallel degree: each (replica, pipeline rank) position is a group of ``tp`` consecutive global
    ranks starting at ``devices[replica][pipeline rank]`` (tp innermost, so its collectives stay in a node)."""

    @property
    def used_devices(self) -> int:
        return self.pp * self.dp * self.tp

    def coordinates(self, device: int) -> tuple[int, int]:
        """``(replica, pipeline rank)`` of a global rank (any member of a tensor-parallel group)."""
        for replica, row in enumerate(self.devices):
            for rank, first in enumerate(row):
                if first <= device < first + self.tp:
                    return replica, rank
        raise PlanFormatError(f"device {device} is not in the plan's mesh (devices 0..{self.used_devices - 1})")

    def tp_rank(self, device: int) -> int:
        """A global rank's place in its tensor-parallel group (0 without tensor parallelism)."""
        replica, rank = self.coordinates(device)
        return device - self.devices[replica][rank]

    def tp_group(self, replica: int, rank: int) -> tuple[int, ...]:
        """The global ranks that hold pipeline rank ``rank`` of replica ``replica`` together."""
        first = self.devices[replica][rank]
        return tuple(range(first, first + self.tp))


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
    def threads_ranks(self) -> int:
        """The processes that share one machine's cores when the plan runs: a node's devices of its mesh, else its
        ranks (:attr:`planner.request.PlanRequest.threads_ranks`)."""
        mesh = self.mesh
        return self.num_ranks if mesh is None else min(mesh.devices_per_node, mesh.used_devices)

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

    @property
    def profile_unit_sum_s(self) -> float | None:
        """Every unit's forward+backward at the plan's micro-batch size, added up, while the profile was made
        (``device.unit_sum_s``); None if absent."""
        value = self.device.get("unit_sum_s")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        return float(value) if ok and self.device.get("capture") in ("export", "hooks") else None

    @property
    def learned_together_ratio(self) -> float | None:
        """The model's units timed with every rank at once over alone while the plan's co-location factor was
        learned (``device.units_together_ratio``, from the calibration); None if absent."""
        value = self.device.get("units_together_ratio")
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
            runtime=self.predicted.runtime if runtime is None else runtime,
            cut_forward_bytes=tuple(s.send_bytes for s in self.stages[:-1]),
            cut_backward_bytes=tuple(
                before.send_bytes if after.send_grad_bytes is None else after.send_grad_bytes
                for before, after in itertools.pairwise(self.stages)
            ),
        )

    def simulation(self, runtime: RuntimeTerms | None = None, *, speed: float = 1.0) -> SimulationResult:
        """The plan's pipeline simulated under ``runtime`` (default: the terms it was predicted with).

        ``speed`` multiplies the stage times: the stages on a machine running ``speed`` times slower than
        when profiled (with ``runtime.at_speed(speed)`` for the runtime's own compute as well).
        """
        return simulate(self.pipeline(runtime).at_speed(speed))

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
            "predicted": self.predicted.to_dict(),
            "solver": asdict(self.solver),
            "constraints": self.constraints,
            "baselines": [asdict(b) for b in self.baselines],
            **({"mesh": _mesh_dict(self.mesh)} if self.mesh is not None else {}),
            **({"measured": _measurement_dict(self.measured)} if self.measured is not None else {}),
        }


def _mesh_dict(mesh: Mesh) -> dict[str, Any]:
    data = asdict(mesh)
    data["devices"] = [list(row) for row in mesh.devices]
    if mesh.tp == 1:  # optional: absent without tensor parallelism
        del data["tp"]
    return data


def _known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The keys ``cls`` has: the schema lets a writer add keys, which this version ignores."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def plan_from_dict(data: Any) -> Plan:
    """Validate ``data`` (parsed JSON) and build a :class:`Plan`; raise :class:`PlanFormatError`."""
    schedule = validate_plan_dict(data)
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
            send_grad_bytes=s.get("send_grad_bytes"),
        )
        for s in data["stages"]
    )
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
        predicted=Prediction.from_dict(data["predicted"]),
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
    if data["speed_factor"] is None:  # optional: absent when not measured, rather than null
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
