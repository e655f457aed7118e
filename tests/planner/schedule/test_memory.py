"""planner.schedule.memory: the moments at which a stage may peak, from torch's orders."""

from __future__ import annotations

import random
from unittest import mock

import pytest

from planner.schedule import memory as memory_module
from planner.schedule.memory import MemoryMoment, memory_moments
from planner.schedule.orders import Schedule, rank_orders, stage_to_rank
from planner.schedule.simulate import _peak_in_flight


def test_gpipe_peaks_at_its_first_backward_or_a_later_one() -> None:
    # Every forward first: M waiting without gradients; then one fewer at each backward, with the gradients, and
    # one more input gradient and output held by a send (GPipe keeps every send's work, which keeps its tensor,
    # in fwd_sends_to_wait / bwd_sends_to_wait to the end of the step).
    stage = (
        MemoryMoment(1, 0, True, "B", sent_grads=3, sent_outputs=3),
        MemoryMoment(2, 0, True, "B", sent_grads=2, sent_outputs=2),
        MemoryMoment(3, 0, True, "B", sent_grads=1, sent_outputs=1),
        MemoryMoment(4, 0, False, "B"),
    )
    # The last stage also holds the loss of every micro-batch whose backward is done (torch's _internal_losses).
    last = tuple(MemoryMoment(m.waiting, 0, m.grads, "B", m.sent_grads, m.sent_outputs, 4 - m.waiting) for m in stage)
    # The middle backward's counts are the mean of its neighbours': its memory is never above both, whatever the
    # sizes, so only the line's ends are kept.
    assert memory_moments(Schedule.GPIPE, 2, 4, 2) == tuple((s[0], s[2], s[3]) for s in (stage, last))


def test_1f1b_holds_p_minus_s_micro_batches_at_each_backward() -> None:
    # bwd_sends keeps the previous backward's input gradients until the next backward's replace them; send_work
    # keeps the warm-up's second-to-last forward send (micro-batch w - 2 of w = P - s warm-up forwards) until the
    # cool-down: stage 0 (w = 3) holds micro-batch 1's output at the backwards of micro-batches 2 and 3.
    assert memory_moments(Schedule.ONE_F_ONE_B, 3, 6, 3) == (
        (MemoryMoment(3, 0, True, "B", sent_grads=1, sent_outputs=1),),
        (MemoryMoment(2, 0, True, "B", sent_grads=1, sent_outputs=1),),
        (MemoryMoment(1, 0, True, "B", sent_grads=1, done=5),),
    )
    # With as many micro-batches as stages the steady phase is one backward: nothing outlives its own backward.
    first = memory_moments(Schedule.ONE_F_ONE_B, 2, 2, 2)[0]
    assert all(m.sent_outputs == 0 for m in first)


def test_the_multi_stage_runtime_holds_every_send_until_the_step_ends() -> None:
    # torch's _PipelineScheduleRuntime waits for its sends at the end of the step: at the last backward of a
    # stage, the input gradients and outputs of every micro-batch before it are still held.
    moments = memory_moments(Schedule.INTERLEAVED_1F1B, 4, 4, 2)
    last_backward = max(moments[1], key=lambda m: m.sent_grads)
    assert (last_backward.waiting, last_backward.sent_grads, last_backward.sent_outputs) == (1, 3, 3)


def test_the_last_stage_holds_its_latest_output_where_the_schedule_loop_still_references_it() -> None:
    # torch's loop keeps the latest forward's output in a local until the rank's next forward. Under zero-bubble the
    # last stage runs F k, I k, then a deferred W: k is past I, its output referenced there; under 1F1B and GPipe
    # every backward is of the latest forward's micro-batch or of one before it that is still waiting.
    zero_bubble = memory_moments(Schedule.ZERO_BUBBLE, 4, 8, 4)
    assert {(m.kind, m.held_output) for m in zero_bubble[-1]} == {("W", 1), ("I", 0)}
    assert all(m.held_output == 0 for stage in zero_bubble[:-1] for m in stage)
    for schedule, stages in ((Schedule.ONE_F_ONE_B, 4), (Schedule.GPIPE, 4), (Schedule.INTERLEAVED_1F1B, 8)):
        assert all(m.held_output == 0 for stage in memory_moments(schedule, stages, 8, 4) for m in stage)
    # A V's last stage shares rank 0 with stage 0: only where the rank's latest forward is the last stage's.
    zbv = memory_moments(Schedule.ZBV, 8, 8, 4)[-1]
    assert any(m.held_output for m in zbv) and all(m.kind == "W" for m in zbv if m.held_output)


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
    # Held against the orders walked action by action (in_flight_per_stage itself reads the moments).
    assert fullest == _peak_in_flight(rank_orders(sched, stages, microbatches, ranks), stages)
    # Only a split schedule has micro-batches between I and W.
    assert any(m.split for stage in moments for m in stage) == sched.splits_backward


def every_moment(schedule: Schedule, stages: int, microbatches: int, ranks: int) -> list[set[MemoryMoment]]:
    """Every moment of the schedule's walk, none dropped."""
    with mock.patch.object(memory_module, "_pareto", lambda found: tuple(MemoryMoment(*f) for f in found)):
        return [set(s) for s in memory_moments.__wrapped__(schedule, stages, microbatches, ranks)]


@pytest.mark.parametrize("seed", range(20))
def test_the_moments_kept_peak_as_high_as_every_moment(seed: int) -> None:
    # The stage's memory at a moment is its counts times non-negative bytes; whatever the bytes, the largest over
    # the moments kept is the largest over every moment the schedule has (planner/schedule/memory.py, _hull).
    rng = random.Random(seed)
    schedule = rng.choice([Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE])
    ranks = rng.choice([2, 4])
    stages = ranks * (2 if schedule.multi_stage else 1)
    microbatches = rng.choice([ranks, 2 * ranks, 3 * ranks])
    everything = every_moment(schedule, stages, microbatches, ranks)
    kept = memory_moments(schedule, stages, microbatches, ranks)
    for s in range(stages):
        assert set(kept[s]) <= everything[s]
        for _ in range(50):
            bytes_of = [rng.choice([0.0, rng.uniform(0, 10)]) for _ in range(6)]
            kinds = {k: rng.uniform(0, 10) for k in "BIW"}

            def memory(m: MemoryMoment, bytes_of: list[float] = bytes_of, kinds: dict[str, float] = kinds) -> float:
                counts = (m.waiting, m.split, m.sent_grads, m.sent_outputs, m.done, int(m.grads))
                return sum(c * b for c, b in zip(counts, bytes_of, strict=True)) + kinds[m.kind]

            assert max(map(memory, kept[s])) == pytest.approx(max(map(memory, everything[s])), rel=1e-12)
