"""Shared fixtures: hand-built plans for the built-in models (no profiling, no search), a file to keep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from planner.cost import MemoryBreakdown
from planner.plan import Plan, Prediction, SolverInfo, StagePlan
from planner.schedule.orders import Schedule, stage_to_rank
from profiles.fingerprint import model_fingerprint
from profiles.workload import Workload


def make_plan(
    workload: Workload,
    split_points: Sequence[str],
    schedule: str = "gpipe",
    *,
    num_ranks: int = 2,
    num_microbatches: int = 4,
    micro_batch_size: int = 2,
    recompute: Sequence[bool] = (),
    forward_s: float = 1e-3,
    backward_s: float = 2e-3,
    iteration_s: float = 0.05,
) -> Plan:
    """A valid plan cutting ``workload`` before ``split_points``, stages placed as torch places them for
    ``schedule`` (looped: stage s on rank s % num_ranks; zbv/dualpipev: in a V).

    The predicted times are placeholders (``forward_s``, ``backward_s`` per stage), not a search result.
    """
    units = list(workload.units or ())
    cuts = [units.index(p) for p in split_points]
    bounds = [0, *cuts, len(units)]
    n = len(bounds) - 1
    memory = MemoryBreakdown(params=0, grads=0, optimizer=0, activations=0, transient=0, peak=0)
    placement = stage_to_rank(Schedule.parse(schedule), n, num_ranks)
    stages = tuple(
        StagePlan(
            index=s,
            rank=placement[s],
            units=tuple(units[bounds[s] : bounds[s + 1]]),
            recompute=bool(recompute[s]) if recompute else False,
            forward_s=forward_s,
            backward_s=backward_s,
            send_bytes=0,
            in_flight=1,
            memory_bytes=memory,
        )
        for s in range(n)
    )
    return Plan(
        model_name=workload.name,
        model_fingerprint=model_fingerprint(workload.model),
        profile_sha256="0" * 64,
        num_stages=n,
        num_ranks=num_ranks,
        schedule=Schedule.parse(schedule),
        virtual_stages=n // num_ranks,
        micro_batch_size=micro_batch_size,
        num_microbatches=num_microbatches,
        global_batch_size=micro_batch_size * num_microbatches,
        stages=stages,
        split_points=tuple(split_points),
        predicted=Prediction(
            iteration_s=iteration_s,
            formula_iteration_s=iteration_s,
            bubble_fraction=0.0,
            samples_per_s=micro_batch_size * num_microbatches / iteration_s,
            bottleneck_stage=0,
        ),
        solver=SolverInfo(name="hand", objective="none", optimal=False),
    )


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    """A file that a failed CLI command must leave as it was (content: ``cli_checks.PRECIOUS``)."""
    from cli_checks import PRECIOUS

    path = tmp_path / "existing.json"
    path.write_text(PRECIOUS)
    return path
