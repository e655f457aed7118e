"""torch's own pipeline orders and lowering, read independently of pipeplan's simulator (for the schedule tests)."""

from __future__ import annotations

from types import SimpleNamespace

import torch.distributed.pipelining.schedules as ts

from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule, Step, stage_to_rank


def torch_compute(schedule: Schedule, ranks: int, v: int, m: int) -> dict[int, list[object]]:
    """torch's compute-only orders (idle slots dropped), as its schedule classes build them from these attributes."""
    cls = getattr(ts, TORCH_SCHEDULE_CLASS[schedule])
    if schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE):
        rounds = max(1, m // ranks)
        fake = SimpleNamespace(
            n_local_stages=v, pp_group_size=ranks, _n_microbatches=m, microbatches_per_round=m // rounds
        )
        order = {r: cls._calculate_single_rank_operations(fake, r) for r in range(ranks)}
        if schedule is Schedule.ZERO_BUBBLE:
            fake.pipeline_order = order
            order = cls._add_bubbles_to_actions(fake, v * ranks)
    else:
        fake = SimpleNamespace(pp_group_size=ranks, num_stages=ranks * v, _n_microbatches=m, _stages=[None] * v)
        order = {r: cls._calculate_single_rank_operations(fake, r) for r in range(ranks)}
    return {r: [a for a in actions if a is not None] for r, actions in order.items()}


def iteration_of_torch_lowering(
    schedule: Schedule, ranks: int, v: int, m: int, times: dict[str, list[float]], link_s: float
) -> float:
    """The iteration as torch's own lowering lays out each rank's list, read independently of ``simulate``:
    actions in list order, each send and receive posted when its rank reaches it, a transfer starting when both
    ends are posted and taking ``link_s``, a compute action waiting for its inputs and for the actions before it
    on its rank; a cut inside one rank (the turn of a V) is handed over in memory."""
    stages = ranks * v
    compute = torch_compute(schedule, ranks, v, m)
    rank_of = {s: stage_to_rank(schedule, stages, ranks)[s] for s in range(stages)}
    lists = ts._add_send_recv({r: list(a) for r, a in compute.items()}, rank_of.__getitem__, stages)
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, mb) -> end; SEND_*/RECV_* -> posted
    clock, pos = [0.0] * ranks, [0] * ranks

    def arrival(kind: str, s: int, mb: int) -> float | None:
        """When the input of the action (kind, s, mb) is on its rank; None: not yet known."""
        if kind == "F":
            if s == 0:
                return 0.0
            if rank_of[s - 1] == rank_of[s]:
                return done.get(("F", s - 1, mb))
            sent, posted = done.get(("SEND_F", s - 1, mb)), done.get(("RECV_F", s, mb))
        else:
            if s == stages - 1:
                return done.get(("F", s, mb))
            own = done.get(("F", s, mb))
            if rank_of[s + 1] == rank_of[s]:
                grad = done.get(("B", s + 1, mb), done.get(("I", s + 1, mb)))
                return None if own is None or grad is None else max(own, grad)
            sent, posted = done.get(("SEND_B", s + 1, mb)), done.get(("RECV_B", s, mb))
            if own is None:
                return None
        return None if sent is None or posted is None else max(sent, posted) + link_s

    while any(pos[r] < len(lists[r]) for r in range(ranks)):
        progressed = False
        for r in range(ranks):
            while pos[r] < len(lists[r]):
                action = lists[r][pos[r]]
                ctype = action.computation_type.value
                if ctype in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
                    done[(ctype, action.stage_index, action.microbatch_index)] = clock[r]
                    pos[r] += 1
                    continue
                steps = [Step.parse(str(p)) for p in action.sub_actions or (action,)]
                first = steps[0]
                needed = done.get(("I", first.stage, first.microbatch)) if first.kind == "W" else None
                ready = arrival(first.kind, first.stage, first.microbatch) if first.kind != "W" else needed
                if ready is None or any(
                    arrival(st.kind, st.stage, st.microbatch) is None for st in steps[1:] if st.kind != "W"
                ):
                    break
                for st in steps:
                    start = arrival(st.kind, st.stage, st.microbatch) if st.kind != "W" else needed
                    clock[r] = max(clock[r], start) + times[st.kind][st.stage]
                    done[(st.kind, st.stage, st.microbatch)] = clock[r]
                pos[r] += 1
                progressed = True
        assert progressed, "torch's lowering deadlocks in this reading"
    return max(clock)
