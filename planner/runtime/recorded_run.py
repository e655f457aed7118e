"""A training run that reports against its plan: :func:`apply_plan` with recording.

``planner.apply_plan`` is this one: :func:`planner.runtime.apply.apply_plan`'s stages and schedule, as a
:class:`RecordedRun`, which can record each action of the steps the user's loop runs
(:mod:`planner.runtime.recording`) and, every rank together, turn them into the report ``verify`` builds
(:meth:`RecordedRun.report`) or a run record on rank 0 (:meth:`RecordedRun.save_record`, docs/run-record.md)::

    run = planner.apply_plan(plan, model, inputs, loss_fn, device=device, record=True)
    optimizer = torch.optim.AdamW(run.parameters())
    for inputs, target in batches:
        optimizer.zero_grad()
        loss = run.step(inputs, target)
        optimizer.step()                 # the end of the step's tail, seen through an optimizer hook
    run.save_record("run.json")          # every rank calls it; rank 0 writes

A module above verify's (it builds verify's report), so that :mod:`planner.runtime.apply`, which verify's ranks
run, stays below it.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.plan import Plan
from planner.runtime import apply as _apply
from planner.runtime.apply import PipelineRun
from planner.runtime.launch import each_rank_in_turn
from planner.runtime.recording import ActionRecorder
from planner.runtime.run_record import RankRecord, RunRecord, plan_sha256, record_report, save_run_record
from planner.runtime.tensor_parallel import TpPlanHook
from planner.runtime.verify_report import MEMORY_TOLERANCE, VerifyReport
from profiles.reference import SpeedReference

__all__ = ["RecordedRun", "apply_plan", "REFERENCE_SAMPLES"]

REFERENCE_SAMPLES = 7
"""Speed-reference samples each rank times, alone, when a record is gathered (a few milliseconds each)."""


@dataclass(frozen=True, eq=False)
class RecordedRun(PipelineRun):
    """A :class:`~planner.runtime.apply.PipelineRun` that can record its steps (off until started)."""

    recorder: ActionRecorder | None = None
    device: torch.device = torch.device("cpu")

    @property
    def recording(self) -> bool:
        return self.recorder is not None and self.recorder.active

    def start_recording(self) -> None:
        """Record every step from now on: each action's time (a clock pair and an append), the waits on sends
        and receives, the step's tail up to the optimizer's step."""
        self._recorder().start()

    def stop_recording(self) -> None:
        """Stop recording (the wrappers come off); what was recorded stays for :meth:`report` and :meth:`record`."""
        self._recorder().stop()

    def schedule_step(self, inputs: Any = None, target: torch.Tensor | None = None) -> torch.Tensor | None:
        recorder = self._recorder()
        recorder.begin_step()
        loss = super().schedule_step(inputs, target)
        recorder.schedule_done()
        return loss

    def step(self, inputs: Any = None, target: torch.Tensor | None = None) -> torch.Tensor | None:
        loss = super().step(inputs, target)
        self._recorder().tail_done()
        return loss

    def record(self) -> RunRecord | None:
        """The job's run record, on rank 0; None on the others. A collective: every rank of the job calls it
        (each times the speed reference alone, in turn, then rank 0 gathers every rank's samples)."""
        return _gather(self, self._recorder())

    def report(
        self, *, warmup: int = 1, tolerance: float = 0.15, memory_tolerance: float = MEMORY_TOLERANCE
    ) -> VerifyReport | None:
        """The report ``verify`` builds, from the steps recorded after each rank's first ``warmup``, on rank 0;
        None on the others. A collective: every rank of the job calls it (:meth:`record`).

        Raises:
            UsageError: fewer than ``warmup + 2`` steps recorded (a step's time runs to the next step's start).
        """
        record = self.record()
        if record is None:
            return None
        return record_report(record, warmup=warmup, tolerance=tolerance, memory_tolerance=memory_tolerance)

    def save_record(self, path: str | Path) -> RunRecord | None:
        """Write the job's run record (docs/run-record.md) to ``path`` on rank 0 and return it; None on the other
        ranks. A collective: every rank of the job calls it (:meth:`record`)."""
        record = self.record()
        if record is not None:
            save_run_record(record, path)
        return record

    def _recorder(self) -> ActionRecorder:
        assert self.recorder is not None  # apply_plan always gives one
        return self.recorder


def apply_plan(
    plan: Plan,
    model: nn.Module,
    example_inputs: Any,
    loss_fn: Any,
    *,
    device: torch.device | str,
    rank: int | None = None,
    world_size: int | None = None,
    group: Any = None,
    tp_plan: TpPlanHook | None = None,
    record: bool = False,
) -> RecordedRun:
    """:func:`planner.runtime.apply.apply_plan` (its arguments and errors), as a :class:`RecordedRun`;
    ``record``: start recording at once (else :meth:`RecordedRun.start_recording` starts it)."""
    base = _apply.apply_plan(
        plan,
        model,
        example_inputs,
        loss_fn,
        device=device,
        rank=rank,
        world_size=world_size,
        group=group,
        tp_plan=tp_plan,
    )
    last = base.stage_indices.index(plan.num_stages - 1) if base.is_last else None
    dev = torch.device(device)
    recorder = ActionRecorder(base.stages, base.schedule, dev, base.parameters(), last)
    run = RecordedRun(**{f.name: getattr(base, f.name) for f in fields(PipelineRun)}, recorder=recorder, device=dev)
    if record:
        run.start_recording()
    return run


def _gather(run: RecordedRun, recorder: ActionRecorder) -> RunRecord | None:
    """Every rank's samples and place, gathered on rank 0 of the world (``dist.gather_object``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    recorder.gathers += 1
    reference = SpeedReference(run.device)

    def time_reference() -> None:
        reference.warm_up()
        for _ in range(REFERENCE_SAMPLES):
            reference.time_once()

    # Each rank alone, as verify times its reference: the machine's speed without the other ranks' load.
    each_rank_in_turn(rank, world, f"run-record-{recorder.gathers}", time_reference)
    mine = RankRecord(
        rank=rank,
        host=socket.gethostname(),
        local_rank=int(os.environ.get("LOCAL_RANK", rank)),
        pipeline_rank=run.rank,
        replica=run.replica,
        tp_rank=run.tp_rank,
        stage_indices=run.stage_indices,
        threads=torch.get_num_threads(),
        reference_s=tuple(reference.samples),
        steps=tuple(recorder.samples()),
    )
    everyone: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if everyone is None:
        return None
    ranks = tuple(sorted(everyone, key=lambda r: r.rank))
    return RunRecord(
        plan=run.plan,
        plan_sha256=plan_sha256(run.plan),
        ranks=ranks,
        machine=_machine(run, ranks),
        recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _machine(run: RecordedRun, ranks: tuple[RankRecord, ...]) -> dict[str, Any]:
    """What the record was measured on: enough to tell two machines, or two loads of one, apart."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "hosts": sorted({r.host for r in ranks}),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": run.device.type,
        "backend": dist.get_backend(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": load,
        "reference_median_s": statistics.median([s for r in ranks for s in r.reference_s] or [0.0]),
    }
