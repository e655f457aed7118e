"""planner.schedule.receives must place every receive where torch's own lowering (``_add_send_recv``) does,
and the simulator must start a transfer no earlier than its receive is posted."""

from __future__ import annotations

import pytest
import torch.distributed.pipelining.schedules as ts
from torch_lowering import iteration_of_torch_lowering, torch_compute

from planner.schedule.orders import Schedule, orders_from_torch, rank_orders
from planner.schedule.pipeline import Pipeline
from planner.schedule.receives import receive_posts
from planner.schedule.simulate import simulate

_COMPUTE = {ts.FORWARD, ts.FULL_BACKWARD, ts.BACKWARD_INPUT, ts.BACKWARD_WEIGHT, ts.OVERLAP_F_B}


def _torch_posts(compute: dict[int, list[object]], num_stages: int) -> list[list[int]]:
    """From torch's lowered program: for each compute step (sub-actions expanded), the index of the compute
    step its receive follows; a step that receives nothing gets its own index minus 1."""
    stage_rank = {
        sub.stage_index: r for r, actions in compute.items() for a in actions for sub in (a.sub_actions or (a,))
    }
    lowered = ts._add_send_recv({r: list(a) for r, a in compute.items()}, lambda s: stage_rank[s], num_stages)
    out = []
    for rank in sorted(lowered):
        seen, recv_after, steps = 0, {}, []
        for a in lowered[rank]:
            if a.computation_type in (ts.RECV_F, ts.RECV_B):
                recv_after[(a.stage_index, a.microbatch_index, a.computation_type)] = seen - 1
            elif a.computation_type in _COMPUTE:
                for sub in a.sub_actions or (a,):
                    kind = ts.RECV_F if sub.computation_type == ts.FORWARD else ts.RECV_B
                    key = (sub.stage_index, sub.microbatch_index, kind)
                    receives = sub.computation_type != ts.BACKWARD_WEIGHT and key in recv_after
                    steps.append(recv_after[key] if receives else len(steps) - 1)
                seen += len(a.sub_actions or (a,))
        out.append(steps)
    return out


@pytest.mark.parametrize(
    ("schedule", "stages_per_rank"),
    [
        (Schedule.INTERLEAVED_1F1B, (2, 3)),
        (Schedule.ZERO_BUBBLE, (1, 2)),
        (Schedule.LOOPED_BFS, (2,)),
        (Schedule.ZBV, (2,)),
        (Schedule.DUALPIPEV, (2,)),
    ],
)
def test_receives_are_posted_where_torchs_lowering_puts_them(
    schedule: Schedule, stages_per_rank: tuple[int, ...]
) -> None:
    checked = late = 0
    for ranks in range(2, 6):
        for v in stages_per_rank:
            for m in (2 * ranks, 3 * ranks, 4 * ranks, 5 * ranks):
                compute = torch_compute(schedule, ranks, v, m)
                orders = orders_from_torch(compute)
                assert orders == rank_orders(schedule, ranks * v, m, ranks)
                ours = receive_posts(orders, ranks * v)
                assert [list(x) for x in ours] == _torch_posts(compute, ranks * v), (schedule, ranks, v, m)
                late += sum(q == i - 1 for posts in ours for i, q in enumerate(posts))
                checked += 1
    assert checked == 4 * 4 * len(stages_per_rank)
    assert late > 0


def test_interleaved_on_two_ranks_posts_four_receives_of_rank_0_just_before_they_are_needed() -> None:
    # torch 2.13's lowering of interleaved 1F1B, 2 ranks, 2 stages each, 4 micro-batches (rank 0):
    # 0F0 0SEND_F0 2RECV_F0 0F1 0SEND_F1 2RECV_F1 2F0 ... 2RECV_B2 2B2 ... 0RECV_B2 0B2 0RECV_B3 0B3
    orders = rank_orders("interleaved-1f1b", 4, 4, 2)
    posts = receive_posts(orders, 4)[0]
    just_before = [str(s) for i, s in enumerate(orders[0]) if posts[i] == i - 1 and (s.stage, s.kind) != (0, "F")]
    assert just_before == ["2B2", "2B3", "0B2", "0B3"]


def test_a_transfer_starts_when_its_receive_is_posted() -> None:
    # Rank 0's 2B2 needs stage 3's gradient, whose receive is posted right before 2B2: with a link of 5 s
    # the action waits the whole link after the later of its rank's previous action and its producer.
    link = [5.0] * 3
    run = simulate(Pipeline([1.0] * 4, [2.0] * 4, 4, "interleaved-1f1b", comm_forward_s=link, comm_backward_s=link))
    timed = {(a.stage, a.microbatch, a.kind): a for a in run.actions}
    rank0 = [a for a in run.actions if a.rank == 0]
    i = next(k for k, a in enumerate(rank0) if (a.stage, a.microbatch, a.kind) == (2, 2, "B"))
    producer_end = timed[(3, 2, "B")].end_s
    assert rank0[i - 1].end_s > producer_end  # posted after the gradient was sent: the link is not hidden
    assert rank0[i].start_s == pytest.approx(rank0[i - 1].end_s + 5.0)


@pytest.mark.parametrize(
    ("schedule", "v"),
    [
        (Schedule.INTERLEAVED_1F1B, 2),
        (Schedule.INTERLEAVED_1F1B, 3),
        (Schedule.ZERO_BUBBLE, 1),
        (Schedule.ZERO_BUBBLE, 2),
        (Schedule.LOOPED_BFS, 2),
        (Schedule.ZBV, 2),
        (Schedule.DUALPIPEV, 2),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_simulated_with_a_link_as_torch_lowers_it(schedule: Schedule, v: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    for ranks in (2, 3):
        for m in (2 * ranks, 3 * ranks):
            n = ranks * v
            f = [rng.choice((1.0, 2.0, 3.0)) for _ in range(n)]
            w = [rng.choice((1.0, 2.0)) for _ in range(n)]
            i = [rng.choice((1.0, 2.0, 4.0)) for _ in range(n)]
            times = {"F": f, "I": i, "W": w, "B": [a + b for a, b in zip(i, w, strict=True)]}
            link = rng.choice((0.5, 2.0, 5.0))
            split = {"weight_s": w} if schedule.splits_backward else {}
            ours = simulate(
                Pipeline(f, times["B"], m, schedule, num_ranks=ranks, comm_forward_s=[link] * (n - 1),
                         comm_backward_s=[link] * (n - 1), **split),
            )  # fmt: skip
            assert ours.iteration_s == pytest.approx(iteration_of_torch_lowering(schedule, ranks, v, m, times, link))
