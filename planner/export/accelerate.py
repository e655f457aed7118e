"""accelerate: ``prepare_pippy`` with the plan's split points, for inference at micro-batch 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.export.common import (
    Trainer,
    _check_one_stage_per_rank,
    _comment,
    _header,
    _refuse_tensor_parallel,
    _renamed_stages,
)
from planner.plan import Plan

# --- accelerate -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccelerateExport:
    """``prepare_pippy`` arguments for the plan's split: pipeline-parallel inference at micro-batch 1."""

    trainer_version: str
    num_processes: int
    split_points: tuple[str, ...]
    num_chunks: int
    """Chunks of one sample: each call of the prepared model takes exactly this many samples."""
    header: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        """A Python snippet calling ``prepare_pippy`` on ``model`` with ``example_input`` (one sample)."""
        points = ", ".join(repr(p) for p in self.split_points)
        lines = _comment([*self.header, *self.notes])
        lines += [
            "from accelerate import prepare_pippy",
            "",
            f"SPLIT_POINTS = [{points}]",
            f"NUM_CHUNKS = {self.num_chunks}",
            "",
            f"# run with: torchrun --nproc-per-node {self.num_processes} your_script.py (or accelerate launch);",
            "# on CPU, create accelerate.PartialState(cpu=True) first. example_input is ONE sample (batch 1):",
            "# each call of the prepared model takes exactly NUM_CHUNKS samples; the last process gets the output.",
            "model = prepare_pippy(model, split_points=SPLIT_POINTS, example_args=(example_input,), "
            "num_chunks=NUM_CHUNKS)",
        ]
        return "\n".join(lines) + "\n"


def _accelerate(plan: Plan, renames: Sequence[tuple[str, str]], version: str) -> AccelerateExport:
    _refuse_tensor_parallel(
        plan,
        Trainer.ACCELERATE,
        "prepare_pippy splits the model into whole stages, one per process, and splits no layer across processes",
    )
    _check_one_stage_per_rank(plan, Trainer.ACCELERATE, "prepare_pippy builds the stage of its process index")
    stages = _renamed_stages(plan, renames)
    notes = [
        "accelerate's pipelining is inference only: torch's pipeline() split before each point, ScheduleGPipe,",
        "forward only; the split carries over, the plan's training schedule and prediction do not",
        "micro-batch 1: prepare_pippy traces example_args as one chunk and pads a call of other than NUM_CHUNKS "
        "samples, which then splits unevenly (accelerate/inference.py); NUM_CHUNKS = the plan's "
        f"{plan.num_microbatches} micro-batches",
    ]
    if plan.micro_batch_size > 1:
        notes.append(
            f"the plan's micro-batch of {plan.micro_batch_size} does not carry over: a call takes 1 x "
            f"{plan.num_microbatches} samples, not {plan.micro_batch_size} x {plan.num_microbatches}"
        )
    if plan.mesh is not None and plan.mesh.dp > 1:
        notes.append(
            f"prepare_pippy makes one pipeline of all its processes: the plan's {plan.mesh.dp} replicas are "
            f"{plan.mesh.dp} launches of {plan.num_ranks} processes"
        )
    return AccelerateExport(
        trainer_version=version,
        num_processes=plan.num_ranks,
        split_points=tuple(names[0] for names in stages[1:]),
        num_chunks=plan.num_microbatches,
        header=_header(plan, Trainer.ACCELERATE, version),
        notes=tuple(notes),
    )
