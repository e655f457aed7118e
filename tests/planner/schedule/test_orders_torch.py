"""planner.schedule.orders.rank_orders must equal what torch.distributed.pipelining executes.

Three independent checks against torch 2.13:
- single-stage schedules (GPipe, 1F1B): run torch's own ``_step_microbatches`` with a recording stage
  that has no communication, so the executed order is observed, not re-derived;
- multi-stage schedules (interleaved 1F1B, zero bubble, looped BFS, ZBV, DualPipeV): torch's
  order-building methods, which are functions of (rank, ranks, stages per rank, micro-batches),
  validated with torch's ``_validate_schedule``;
- a real one-process gloo group with real ``PipelineStage`` objects: the constructed schedule's
  ``pipeline_order`` and one real ``step``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed.pipelining.schedules as ts
from torch.distributed.pipelining import PipelineStage
from torch_lowering import iteration_of_torch_lowering, torch_compute

from planner.errors import ScheduleError
from planner.schedule.orders import (
    TORCH_SCHEDULE_CLASS,
    Schedule,
    Step,
    check_microbatches,
    orders_from_torch,
    rank_orders,
    stage_to_rank,
)
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import simulate


class _RecordingStage:
    """Stands in for a PipelineStage: no communication, records each forward/backward call."""

    def __init__(self, stage_index: int, num_stages: int, log: list[str]) -> None:
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.has_backward = True
        self.output_chunks: list[object] = []
        self._log = log

    def clear_runtime_states(self) -> None:
        pass

    def get_fwd_recv_ops(self, i: int) -> list[object]:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, i: int, *args: object, **kwargs: object) -> None:
        self._log.append(f"{self.stage_index}F{i}")

    def backward_one_chunk(self, i: int, **kwargs: object) -> None:
        self._log.append(f"{self.stage_index}B{i}")

    def perform_reduce_grad(self, n: int) -> None:
        pass


def _executed_single(cls: type, stage: int, num_stages: int, m: int) -> list[str]:
    log: list[str] = []
    schedule = cls(_RecordingStage(stage, num_stages, log), m)
    schedule._initialize_stage = lambda *a, **k: None
    schedule._step_microbatches()
    return log


@pytest.mark.parametrize(("name", "cls"), [("gpipe", ts.ScheduleGPipe), ("1f1b", ts.Schedule1F1B)])
def test_single_stage_orders_equal_torch_execution(name: str, cls: type) -> None:
    checked = 0
    for p in range(1, 7):
        for m in range(1, 11):
            if name == "1f1b" and m < p:
                with pytest.raises(ValueError):
                    cls(_RecordingStage(0, p, []), m)  # torch refuses too, as check_microbatches does
                with pytest.raises(ScheduleError, match="at least as many micro-batches as stages"):
                    rank_orders(name, p, m)
                continue
            ours = rank_orders(name, p, m)
            for s in range(p):
                assert [str(x) for x in ours[s]] == _executed_single(cls, s, p, m), (name, p, m, s)
                checked += 1
    assert checked > 100


def test_1f1b_torch_ir_differs_only_on_last_rank() -> None:
    # torch 2.13's Schedule1F1B._get_pipeline_order (the debugging IR) numbers the last rank's forwards
    # from 1 (2F1 2B0 2F2 ...); the executed order (checked above) starts at 0. Pin this so a torch
    # fix is noticed; rank_orders follows the execution.
    p, m = 3, 4
    ir = orders_from_torch(ts.Schedule1F1B._get_pipeline_order(SimpleNamespace(_num_stages=p, _n_microbatches=m)))
    ours = rank_orders("1f1b", p, m)
    assert ir[:-1] == ours[:-1]
    assert [str(x) for x in ir[-1]][:3] == ["2F1", "2B0", "2F2"]
    assert [str(x) for x in ours[-1]][:3] == ["2F0", "2B0", "2F1"]


def _torch_looped(schedule: Schedule, ranks: int, v: int, m: int) -> list[list[Step]]:
    order = torch_compute(schedule, ranks, v, m)
    ts._validate_schedule(order, ranks, v * ranks, m)
    return orders_from_torch(order)


@pytest.mark.parametrize("schedule", [Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE])
def test_looped_orders_equal_torch(schedule: Schedule) -> None:
    checked = 0
    for ranks in range(1, 6):
        for v in (1, 2, 3, 4):
            for m in range(1, 17):
                if m % max(1, m // ranks) != 0:
                    with pytest.raises(ScheduleError, match="divisible by max"):
                        check_microbatches(schedule, ranks, v, m)
                    continue
                ours = rank_orders(schedule, ranks * v, m, ranks)
                assert ours == _torch_looped(schedule, ranks, v, m), (schedule, ranks, v, m)
                # and every accepted configuration runs to completion in the simulator
                simulate(Pipeline([1.0] * (ranks * v), [2.0] * (ranks * v), m, schedule, num_ranks=ranks))
                checked += 1
    assert checked == 244  # of 320 tried; the other 76 fail torch's M % rounds check


def _torch_multi(schedule: Schedule, ranks: int, v: int, m: int) -> list[list[Step]]:
    # ScheduleLoopedBFS, ScheduleZBVZeroBubble and ScheduleDualPipeV build each rank's order from the attributes
    # torch_compute fakes; DualPipeV's OVERLAP_F_B actions are expanded by orders_from_torch.
    order = torch_compute(schedule, ranks, v, m)
    ts._validate_schedule(order, ranks, v * ranks, m)
    return orders_from_torch(order)


@pytest.mark.parametrize(
    ("schedule", "stages_per_rank"),
    [(Schedule.LOOPED_BFS, (1, 2, 3)), (Schedule.ZBV, (2,)), (Schedule.DUALPIPEV, (2,))],
)
def test_multi_stage_orders_equal_torch(schedule: Schedule, stages_per_rank: tuple[int, ...]) -> None:
    checked = 0
    for ranks in range(1, 7):
        for v in stages_per_rank:
            for m in range(1, 17):
                if schedule is Schedule.DUALPIPEV and m < 2 * ranks:
                    with pytest.raises(ScheduleError, match="at least as many micro-batches as stages"):
                        check_microbatches(schedule, ranks, v, m)
                    continue
                ours = rank_orders(schedule, ranks * v, m, ranks)
                assert ours == _torch_multi(schedule, ranks, v, m), (schedule, ranks, v, m)
                n = ranks * v
                simulate(Pipeline([1.0] * n, [2.0] * n, m, schedule, num_ranks=ranks, weight_s=[1.0] * n))  # completes
                checked += 1
    assert checked == {Schedule.LOOPED_BFS: 288, Schedule.ZBV: 96, Schedule.DUALPIPEV: 60}[schedule]


def test_v_placement_equals_torch() -> None:
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    for ranks in range(1, 9):
        torch_v = generate_stage_to_rank_mapping(ranks, 2 * ranks, style="v")
        assert stage_to_rank(Schedule.ZBV, 2 * ranks, ranks) == tuple(torch_v[s] for s in range(2 * ranks))
    assert stage_to_rank(Schedule.DUALPIPEV, 8, 4) == (0, 1, 2, 3, 3, 2, 1, 0)
    with pytest.raises(ScheduleError, match="exactly 2 stages per rank"):
        stage_to_rank(Schedule.ZBV, 12, 4)


@pytest.fixture
def one_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("schedule", "v", "m"),
    [
        (Schedule.INTERLEAVED_1F1B, 2, 3),
        (Schedule.INTERLEAVED_1F1B, 3, 4),
        (Schedule.ZERO_BUBBLE, 2, 3),
        (Schedule.ZERO_BUBBLE, 3, 4),
        (Schedule.LOOPED_BFS, 3, 4),
        (Schedule.ZBV, 2, 3),
        (Schedule.DUALPIPEV, 2, 4),
    ],
)
def test_real_torch_schedule_object_matches(one_process_group: None, schedule: Schedule, v: int, m: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    stages = [PipelineStage(torch.nn.Linear(4, 4), s, v, torch.device("cpu")) for s in range(v)]
    cls = getattr(ts, TORCH_SCHEDULE_CLASS[schedule])
    sched = cls(stages, m, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    assert orders_from_torch(sched.pipeline_order) == rank_orders(schedule, v, m, num_ranks=1)
    losses: list[torch.Tensor] = []
    sched.step(torch.randn(2 * m, 4), target=torch.randn(2 * m, 4), losses=losses)
    assert len(losses) == m


def _overlapped(orders: list[list[Step]]) -> list[list[tuple[str, bool]]]:
    return [[(str(step), step.overlapped) for step in order] for order in orders]


def test_dualpipev_marks_the_forwards_torch_pairs_with_a_backward() -> None:
    for ranks in range(1, 6):
        for m in range(2 * ranks, 2 * ranks + 5):
            ours = rank_orders(Schedule.DUALPIPEV, 2 * ranks, m, ranks)
            assert _overlapped(ours) == _overlapped(_torch_multi(Schedule.DUALPIPEV, ranks, 2, m)), (ranks, m)
    paired = [step for order in rank_orders(Schedule.DUALPIPEV, 4, 6, 2) for step in order if step.overlapped]
    # 7 pairs on each rank (torch's lowering printed for R = 2, M = 6); the last rank keeps its first apart
    assert len(paired) == 14 and {step.kind for step in paired} == {"F"}
    assert not rank_orders(Schedule.DUALPIPEV, 4, 6, 2)[1][4].overlapped  # 1F2, then 2B0 on its own


@pytest.mark.parametrize("seed", range(6))
def test_dualpipev_simulated_as_torch_lowers_it(seed: int) -> None:
    # Uneven stages, so that a forward whose send waits for its paired backward shows in the iteration.
    rng = random.Random(seed)
    for ranks in (1, 2, 3, 4):
        for m in (2 * ranks, 2 * ranks + 3):
            n = 2 * ranks
            f = [rng.choice((1.0, 2.0, 3.0)) for _ in range(n)]
            w = [rng.choice((1.0, 2.0)) for _ in range(n)]
            i = [rng.choice((1.0, 2.0, 4.0)) for _ in range(n)]
            times = {"F": f, "I": i, "W": w, "B": [a + b for a, b in zip(i, w, strict=True)]}
            ours = simulate(Pipeline(f, times["B"], m, Schedule.DUALPIPEV, num_ranks=ranks, weight_s=w))
            assert ours.iteration_s == iteration_of_torch_lowering(Schedule.DUALPIPEV, ranks, 2, m, times, 0.0), (
                seed,
                ranks,
                m,
            )
