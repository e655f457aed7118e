"""The event simulator against exact hand-computed and textbook values (times are binary fractions)."""

from __future__ import annotations

import json
import random

import pytest

from planner.errors import ScheduleError, UsageError
from planner.schedule.orders import Schedule, Step, min_microbatches, rank_orders, stage_to_rank
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, ScheduleDeadlockError, in_flight_per_stage, simulate


def _gpipe_formula(f: list[float], b: list[float], m: int) -> float:
    return sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)


def _textbook(f: list[float], b: list[float], m: int) -> float:
    return sum(f) + sum(b) + (m - 1) * max(x + y for x, y in zip(f, b, strict=True))


# ---- schedule names and placement -------------------------------------------------------------


def test_parse_schedule_names() -> None:
    assert Schedule.parse("1F1B") is Schedule.ONE_F_ONE_B
    assert Schedule.parse("interleaved_1f1b") is Schedule.INTERLEAVED_1F1B
    with pytest.raises(ScheduleError, match=r"unknown schedule 'pipedream' \(valid: naive, gpipe, 1f1b"):
        Schedule.parse("pipedream")


def test_step_notation_round_trips() -> None:
    assert str(Step(2, 0, "F")) == "2F0"
    assert Step.parse("11W3") == Step(11, 3, "W")


def test_looped_placement() -> None:
    assert stage_to_rank(Schedule.INTERLEAVED_1F1B, 8, 4) == (0, 1, 2, 3, 0, 1, 2, 3)
    assert stage_to_rank(Schedule.GPIPE, 3, 3) == (0, 1, 2)


def test_min_microbatches() -> None:
    assert min_microbatches(Schedule.ONE_F_ONE_B, 4, 1) == 4
    assert min_microbatches(Schedule.GPIPE, 4, 1) == 1
    assert min_microbatches(Schedule.INTERLEAVED_1F1B, 4, 2) == 1


def test_1f1b_order_warmup_then_alternate() -> None:
    orders = rank_orders("1f1b", 3, 4)
    assert [str(s) for s in orders[0]] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"]
    assert [str(s) for s in orders[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]


# ---- uniform stages ---------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "bubble"), [(4, 0.75), (8, 0.875)])
def test_naive(p: int, bubble: float) -> None:
    r = simulate(Pipeline([1.0] * p, [1.0] * p, 1, "naive"))
    assert r.iteration_s == 2 * p
    assert r.bubble_fraction == bubble


def test_gpipe_uniform_p4_m8() -> None:
    r = simulate(Pipeline([1.0] * 4, [1.0] * 4, 8, "gpipe"))
    assert r.iteration_s == 22.0
    assert 1 - r.bubble_fraction == pytest.approx(8 / 11, abs=1e-15)
    assert r.peak_in_flight == (8, 8, 8, 8)
    assert r.busy_s == (16.0, 16.0, 16.0, 16.0)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 2, 5, 9])
def test_gpipe_and_1f1b_uniform_formula(p: int, m: int) -> None:
    t = 0.5
    g = simulate(Pipeline([t] * p, [t] * p, m, "gpipe"))
    assert g.iteration_s == 2 * (m + p - 1) * t
    assert g.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-15)
    if m >= p:
        o = simulate(Pipeline([t] * p, [t] * p, m, "1f1b"))
        assert o.iteration_s == g.iteration_s
        assert o.bubble_fraction == pytest.approx(g.bubble_fraction, abs=1e-15)
        assert o.peak_in_flight == tuple(min(p - s, m) for s in range(p))


def test_in_flight_per_stage() -> None:
    assert in_flight_per_stage(Schedule.ONE_F_ONE_B, 4, 8) == (4, 3, 2, 1)
    assert in_flight_per_stage(Schedule.ONE_F_ONE_B, 3, 3) == (3, 2, 1)
    assert in_flight_per_stage(Schedule.GPIPE, 4, 6) == (6, 6, 6, 6)
    # torch's interleaved warm-up is 2 per hop (vs 1 for 1F1B), so even with one stage per rank it holds more
    assert in_flight_per_stage(Schedule.INTERLEAVED_1F1B, 4, 8, num_ranks=4) == (7, 5, 3, 1)


@pytest.mark.parametrize("schedule", list(Schedule))
def test_in_flight_counts_equal_the_orders(schedule: Schedule) -> None:
    # in_flight_per_stage counts without walking the orders: a closed form (every forward before any backward),
    # or the fullest of the stage's memory moments. Both against the orders walked action by action.
    from planner.schedule.simulate import _peak_in_flight

    checked = 0
    for ranks in (1, 2, 3, 4):
        for v in (2,) if schedule.v_shape else (1, 2, 3) if schedule.multi_stage else (1,):
            for m in range(1, 10):
                try:
                    orders = rank_orders(schedule, ranks * v, m, ranks)
                except ScheduleError:
                    with pytest.raises(ScheduleError):
                        in_flight_per_stage(schedule, ranks * v, m, ranks)
                    continue
                counted = _peak_in_flight(orders, ranks * v)
                assert in_flight_per_stage(schedule, ranks * v, m, ranks) == counted
                if schedule in (Schedule.NAIVE, Schedule.GPIPE, Schedule.LOOPED_BFS):
                    assert counted == (m,) * (ranks * v)
                checked += 1
    assert checked >= (4 if schedule is Schedule.NAIVE else 20)  # naive runs one micro-batch only


@pytest.mark.parametrize(
    ("p", "v", "m"), [(4, 2, 8), (4, 2, 4), (4, 2, 6), (4, 2, 12), (4, 4, 8), (2, 2, 4), (8, 2, 16), (4, 3, 8)]
)
def test_interleaved_bubble_equals_megatron_when_m_at_least_ranks(p: int, v: int, m: int) -> None:
    # Per-chunk f = b = 1 (a stage of time t = v split in v chunks). Exact value the simulator gives:
    # iteration = 2 (v M + P - 1) chunk times, i.e. bubble time / ideal time = (P - 1) / (v M).
    r = simulate(Pipeline([1.0] * (p * v), [1.0] * (p * v), m, "interleaved-1f1b", num_ranks=p))
    assert r.iteration_s == 2 * (v * m + p - 1)
    ideal = 2 * v * m
    assert (r.iteration_s - ideal) / ideal == pytest.approx((p - 1) / (v * m), abs=1e-15)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-15)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 2), (3, 2, 2), (4, 3, 1), (8, 2, 4)])
def test_interleaved_with_fewer_microbatches_than_ranks(p: int, v: int, m: int) -> None:
    # Below M = P torch's rounds degenerate: 2 (v P + M - 1) chunk times, above (P - 1)/(v M).
    r = simulate(Pipeline([1.0] * (p * v), [1.0] * (p * v), m, "interleaved-1f1b", num_ranks=p))
    assert r.iteration_s == 2 * (v * p + m - 1)
    assert r.iteration_s > 2 * (v * m + p - 1)


def test_interleaved_default_ranks_is_half_the_stages() -> None:
    r = simulate(Pipeline([1.0] * 8, [1.0] * 8, 8, "interleaved-1f1b"))
    assert r.num_ranks == 4
    assert r.iteration_s == 38.0


def test_zero_bubble_beats_1f1b_when_weight_grad_fills_the_bubble() -> None:
    # The acceptance case: P = 4, M = 8, every stage F = B = W = 1 (B the input gradient, so the
    # full backward is B + W = 2), no communication. 1F1B: (M + P - 1)(F + B + W) = 33, bubble 3/11.
    one = simulate(Pipeline([1.0] * 4, [2.0] * 4, 8, "1f1b"))
    assert one.iteration_s == 33.0
    assert one.bubble_fraction == pytest.approx(3 / 11, abs=1e-15)
    zb = simulate(Pipeline([1.0] * 4, [2.0] * 4, 8, "zero-bubble", weight_s=[1.0] * 4))
    # ZB-H1's published bubble (Qi et al., ICLR 2024, section 3.1) is (P - 1)(F + B - W) = 3; torch's
    # ZB1P order gives exactly that: M (F + B + W) + 3 = 27, a third of 1F1B's bubble time of 9.
    published = (4 - 1) * (1 + 1 - 1)
    assert zb.iteration_s == 8 * 3 + published == 27.0
    assert (zb.iteration_s - 24) <= (one.iteration_s - 24) / 2
    assert zb.peak_in_flight == (4, 4, 4, 4)  # ZB-H1 keeps 1F1B's memory bound of P micro-batches
    assert {a.kind for a in zb.actions} == {"F", "I", "W"}


def test_unsplit_backward_without_weight_times() -> None:
    # No measured W: the backward is not guessed apart, I carries it all and the W actions cost 0.
    zb = simulate(Pipeline([1.0] * 4, [2.0] * 4, 8, "zero-bubble"))
    assert all(a.duration_s == 0.0 for a in zb.actions if a.kind == "W")
    assert zb.iteration_s == 33.0


@pytest.mark.parametrize(
    ("schedule", "expected", "in_flight"),
    [
        ("zero-bubble", 25.5, (8, 8, 8, 8, 4, 4, 4, 4)),
        ("zbv", 25.5, (8, 7, 6, 5, 4, 3, 2, 1)),
        # ZB-V's work and order but for the pairs: a forward paired with a backward sends after it
        ("dualpipev", 27.0, (8, 7, 6, 5, 4, 3, 2, 1)),
        ("interleaved-1f1b", 28.5, (8, 8, 7, 5, 4, 4, 3, 1)),
        ("looped-bfs", 28.5, (8,) * 8),
    ],
)
def test_two_stages_per_rank_p4_m8(schedule: str, expected: float, in_flight: tuple[int, ...]) -> None:
    # The same work as above cut into 8 half-size stages (F = 0.5, B = W = 0.5 per stage): each
    # schedule's exact iteration and in-flight micro-batches per stage under its own placement.
    r = simulate(Pipeline([0.5] * 8, [1.0] * 8, 8, schedule, num_ranks=4, weight_s=[0.5] * 8))
    assert r.iteration_s == expected
    assert r.peak_in_flight == in_flight
    assert r.bubble_fraction == pytest.approx(1 - 24 / expected, abs=1e-12)


def test_v_turn_costs_no_link_time() -> None:
    # zbv puts stages 1 and 2 on rank 1: their cut is a hand-over in memory, the other cuts pay the link.
    base = simulate(Pipeline([1.0] * 4, [2.0] * 4, 4, "zbv", num_ranks=2, weight_s=[1.0] * 4))
    comm = [0.0, 5.0, 0.0]
    turn = simulate(Pipeline([1.0] * 4, [2.0] * 4, 4, "zbv", num_ranks=2, weight_s=[1.0] * 4, comm_forward_s=comm))
    assert turn.iteration_s == base.iteration_s
    assert turn.num_ranks == 2 and {a.rank for a in turn.actions if a.stage in (1, 2)} == {1}


# ---- uneven stages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("f", "b", "m", "expected"),
    [
        ([1, 2, 1], [2, 4, 2], 4, 4 + 3 * 2 + 8 + 3 * 4),
        ([3, 1], [1, 5], 3, 4 + 2 * 3 + 6 + 2 * 5),
        ([0.5, 0.25, 2, 1], [1, 0.5, 4, 3], 5, 3.75 + 4 * 2 + 8.5 + 4 * 4),
    ],
)
def test_gpipe_uneven_hand_cases(f: list[float], b: list[float], m: int, expected: float) -> None:
    assert simulate(Pipeline(f, b, m, "gpipe")).iteration_s == expected
    assert _gpipe_formula(f, b, m) == expected


def test_gpipe_uneven_random_cases_match_formula_exactly() -> None:
    rng = random.Random(1234)
    for _ in range(200):
        p = rng.randint(1, 7)
        m = rng.randint(1, 12)
        # multiples of 1/64: sums are exact in binary floating point, so == is meaningful
        f = [rng.randint(1, 256) / 64 for _ in range(p)]
        b = [rng.randint(1, 512) / 64 for _ in range(p)]
        assert simulate(Pipeline(f, b, m, "gpipe")).iteration_s == _gpipe_formula(f, b, m), (f, b, m)


def test_1f1b_never_exceeds_textbook_formula() -> None:
    rng = random.Random(99)
    below = 0
    for _ in range(200):
        p = rng.randint(1, 6)
        m = rng.randint(p, 12)
        f = [rng.randint(1, 256) / 64 for _ in range(p)]
        b = [rng.randint(1, 512) / 64 for _ in range(p)]
        r = simulate(Pipeline(f, b, m, "1f1b"))
        assert r.iteration_s <= _textbook(f, b, m), (f, b, m)
        below += r.iteration_s < _textbook(f, b, m)
    assert below > 0


def test_1f1b_strictly_below_textbook_hand_case() -> None:
    # P=2, M=2, f=(3,2), b=(3,1). Rank 0: F0 [0,3] F1 [3,6]; rank 1: F0 [3,5] B0 [5,6] F1 [6,8] B1 [8,9];
    # rank 0: B0 [6,9] B1 [9,12]. Iteration 12 < textbook 5 + 4 + 1 * max(6, 3) = 15 (= GPipe here).
    r = simulate(Pipeline([3, 2], [3, 1], 2, "1f1b"))
    assert r.iteration_s == 12.0
    assert _textbook([3, 2], [3, 1], 2) == 15.0
    assert simulate(Pipeline([3, 2], [3, 1], 2, "gpipe")).iteration_s == 15.0
    assert r.bottleneck_stage == 0
    assert r.busy_s == (12.0, 6.0)
    assert r.bubble_fraction == 1 - 18 / 24


# ---- communication ----------------------------------------------------------------------------


def test_communication_delays_hand_case() -> None:
    # GPipe P=3 M=2, f=(1,2,1), b=(2,2,1), comm forward (0.5, 0.25), backward (0.125, 0.5). A receive is
    # posted when its rank is free (torch's single-stage schedules), so a transfer that could have
    # left earlier still takes its link time from then:
    # rank0 F0 [0,1] F1 [1,2]; rank1 F0 [1.5,3.5] F1 [4,6] (free at 3.5, + 0.5);
    # rank2 F0 [3.75,4.75] F1 [6.25,7.25] B0 [7.25,8.25] B1 [8.25,9.25];
    # rank1 B0 [8.75,10.75] B1 [11.25,13.25]; rank0 B0 [10.875,12.875] B1 [13.375,15.375].
    r = simulate(Pipeline([1, 2, 1], [2, 2, 1], 2, "gpipe", comm_forward_s=[0.5, 0.25], comm_backward_s=[0.125, 0.5]))
    assert r.iteration_s == 15.375
    spans = {(a.stage, a.kind, a.microbatch): (a.start_s, a.end_s) for a in r.actions}
    assert spans[(2, "F", 0)] == (3.75, 4.75)
    assert spans[(1, "F", 1)] == (4.0, 6.0)
    assert spans[(1, "B", 0)] == (8.75, 10.75)
    assert spans[(0, "B", 0)] == (10.875, 12.875)
    # communication occupies no compute: busy time is compute only
    assert r.busy_s == (6.0, 8.0, 4.0)


def test_receives_posted_ahead_by_multi_stage_schedules() -> None:
    # The same rule, read the other way: torch's multi-stage runtime posts receives ahead of the action
    # that needs them (its lowering, _add_send_recv), so a transfer that left early has arrived. P = 2,
    # M = 2, f = b = 1, a link of 1 each way; rank 1 runs F0 [2, 3], then B0 (or I0, unsplit) [3, 4], then
    # F1, whose input rank 0 finished at 2. Zero-bubble (multi-stage): it arrived at 3, F1 starts at 4.
    # 1F1B (single-stage): the receive is posted at 4, F1 starts at 4 + 1.
    ahead = simulate(Pipeline([1, 1], [1, 1], 2, "zero-bubble", comm_forward_s=[1.0], comm_backward_s=[1.0]))
    late = simulate(Pipeline([1, 1], [1, 1], 2, "1f1b", comm_forward_s=[1.0], comm_backward_s=[1.0]))
    spans_ahead = {(a.stage, a.kind, a.microbatch): a.start_s for a in ahead.actions}
    spans_late = {(a.stage, a.kind, a.microbatch): a.start_s for a in late.actions}
    assert spans_ahead[(1, "F", 1)] == 4.0
    assert spans_late[(1, "F", 1)] == 5.0


def test_zero_comm_lists_equal_no_comm() -> None:
    a = simulate(Pipeline([1, 2], [2, 3], 3, "1f1b"))
    b = simulate(Pipeline([1, 2], [2, 3], 3, "1f1b", comm_forward_s=[0.0], comm_backward_s=[0.0]))
    assert a == b


# ---- result object ----------------------------------------------------------------------------


def test_to_dict_is_json_ready() -> None:
    r = simulate(Pipeline([1, 1], [1, 1], 2, "1f1b"))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["schedule"] == "1f1b"
    assert d["iteration_s"] == 6.0
    assert d["peak_in_flight"] == [2, 1]
    assert len(d["actions"]) == 8
    assert d["actions"][0] == {
        "rank": 0,
        "stage": 0,
        "microbatch": 0,
        "kind": "F",
        "start_s": 0.0,
        "end_s": 1.0,
        "overhead_s": 0.0,
    }
    assert d["overhead_s"] == [0.0, 0.0] and d["step_tail_s"] == [0.0, 0.0] and d["comm_wait_s"] == [0.0, 0.0]


def test_runtime_overhead_lengthens_every_action() -> None:
    # GPipe, P = 2, M = 2, F = B = 1, overhead 0.5 per action: each action takes 1.5, so the
    # iteration is (M + P - 1) * 1.5 * 2 = 9 instead of 6, and each rank carries 4 * 0.5 of overhead.
    r = simulate(Pipeline([1, 1], [1, 1], 2, "gpipe", runtime=RuntimeTerms(action_overhead_s=0.5)))
    assert r.iteration_s == 9.0
    assert r.overhead_s == (2.0, 2.0)
    assert r.busy_s == (4.0, 4.0)


def test_step_tail_ends_each_rank() -> None:
    # 1F1B, P = 2, M = 2: rank 0 ends at 6, rank 1 at 5; tails 0.5 and 2 give 6.5 and 7.
    r = simulate(Pipeline([1, 1], [1, 1], 2, "1f1b", runtime=RuntimeTerms(step_tail_s=(0.5, 2.0))))
    assert r.iteration_s == 7.0
    tails = [a for a in r.actions if a.kind == "S"]
    assert [(a.rank, a.start_s, a.end_s) for a in tails] == [(0, 6.0, 6.5), (1, 5.0, 7.0)]


def test_colocation_slows_every_action_of_a_pipeline() -> None:
    # GPipe, P = 2, M = 2, F = B = 1: 6 without co-location. k = 2 makes every action 2 long, those that
    # overlap no other rank's compute (the fill and the drain) too: 12.
    r = simulate(Pipeline([1, 1], [1, 1], 2, "gpipe", runtime=RuntimeTerms(compute_scale=2.0)))
    assert r.iteration_s == 12.0
    assert r.busy_s == (8.0, 8.0)


def test_colocation_leaves_one_rank_alone() -> None:
    # One rank is no pipeline: nothing runs beside it, it computes as profiled (2 x (2 + 3)).
    assert simulate(Pipeline([2], [3], 2, "gpipe", runtime=RuntimeTerms(compute_scale=3.0))).iteration_s == 10.0


def test_colocation_with_a_link() -> None:
    # k = 2 and a 1 s forward link: rank 0's forwards at [0, 2], [2, 4]; rank 1's first at [3, 5] (its
    # receive posted when needed: the producer's end + the link), its second at max(4, 5) + 1 = [6, 8],
    # its backwards [8, 10], [10, 12]; rank 0's backwards follow each gradient: [10, 12], [12, 14].
    r = simulate(Pipeline([1, 1], [1, 1], 2, "gpipe", comm_forward_s=[1.0], runtime=RuntimeTerms(compute_scale=2.0)))
    assert [(a.rank, a.kind, a.start_s, a.end_s) for a in r.actions if a.rank == 1] == [
        (1, "F", 3.0, 5.0), (1, "F", 6.0, 8.0), (1, "B", 8.0, 10.0), (1, "B", 10.0, 12.0)
    ]  # fmt: skip
    assert r.iteration_s == 14.0
    assert r.busy_s == (8.0, 8.0)


def test_a_machine_twice_as_slow_doubles_every_compute_term_and_keeps_the_colocation_ratio() -> None:
    terms = RuntimeTerms(action_overhead_s=0.5, step_tail_s=(0.5, 2.0), compute_scale=2.0)
    slow = terms.at_speed(2.0)
    assert (slow.action_overhead_s, slow.step_tail_s, slow.compute_scale) == (1.0, (1.0, 4.0), 2.0)
    base = simulate(Pipeline([1, 1], [1, 1], 2, "1f1b", runtime=terms))
    doubled = simulate(Pipeline([2, 2], [2, 2], 2, "1f1b", runtime=slow))
    assert doubled.iteration_s == 2 * base.iteration_s and doubled.busy_s == tuple(2 * b for b in base.busy_s)
    # a link does not compute: it keeps its time (the iteration then grows by less than twice)
    plain = RuntimeTerms(action_overhead_s=0.5, step_tail_s=(0.5, 2.0))
    linked = simulate(Pipeline([1, 1], [1, 1], 2, "1f1b", comm_forward_s=[1.0], runtime=plain))
    slower = simulate(Pipeline([2, 2], [2, 2], 2, "1f1b", comm_forward_s=[1.0], runtime=plain.at_speed(2.0)))
    assert linked.iteration_s < slower.iteration_s < 2 * linked.iteration_s


def test_comm_wait_counts_link_time_only() -> None:
    # GPipe, P = 2, M = 1, link 0.25 each way: rank 1 waits 1 for F(0,0), of which 0.25 is the link;
    # rank 0 waits for the gradient: B(1,0) ends at 1.25 + 2 = 3.25, + 0.25 link.
    r = simulate(Pipeline([1, 1], [1, 1], 1, "gpipe", comm_forward_s=[0.25], comm_backward_s=[0.25]))
    assert r.comm_wait_s == (0.25, 0.25)
    assert r.iteration_s == 4.5


def test_runtime_terms_refuse_negative_values() -> None:
    with pytest.raises(UsageError, match="finite and >= 0"):
        RuntimeTerms(action_overhead_s=-1.0)
    with pytest.raises(UsageError, match="compute_scale"):
        RuntimeTerms(compute_scale=0.0)
    with pytest.raises(UsageError, match="step_tail_s has 1 values for 2 ranks"):
        simulate(Pipeline([1, 1], [1, 1], 2, "gpipe", runtime=RuntimeTerms(step_tail_s=(1.0,))))


def test_orders_override_runs_given_order() -> None:
    # A GPipe order handed in explicitly gives the GPipe result under the 1f1b label.
    orders = rank_orders("gpipe", 2, 3)
    r = simulate(Pipeline([1, 1], [1, 1], 3, "1f1b"), orders=orders)
    assert r.iteration_s == simulate(Pipeline([1, 1], [1, 1], 3, "gpipe")).iteration_s == 8.0


def test_deadlocking_order_raises_internal_error() -> None:
    bad = [[Step(0, 0, "F"), Step(0, 0, "B")], [Step(1, 0, "B"), Step(1, 0, "F")]]
    with pytest.raises(ScheduleDeadlockError, match="blocked at rank 0: 0B0, rank 1: 1B0"):
        simulate(Pipeline([1, 1], [1, 1], 1, "gpipe"), orders=bad)


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"forward_s": [1, 0]}, UsageError, r"forward_s\[1\] = 0.0 must be finite and > 0"),
        ({"backward_s": [1, -2]}, UsageError, r"backward_s\[1\] = -2.0 must be finite and > 0"),
        ({"backward_s": [1]}, UsageError, "backward_s has 1 values, expected 2"),
        ({"num_microbatches": 0}, UsageError, "num_microbatches = 0 must be an integer >= 1"),
        ({"comm_forward_s": [1, 1]}, UsageError, "comm_forward_s has 2 values, expected 1"),
        ({"comm_backward_s": [float("nan")]}, UsageError, r"comm_backward_s\[0\] = nan must be finite and >= 0"),
        ({"schedule": "1f1b", "num_microbatches": 1}, ScheduleError, "at least as many micro-batches as stages"),
        ({"schedule": "naive", "num_microbatches": 2}, ScheduleError, "naive runs exactly 1 micro-batch"),
        ({"num_ranks": 1}, ScheduleError, "runs one stage per rank"),
        ({"schedule": "zero-bubble", "weight_s": [1, 5]}, UsageError, r"weight_s\[1\] = 5.0 must be at most"),
        ({"schedule": "zero-bubble", "input_s": [1, 1]}, UsageError, "input_s needs weight_s"),
        ({"schedule": "zbv", "num_ranks": 2}, ScheduleError, r"exactly 2 stages per rank in a V \(stages: 2"),
        ({"schedule": "dualpipev", "num_ranks": 1, "num_microbatches": 1}, ScheduleError, "at least as many"),
    ],
)
def test_bad_input(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    args: dict[str, object] = {
        "forward_s": [1, 1],
        "backward_s": [2, 2],
        "num_microbatches": 4,
        "schedule": "gpipe",
    }
    args.update(kwargs)
    with pytest.raises(error, match=message):
        simulate(Pipeline(**args))  # type: ignore[arg-type]


def test_interleaved_bad_placement_and_microbatches() -> None:
    with pytest.raises(ScheduleError, match=r"multiple of the number of ranks \(stages: 6, ranks: 4\)"):
        simulate(Pipeline([1] * 6, [1] * 6, 8, "interleaved-1f1b", num_ranks=4))
    with pytest.raises(ScheduleError, match=r"divisible by max\(1, M // ranks\) = 2 .*nearby valid counts"):
        simulate(Pipeline([1] * 8, [1] * 8, 9, "interleaved-1f1b", num_ranks=4))
    with pytest.raises(UsageError, match="give num_ranks"):
        simulate(Pipeline([1] * 5, [1] * 5, 8, "interleaved-1f1b"))


def test_resume_extra_grows_with_the_idle_gap_before_an_action() -> None:
    # GPipe, P = 2, M = 1, F = B = 1; resume points (gap 2: F +0.5, B +0.25), linear from 0 and flat after.
    # Rank 1's F waits 1 (rank 0's F): +0.25, [1, 2.25]; its B follows at once: [2.25, 3.25]. Rank 0's B
    # waits from 1 to 3.25 (2.25 > 2): +0.25, [3.25, 4.5]. The extras are compute, not overhead.
    terms = RuntimeTerms(resume=((2.0, 0.5, 0.25),))
    r = simulate(Pipeline([1, 1], [1, 1], 1, "gpipe", runtime=terms))
    assert r.iteration_s == 4.5
    assert [(a.rank, a.kind, a.start_s, a.end_s) for a in r.actions] == [
        (0, "F", 0.0, 1.0),
        (0, "B", 3.25, 4.5),
        (1, "F", 1.0, 2.25),
        (1, "B", 2.25, 3.25),
    ]
    assert r.busy_s == (2.25, 2.25) and r.overhead_s == (0.0, 0.0)
    assert r.resume == terms.resume
    assert simulate(Pipeline([1, 1], [1, 1], 1, "gpipe")).iteration_s == 4.0


def test_resume_interpolates_between_points() -> None:
    from planner.schedule.simulate import _resume_extra

    points = ((0.001, 0.2, 0.1), (0.01, 0.8, 0.6))
    assert _resume_extra(points, 0.0005, True) == pytest.approx(0.1)
    assert _resume_extra(points, 0.0055, True) == pytest.approx(0.5)
    assert _resume_extra(points, 0.0055, False) == pytest.approx(0.35)
    assert _resume_extra(points, 1.0, False) == 0.6


def test_resume_points_must_have_increasing_positive_gaps() -> None:
    with pytest.raises(UsageError, match="resume gaps"):
        RuntimeTerms(resume=((0.01, 0.1, 0.1), (0.001, 0.1, 0.1)))
    with pytest.raises(UsageError, match="resume gaps"):
        RuntimeTerms(resume=((0.0, 0.1, 0.1),))
    with pytest.raises(UsageError, match="finite and >= 0"):
        RuntimeTerms(resume=((0.01, -0.1, 0.1),))
    slower = RuntimeTerms(resume=((0.01, 0.1, 0.2),)).at_speed(2.0)
    assert slower.resume == ((0.01, 0.2, 0.4),)


def test_a_transfer_costs_compute_on_both_its_ranks_in_proportion_to_its_bytes() -> None:
    # 1 s per MB: stage 0's F sends 2 MB, stage 1's F receives them; stage 1's B sends 1 MB of gradient back,
    # stage 0's B receives it. The same as stages that long, with no transfer cost.
    terms = RuntimeTerms(transfer_compute_s_per_byte=1e-6)
    charged = simulate(
        Pipeline(
            [1, 1], [2, 2], 3, "1f1b", runtime=terms, cut_forward_bytes=[2_000_000], cut_backward_bytes=[1_000_000]
        )
    )
    longer = simulate(Pipeline([3, 3], [3, 3], 3, "1f1b"))
    assert charged.iteration_s == pytest.approx(longer.iteration_s)
    assert charged.busy_s == pytest.approx(longer.busy_s)  # compute the copies took, not overhead
    assert charged.overhead_s == (0.0, 0.0)
    assert simulate(Pipeline([1, 1], [2, 2], 3, "1f1b", cut_forward_bytes=[2_000_000])).iteration_s == pytest.approx(
        simulate(Pipeline([1, 1], [2, 2], 3, "1f1b")).iteration_s
    )  # no cost per byte: bytes change nothing
    slower = terms.at_speed(2.0)
    assert slower.transfer_compute_s_per_byte == 2e-6  # the machine's own work: it scales with the machine


def test_the_turn_of_a_v_moves_no_bytes_and_costs_no_transfer_compute() -> None:
    # zbv on 2 ranks: stages 0 and 3 on rank 0, 1 and 2 on rank 1; the cut 1 -> 2 is the turn, in memory.
    terms = RuntimeTerms(transfer_compute_s_per_byte=1.0)
    cuts = {"cut_forward_bytes": [1, 5, 1], "cut_backward_bytes": [1, 5, 1]}
    charged = simulate(Pipeline([1] * 4, [2] * 4, 4, "zbv", runtime=terms, **cuts))
    by_hand = simulate(Pipeline([2] * 4, [3] * 4, 4, "zbv"))  # each stage: one byte in or out of its rank, each way
    assert charged.iteration_s == pytest.approx(by_hand.iteration_s)


def test_transfer_bytes_of_the_wrong_length_are_refused() -> None:
    terms = RuntimeTerms(transfer_compute_s_per_byte=1e-9)
    with pytest.raises(UsageError, match="cut_forward_bytes has 2 values, expected 1"):
        simulate(Pipeline([1, 1], [1, 1], 2, "gpipe", runtime=terms, cut_forward_bytes=[1, 2]))


@pytest.mark.parametrize("schedule", list(Schedule))
def test_a_simulation_without_its_actions_keeps_every_other_value(schedule: Schedule) -> None:
    # The plan search ranks candidates by these totals without building an action object each: they must be the
    # same floats as the full simulation's, with every runtime term in play.
    rng = random.Random(7)
    ranks = 4
    stages = ranks * (2 if schedule.multi_stage else 1)
    m = 1 if schedule is Schedule.NAIVE else max(8, min_microbatches(schedule, ranks, stages // ranks))
    f = [rng.uniform(0.5, 2.0) for _ in range(stages)]
    b = [x * rng.uniform(1.5, 2.5) for x in f]
    terms = RuntimeTerms(
        action_overhead_s=0.01,
        step_tail_s=tuple(rng.uniform(0.0, 3.0) for _ in range(ranks)),
        compute_scale=1.07,
        tail_groups=((0, ranks - 1),),
        resume=((0.01, 0.1, 0.2), (0.5, 0.3, 0.4)),
        transfer_compute_s_per_byte=1e-9,
    )
    pipeline = Pipeline(
        f,
        b,
        m,
        schedule.value,
        num_ranks=ranks,
        input_s=[x * 0.5 for x in b],
        weight_s=[x * 0.5 for x in b],
        comm_forward_s=[0.05] * (stages - 1),
        comm_backward_s=[0.07] * (stages - 1),
        runtime=terms,
        cut_forward_bytes=[1_000_000] * (stages - 1),
        cut_backward_bytes=[2_000_000] * (stages - 1),
    )
    full, lean = simulate(pipeline), simulate(pipeline, keep_actions=False)
    assert lean.actions == () and len(full.actions) > 2 * stages * m
    assert lean == full.__class__(**{**full.__dict__, "actions": ()})
    assert lean.iteration_s == max(a.end_s for a in full.actions)
