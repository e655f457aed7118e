"""planner.schedule.memory: the moments at which a stage may peak, from torch's orders."""

from __future__ import annotations

import pytest

from planner.schedule.memory import MemoryMoment, memory_moments
from planner.schedule.orders import Schedule, stage_to_rank
from planner.schedule.simulate import in_flight_per_stage


def test_gpipe_peaks_at_its_first_backward_or_its_second() -> None:
    # Every forward first: M waiting without gradients, then M - 1 with them.
    first, second = MemoryMoment(4, 0, False, "B"), MemoryMoment(3, 0, True, "B")
    assert memory_moments(Schedule.GPIPE, 2, 4, 2) == ((second, first), (second, first))


def test_1f1b_holds_p_minus_s_micro_batches_at_each_backward() -> None:
    assert memory_moments(Schedule.ONE_F_ONE_B, 3, 6, 3) == (
        (MemoryMoment(3, 0, True, "B"),),
        (MemoryMoment(2, 0, True, "B"),),
        (MemoryMoment(1, 0, True, "B"),),
    )


@pytest.mark.parametrize(
    ("schedule", "stages", "ranks", "microbatches"),
    [
        ("gpipe", 4, 4, 8),
        ("1f1b", 4, 4, 5),
        ("interleaved-1f1b", 8, 4, 8),
        ("looped-bfs", 4, 2, 4),
        ("zero-bubble", 4, 2, 4),
        ("zbv", 4, 2, 6),
        ("dualpipev", 8, 4, 8),
    ],
)
def test_the_fullest_moment_holds_the_peak_in_flight(schedule: str, stages: int, ranks: int, microbatches: int) -> None:
    sched = Schedule.parse(schedule)
    assert len(set(stage_to_rank(sched, stages, ranks))) == ranks
    moments = memory_moments(sched, stages, microbatches, ranks)
    fullest = tuple(max(m.waiting + m.split for m in stage) for stage in moments)
    assert fullest == in_flight_per_stage(sched, stages, microbatches, ranks)
    # Only a split schedule has micro-batches between I and W.
    assert any(m.split for stage in moments for m in stage) == sched.splits_backward
