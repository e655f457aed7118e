"""A plan assembled from the search's best candidate: the plan format (:mod:`planner.plan`) filled in with
the candidate's stages, their times and memory, its prediction (:mod:`planner.prediction`) and the search's
record.

Above both the format and the prediction, so that the format is read and written without the search: the
search (:mod:`planner.search`) hands over a :class:`Candidate` and gets a :class:`~planner.plan.Plan` back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.cost import stage_memory, unit_costs
from planner.plan import BaselinePlan, Plan, SolverInfo, StagePlan
from planner.prediction import partition_comm_times, partition_split_times, partition_stage_times, prediction_of
from planner.schedule.orders import Schedule, stage_to_rank
from planner.schedule.simulate import RuntimeTerms, SimulationResult
from profiles.format import Profile
from solvers.problem import PartitionProblem, PartitionSolution

if TYPE_CHECKING:
    from planner.calibration import Calibration
    from planner.request import PlanRequest

__all__ = ["Candidate", "build_plan", "profiled_device", "plan_constraints"]


@dataclass(frozen=True)
class Candidate:
    """One solved and simulated partition of the search: a micro-batching, a schedule and its partition."""

    micro_batch_size: int
    num_microbatches: int
    schedule: Schedule
    virtual_stages: int
    problem: PartitionProblem
    solution: PartitionSolution
    simulation: SimulationResult
    peak_memory_bytes: float
    runtime: RuntimeTerms | None = None
    """The runtime terms ``simulation`` was made with (None: the textbook model)."""


def build_plan(
    profile: Profile,
    request: PlanRequest,
    best: Candidate,
    *,
    solver: SolverInfo,
    baselines: tuple[BaselinePlan, ...],
    sha256: str,
) -> Plan:
    """The plan of a search's ``best`` candidate: its stages with their times and memory, its prediction,
    and the search's record (solver, constraints, baselines, the profiled device)."""
    costs = unit_costs(profile, best.micro_batch_size)
    problem, solution, simulation = best.problem, best.solution, best.simulation
    stage_rank = stage_to_rank(best.schedule, problem.num_stages, request.num_ranks)
    forward, backward = partition_stage_times(problem, solution)
    # Every plan records the measured split, whichever its schedule (one that does not split the backward ignores
    # it): `simulate --compare` puts its stages under the schedules that do, as the planner costs them.
    inputs, weights = partition_split_times(costs, problem, solution, None)
    comm_forward, comm_backward = partition_comm_times(problem, solution)
    stages = []
    for s, units in enumerate(solution.stage_units(problem.num_units)):
        first, last = units[0], units[-1]
        stages.append(
            StagePlan(
                index=s,
                rank=stage_rank[s],
                units=tuple(profile.units[u].name for u in units),
                recompute=solution.recompute[s],
                forward_s=forward[s],
                backward_s=backward[s],
                send_bytes=costs.cut_bytes[last] if last < problem.num_units - 1 else 0,
                send_grad_bytes=costs.cut_grad_bytes[first - 1] if first > 0 else 0,
                in_flight=problem.in_flight[s],
                memory_bytes=stage_memory(
                    profile, request.settings, problem, costs, s, first, last, solution.recompute[s]
                ),
                input_s=inputs[s] if inputs else None,
                weight_s=weights[s] if weights else None,
            )
        )
    split_points = tuple(profile.units[i].name for i in solution.boundaries[1:])
    return Plan(
        model_name=profile.model.name,
        model_fingerprint=profile.model.fingerprint,
        profile_sha256=sha256,
        num_stages=problem.num_stages,
        num_ranks=request.num_ranks,
        schedule=best.schedule,
        virtual_stages=best.virtual_stages,
        micro_batch_size=best.micro_batch_size,
        num_microbatches=best.num_microbatches,
        global_batch_size=request.global_batch_size,
        stages=tuple(stages),
        split_points=split_points,
        predicted=prediction_of(
            simulation,
            request.settings,
            best.runtime,
            formula_s=solution.objective_s,
            global_batch_size=request.global_batch_size,
            num_microbatches=best.num_microbatches,
            comm=(tuple(comm_forward), tuple(comm_backward)),
        ),
        solver=solver,
        constraints=plan_constraints(profile, request),
        baselines=baselines,
        device=profiled_device(profile, best.micro_batch_size, request.settings.calibration),
    )


def profiled_device(
    profile: Profile, micro_batch_size: int | None = None, calibration: Calibration | None = None
) -> dict[str, Any]:
    """The plan's ``device``: what was profiled, and on a CPU the intra-op threads the times were measured
    with, so that a replay measures the stages as the profile did; the speed reference's time while the
    profile was made, so that ``verify`` can tell how fast the machine runs now against then; every unit's
    forward+backward at ``micro_batch_size`` added up, with how the units were captured: the speed reference
    of a replay (profiles/model_reference.py); and where ``calibration`` learned its co-location factor from
    the model, how much slower the units ran with every rank at once then (``units_together_ratio``)."""
    block: dict[str, Any] = {"kind": profile.device.kind, "name": profile.device.name, "dtype": profile.device.dtype}
    threads = profile.settings.get("threads")
    if profile.device.kind == "cpu" and isinstance(threads, int) and threads > 0:
        block["threads"] = threads
    reference = profile.settings.get("reference_s")
    if isinstance(reference, (int, float)) and not isinstance(reference, bool) and reference > 0:
        block["reference_s"] = float(reference)
    capture = profile.settings.get("capture")
    # A meta profile copies sampled units' times: it holds no time for every unit to set a replay's against.
    measured = capture in ("export", "hooks") and not profile.settings.get("meta")
    if micro_batch_size in profile.micro_batch_sizes and measured:
        unit_sum_s = profile.unit_sum_s(profile.size_index(micro_batch_size))
        if math.isfinite(unit_sum_s) and unit_sum_s > 0:
            block["unit_sum_s"] = unit_sum_s
            block["capture"] = capture
    if calibration is not None and calibration.units_together_ratio is not None:
        block["units_together_ratio"] = calibration.units_together_ratio
    return block


def plan_constraints(profile: Profile, request: PlanRequest) -> dict[str, object]:
    s = request.settings
    return {
        "num_ranks": request.num_ranks,
        "global_batch_size": request.global_batch_size,
        "schedule": "auto" if request.schedule is None else request.schedule.value,
        "micro_batch_size": request.micro_batch_size if request.micro_batch_size is not None else "auto",
        "recompute": request.recompute,
        "solver": request.solver,
        "optimizer": s.optimizer,
        "link_bytes_per_s": s.link_bytes_per_s,
        "link_latency_s": s.link_latency_s,
        "device_memory_bytes": list(s.device_memory_bytes) or [profile.device.memory_bytes],
        "headroom_fraction": s.headroom_fraction,
        "capacity_bytes": [int(s.capacity(profile, r, request.num_ranks)) for r in range(request.num_ranks)],
        "device_speeds": list(s.device_speeds) or [1.0] * request.num_ranks,
        "pinned": [list(p) for p in request.pinned],
        "max_units_per_stage": request.max_units_per_stage,
        "top_k": request.top_k,
        "calibration": s.calibration_label,
    }
