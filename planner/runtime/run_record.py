"""The run record (``pipeplan.run-record``, docs/run-record.md): what a training loop measured against its plan,
one file per job, and the verify report made from it.

A record holds the plan itself and its sha256, every rank's raw samples (each action's time, each wait, each
step's tail and its start on the rank's clock), where each rank ran (host, local rank, threads) and the speed
reference each timed. :func:`record_report` turns it into the :class:`~planner.runtime.verify_report.VerifyReport`
``verify`` builds, through verify's own :func:`~planner.runtime.verify.measured_from_ranks` and
:func:`~planner.runtime.verify.build_report`: each rank's samples become the
:class:`~planner.runtime.rank_timing.RankResult` a verify rank hands back.

One difference in what is timed: a training loop has no barriers around its steps, so a step's iteration is its
period, from entering one step to entering the next on the same rank (steps of one stretch of recording). In
steady state every rank steps at the same period, the loop's throughput, and it holds what the loop does between
steps (``zero_grad``, the next batch, logging), which the report counts in the step tail.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import PlanFormatError, UsageError
from planner.fileio import check_document, dumps_canonical, load_document, write_json_atomic
from planner.plan import Plan, plan_from_dict
from planner.runtime.rank_timing import RankResult
from planner.runtime.recording import StepSample
from planner.runtime.verify import build_report, measured_from_ranks
from planner.runtime.verify_report import MEMORY_TOLERANCE, VerifyReport

__all__ = [
    "RECORD_FORMAT",
    "RECORD_VERSION",
    "RankRecord",
    "RunRecord",
    "plan_sha256",
    "record_from_dict",
    "load_run_record",
    "save_run_record",
    "rank_results",
    "record_report",
]

RECORD_FORMAT = "pipeplan.run-record"
RECORD_VERSION = 1


class RunRecordError(PlanFormatError):
    """A run record that cannot be read: not JSON, another format, or a field the schema refuses."""


@dataclass(frozen=True)
class RankRecord:
    """One rank's samples and where it ran."""

    rank: int
    """Its rank in the job's world."""
    host: str
    local_rank: int
    """Its place on its host (torchrun's ``LOCAL_RANK``)."""
    pipeline_rank: int
    replica: int
    tp_rank: int
    stage_indices: tuple[int, ...]
    threads: int
    """torch's intra-op threads (CPU)."""
    reference_s: tuple[float, ...]
    """The speed reference (profiles/reference.py's layer) timed on this rank alone, each sample one
    forward+backward, when the record was gathered."""
    steps: tuple[StepSample, ...]


@dataclass(frozen=True)
class RunRecord:
    plan: Plan
    plan_sha256: str
    """sha256 of the plan's canonical JSON, as ``plan`` holds it."""
    ranks: tuple[RankRecord, ...]
    """By rank in the world."""
    machine: dict[str, Any]
    """Hosts, platform, Python and torch versions, device and backend, cores, load average."""
    recorded_at: str
    """UTC time the record was gathered (ISO 8601)."""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "plan_sha256": self.plan_sha256,
            "plan": self.plan.to_dict(),
            "recorded_at": self.recorded_at,
            "machine": self.machine,
            "world_size": self.world_size,
            "reference": "layer",
            "ranks": [_rank_dict(r) for r in self.ranks],
        }


def plan_sha256(plan: Plan) -> str:
    """sha256 of ``plan``'s canonical JSON (sorted keys, fixed indentation: what ``save_plan`` writes)."""
    return hashlib.sha256(dumps_canonical(plan.to_dict()).encode("utf-8")).hexdigest()


def _rank_dict(r: RankRecord) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "host": r.host,
        "local_rank": r.local_rank,
        "pipeline_rank": r.pipeline_rank,
        "replica": r.replica,
        "tp_rank": r.tp_rank,
        "stage_indices": list(r.stage_indices),
        "threads": r.threads,
        "reference_s": list(r.reference_s),
        "steps": [_step_dict(s) for s in r.steps],
    }


def _step_dict(s: StepSample) -> dict[str, Any]:
    return {
        "start_s": s.start_s,
        "segment": s.segment,
        "schedule_s": s.schedule_s,
        "own_s": s.own_s,
        "tail_s": s.tail_s,
        "wait_s": s.wait_s,
        "optimizer": s.optimizer,
        "actions": [[[kind, d] for kind, d in stage] for stage in s.actions],
        "waits": list(s.waits),
    }


@cache
def _schema() -> dict[str, Any]:
    return dict(json.loads(resources.files("planner").joinpath("run_record.schema.json").read_text()))


def record_from_dict(data: Any) -> RunRecord:
    """Validate ``data`` (parsed JSON) and build a :class:`RunRecord`; raise :class:`RunRecordError`."""
    check_document(data, _schema(), error=RunRecordError, kind="run record", fmt=RECORD_FORMAT, version=RECORD_VERSION)
    try:
        plan = plan_from_dict(data["plan"])
    except PlanFormatError as exc:
        raise RunRecordError(f"its plan: {exc}") from None
    if plan_sha256(plan) != data["plan_sha256"]:
        raise RunRecordError("its plan does not match its plan_sha256: the record was edited")
    ranks = tuple(_rank_record(r) for r in data["ranks"])
    if [r.rank for r in ranks] != list(range(len(ranks))):
        raise RunRecordError(f"its ranks are {[r.rank for r in ranks]}, expected 0..{len(ranks) - 1} in order")
    return RunRecord(plan, data["plan_sha256"], ranks, dict(data["machine"]), data["recorded_at"])


def _rank_record(r: dict[str, Any]) -> RankRecord:
    steps = tuple(
        StepSample(
            start_s=float(s["start_s"]),
            segment=s["segment"],
            schedule_s=float(s["schedule_s"]),
            own_s=float(s["own_s"]),
            tail_s=float(s["tail_s"]),
            wait_s=float(s["wait_s"]),
            optimizer=s["optimizer"],
            actions=[[(kind, float(d)) for kind, d in stage] for stage in s["actions"]],
            waits=[float(w) for w in s["waits"]],
        )
        for s in r["steps"]
    )
    return RankRecord(
        rank=r["rank"],
        host=r["host"],
        local_rank=r["local_rank"],
        pipeline_rank=r["pipeline_rank"],
        replica=r["replica"],
        tp_rank=r["tp_rank"],
        stage_indices=tuple(r["stage_indices"]),
        threads=r["threads"],
        reference_s=tuple(float(x) for x in r["reference_s"]),
        steps=steps,
    )


def load_run_record(path: str | Path) -> RunRecord:
    """Read and validate a run record; every failure is one line."""
    return load_document(path, RunRecordError, "run record", record_from_dict)


def save_run_record(record: RunRecord, path: str | Path) -> None:
    write_json_atomic(path, record.to_dict())


def _steps_with_next(steps: tuple[StepSample, ...]) -> list[tuple[StepSample, float]]:
    """Each step that has a next step in the same stretch of recording, with its period (to the next step's
    start): a period needs both ends."""
    return [(a, b.start_s - a.start_s) for a, b in zip(steps, steps[1:], strict=False) if a.segment == b.segment]


def rank_results(record: RunRecord, warmup: int = 1) -> list[RankResult]:
    """Every rank's samples after its first ``warmup`` steps as the :class:`RankResult` a verify rank hands back.

    A step's iteration is its period; its tail runs on to the next step's start: verify's tail holds the
    optimizer's ``zero_grad``, which a training loop runs between its steps, with whatever else the loop does
    there (the next batch, logging), a cost of each step that no action holds.

    Raises:
        UsageError: fewer than ``warmup + 2`` steps recorded on a rank (a period needs the next step's start).
    """
    out = []
    for r in record.ranks:
        timed = _steps_with_next(r.steps[warmup:])
        if not timed:
            raise UsageError(
                f"rank {r.rank} recorded {len(r.steps)} steps: a report skips {warmup} and needs 2 more "
                "(a step's time is from its start to the next step's)"
            )
        gaps = [max(0.0, period - s.own_s) for s, period in timed]
        out.append(
            RankResult(
                stage_indices=r.stage_indices,
                replica=r.replica,
                warmup_steps=min(warmup, len(r.steps)),
                timed_steps=len(timed),
                stage_records=tuple(
                    tuple(a for s, _ in timed for a in s.actions[k]) for k in range(len(r.stage_indices))
                ),
                iteration_s=tuple(period for _, period in timed),
                busy_s=tuple(s.busy_s for s, _ in timed),
                wait_s=tuple(s.wait_s for s, _ in timed),
                tail_s=tuple(s.tail_s + gap for (s, _), gap in zip(timed, gaps, strict=True)),
                own_s=tuple(s.own_s + gap for (s, _), gap in zip(timed, gaps, strict=True)),
                reference_s=statistics.median(r.reference_s) if r.reference_s else None,
                reference="layer",
            )
        )
    return out


def record_report(
    record: RunRecord,
    *,
    warmup: int = 1,
    tolerance: float = 0.15,
    memory_tolerance: float = MEMORY_TOLERANCE,
    plan: Plan | None = None,
) -> VerifyReport:
    """The report ``verify`` builds, from the steps the record holds after each rank's first ``warmup``: each
    stage's median forward and backward, each rank's compute, waits and tail, the iteration (the slowest rank's
    median period) and the verdict at the machine's speed where the plan records its profile's reference.

    ``plan``: hold the measurement against this prediction instead of the record's own (the record's plan
    re-predicted under another calibration: same stages, ranks and schedule).
    """
    judged = record.plan if plan is None else plan
    measured = measured_from_ranks(judged, rank_results(record, warmup))
    return build_report(judged, "processes", measured, tolerance, memory_tolerance)
