"""Where torch's multi-stage runtime posts each receive, relative to the rank's compute actions.

torch's ``_PipelineScheduleRuntime`` (interleaved-1f1b, zero-bubble, looped-bfs, zbv, dualpipev) runs a
program made by ``_add_send_recv`` (torch/distributed/pipelining/schedules.py): it walks the ranks in turn,
one compute action each per pass, appending an action to its rank's program once the action's input is
there, and, when the action sends across ranks, appending the send to its own program and the matching
receive to the receiver's program *at that moment*. A receive therefore sits after however many compute
actions its rank had placed when the sender's action was placed, which is not always ahead of time: a
receive placed right before the action that needs it cannot start its transfer any earlier than the rank
arriving there (gloo and NCCL match a send with its receive; docs/cost-model.md, "Receives").

:func:`receive_posts` replays that lowering on pipeplan's own orders (pure Python, no torch) and returns,
per rank and per compute action that receives, the index of the rank's compute action after which its
receive is posted. The tests hold it equal to torch's lowering.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedule.orders import Step, ranks_of_stages

__all__ = ["receive_posts"]


def receive_posts(orders: Sequence[Sequence[Step]], num_stages: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, per compute action of ``orders[rank]``: the index in that order of the action after which
    the action's receive is posted (-1: before the rank's first action), or the action's own index minus 1
    where it receives nothing (its input is on the rank: stage 0's forward, the last stage's backward, the
    turn of a V, a W).

    A forward paired with the action after it (``Step.overlapped``, torch's ``OVERLAP_F_B``) is placed with
    that action as one, as torch does.

    Raises:
        ValueError: the orders cannot be lowered (an action waits for an input no rank sends).
    """
    stage_rank = ranks_of_stages(orders, num_stages)
    last = num_stages - 1

    def sends(step: Step) -> tuple[int, int, str] | None:
        """The receive ``step`` causes on another rank: (rank, stage, kind of the receiving action)."""
        if step.kind == "F" and step.stage != last and stage_rank[step.stage + 1] != stage_rank[step.stage]:
            return stage_rank[step.stage + 1], step.stage + 1, "F"
        if step.kind in ("B", "I") and step.stage != 0 and stage_rank[step.stage - 1] != stage_rank[step.stage]:
            return stage_rank[step.stage - 1], step.stage - 1, "B"
        return None

    # What each rank has received (stage, micro-batch, "F" or "B") and computed (stage, micro-batch, kind).
    received: list[set[tuple[int, int, str]]] = [set() for _ in orders]
    done: list[set[tuple[int, int, str]]] = [set() for _ in orders]
    placed = [0] * len(orders)  # compute actions placed so far, per rank
    posted: list[dict[tuple[int, int, str], int]] = [{} for _ in orders]  # receive -> index it follows

    def ready(rank: int, step: Step) -> bool:
        s, m = step.stage, step.microbatch
        if step.kind == "F" and s != 0:
            return (s, m, "F") in received[rank] or (s - 1, m, "F") in done[rank]
        if step.kind in ("B", "I") and s != last:
            return (s, m, "B") in received[rank] or (s + 1, m, "I") in done[rank] or (s + 1, m, "B") in done[rank]
        return True

    pos = [0] * len(orders)
    while any(p < len(o) for p, o in zip(pos, orders, strict=True)):
        progressed = False
        for rank, order in enumerate(orders):
            p = pos[rank]
            if p >= len(order):
                continue
            end = p + 1
            while order[end - 1].overlapped and end < len(order):
                end += 1
            group = order[p:end]
            if not all(ready(rank, step) for step in group):
                continue
            for step in group:
                done[rank].add((step.stage, step.microbatch, step.kind))
                target = sends(step)
                if target is not None:
                    to_rank, stage, kind = target
                    received[to_rank].add((stage, step.microbatch, kind))
                    posted[to_rank][(stage, step.microbatch, kind)] = placed[to_rank] - 1
            placed[rank] += len(group)
            pos[rank] += len(group)
            progressed = True
        if not progressed:
            blocked = ", ".join(f"rank {r}: {orders[r][p]}" for r, p in enumerate(pos) if p < len(orders[r]))
            raise ValueError(f"orders cannot be lowered to sends and receives; blocked at {blocked}")

    out = []
    for rank, order in enumerate(orders):
        after = []
        for i, step in enumerate(order):
            kind = "F" if step.kind == "F" else "B"
            after.append(posted[rank].get((step.stage, step.microbatch, kind), i - 1) if step.kind != "W" else i - 1)
        out.append(tuple(after))
    return tuple(out)
