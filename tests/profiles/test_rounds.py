"""Round-robin timing until stable, the whole-model reference piece, and the piece-overhead piece."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import profiles.rounds as rounds_module
from planner.errors import UsageError
from profiles.dataflow import capture_export
from profiles.measure import PieceMeasurement
from profiles.rounds import (
    SPREAD_ROUNDS,
    measure_parts_in_rounds,
    measure_rounds,
    median_error,
    median_measurement,
    overhead_piece,
    whole_piece,
)

torch.set_num_threads(1)
CPU = torch.device("cpu")


def _fake(times: list[list[float]]):
    """``measure(i, r)`` returning ``times[r][i]`` as the forward time: a deterministic timer."""

    def measure(i: int, r: int) -> PieceMeasurement:
        return PieceMeasurement(times[r][i], 0.0, 0, 0, None)

    return measure


def test_median_error_is_the_standard_error_from_the_mad() -> None:
    # median 4.5, absolute deviations .5 1.5 .5 1.5 1.5 .5 -> MAD 1; sqrt(pi/2) * 1.4826 * 1 / sqrt(6) / 4.5
    assert median_error([4.0, 6.0, 4.0, 6.0, 3.0, 5.0]) == pytest.approx(0.1686, abs=1e-4)
    # one round in a load spike moves it no more than any other outlier would: the MAD ignores its size
    assert median_error([4.0, 6.0, 4.0, 6.0, 3.0, 500.0]) == median_error([4.0, 6.0, 4.0, 6.0, 3.0, 7.0])
    assert median_error([2.0] * 5) == 0.0


def test_rounds_stop_once_every_watched_median_is_known_to_within_the_bound() -> None:
    # pieces 0, 1 (one group) flat: known exactly; piece 2's error 20.8 % after 5 rounds (3 4 4 6 6: MAD 1 about
    # 4), 16.9 % after 6 (test above): the rounds stop after 6 at a 20 % bound, not before the 5 the spread needs
    b = [4.0, 6.0, 4.0, 6.0, 3.0, 5.0, 5.0, 5.0]
    times = [[1.0, 1.0, x] for x in b]
    extra: list[int] = []
    taken: list[int] = []
    done = measure_rounds(
        3,
        _fake(times),
        watch=[[0, 1], [2]],
        min_rounds=2,
        max_rounds=8,
        stable_within=0.2,
        on_extra_round=lambda: extra.append(1),
        on_done=taken.append,
    )
    assert done.rounds == 6
    assert [m.forward_s for m in done.medians] == [1.0, 1.0, 4.5]
    # A progress bar's total starts at the 8 rounds at most and shrinks by the 2 not taken; none past the most.
    assert taken == [6] and extra == []
    only_flat = measure_rounds(3, _fake(times), watch=[[0, 1]], min_rounds=2, max_rounds=8, stable_within=0.2)
    assert only_flat.rounds == SPREAD_ROUNDS == 5
    assert measure_rounds(3, _fake(times), watch=[[2]], min_rounds=2, max_rounds=8, stable_within=0.05).rounds == 8


def test_rounds_keep_the_minimum_and_the_maximum() -> None:
    flat = [[1.0, 1.0]] * 7
    assert measure_rounds(2, _fake(flat), watch=[[0], [1]], min_rounds=6, max_rounds=7, stable_within=0.01).rounds == 6
    drifting = [[float(r + 1), 1.0] for r in range(6)]
    assert measure_rounds(2, _fake(drifting), watch=[[0]], min_rounds=1, max_rounds=4, stable_within=0.01).rounds == 4
    # one round only when the minimum is the maximum (the tests' FAST settings)
    assert measure_rounds(2, _fake(drifting), watch=[[0]], min_rounds=1, max_rounds=1, stable_within=0.01).rounds == 1


def test_parts_share_rounds_starting_one_part_later_and_leave_once_stable() -> None:
    order: list[tuple[int, int]] = []
    # part 0's one piece: 1.0 each round (stable after 5); part 1's two: 1, 2, 3, ... (never stable)

    def measure(p: int, i: int, r: int) -> PieceMeasurement:
        if i == 0:
            order.append((p, r))
        return PieceMeasurement(1.0 if p == 0 else float(r + 1), 0.0, 0, 0, None)

    done = measure_parts_in_rounds(
        [1, 2], measure, watch=[[[0]], [[0, 1]]], min_rounds=2, max_rounds=7, stable_within=0.01
    )
    # round 0 from part 0, round 1 from part 1, ...; part 0 leaves after its round 4; part 1 runs to the maximum
    assert order == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3), (0, 4), (1, 4), (1, 5), (1, 6)]
    assert [d.rounds for d in done] == [5, 7]
    assert [m.forward_s for m in done[1].medians] == [4.0, 4.0]  # the median of 1 to 7


def test_a_ratio_to_a_piece_of_the_same_round_is_stable_while_the_machine_speed_moves() -> None:
    # Both pieces slow down together, round after round: their totals never settle, their ratio (2) is exact.
    def measure(_p: int, i: int, r: int) -> PieceMeasurement:
        return PieceMeasurement((2.0 if i == 0 else 1.0) * (1 + r), 0.0, 0, 0, None)

    watch = [[[0]]]
    paired = measure_parts_in_rounds([2], measure, watch=watch, min_rounds=1, max_rounds=9, stable_within=0.01, per=[1])
    apart = measure_parts_in_rounds([2], measure, watch=watch, min_rounds=1, max_rounds=9, stable_within=0.01)
    assert [paired[0].rounds, apart[0].rounds] == [SPREAD_ROUNDS, 9]
    assert paired[0].watched == (2.0,)
    assert apart[0].watched == (10.0,)  # the median of 2, 4, ..., 18


def test_a_round_visits_the_pieces_in_the_order_given_and_keeps_them_by_index() -> None:
    visits: list[int] = []

    def measure(_p: int, i: int, _r: int) -> PieceMeasurement:
        visits.append(i)
        return PieceMeasurement(float(i), 0.0, 0, 0, None)

    done = measure_parts_in_rounds(
        [4], measure, watch=[[[0]]], min_rounds=2, max_rounds=2, stable_within=0.01, order=[[0, 2, 1, 3]]
    )
    assert visits == [0, 2, 1, 3] * 2
    assert [m.forward_s for m in done[0].medians] == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(UsageError, match="once"):
        measure_parts_in_rounds(
            [3], measure, watch=[[[0]]], min_rounds=1, max_rounds=1, stable_within=0.1, order=[[0, 1]]
        )


def test_the_whole_model_is_timed_between_the_halves_of_its_units_flops() -> None:
    from profiles.loaded_profile import SizeRun, _whole_in_the_middle

    def run(units: int, whole_index: int, pieces: int) -> SizeRun:
        cap = type("Cap", (), {"pieces": tuple(range(units))})()
        return SizeRun(1, cap, None, tuple(range(pieces)), whole_index)  # type: ignore[arg-type]

    # units 0-3 (then the whole model, 4, and the overhead piece, 5): half the FLOPs after the first two
    assert _whole_in_the_middle(run(4, 4, 6), [10, 40, 30, 20]) == [0, 1, 4, 2, 3, 5]
    assert _whole_in_the_middle(run(4, 4, 6), [100, 1, 1, 1]) == [4, 0, 1, 2, 3, 5]  # one unit is most of it
    assert _whole_in_the_middle(run(1, 0, 2), [5]) == [0, 1]  # a one-unit export: the unit is the whole model


def test_i_and_w_from_the_rounds_that_split_scaled_to_every_round_s_backward() -> None:
    # Rounds 0-2 split the backward (I = 0.4 and W = 0.8 of it); rounds 3-4 did not (0 and 0).
    backward = [1.0, 2.0, 3.0, 4.0, 5.0]
    samples = [
        PieceMeasurement(0.5, b, 10, 20, None, (0.4 * b if r < 3 else 0.0), (0.8 * b if r < 3 else 0.0))
        for r, b in enumerate(backward)
    ]
    m = median_measurement(samples)
    assert (m.backward_s, m.backward_input_s, m.backward_weight_s) == pytest.approx((3.0, 1.2, 2.4))
    assert (m.output_bytes, m.saved_bytes) == (10, 20)  # the first round's, which probed them
    no_backward = median_measurement([PieceMeasurement(0.5, 0.0, 0, 0, None)] * 3)
    assert (no_backward.backward_input_s, no_backward.backward_weight_s) == (0.0, 0.0)


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_whole_piece_of_an_export_capture_is_the_graph_as_one_piece() -> None:
    torch.manual_seed(0)
    model, x = Two(), torch.randn(3, 4)
    capture = capture_export(model, (x,), ["a", "b"])
    whole = whole_piece(model, (x,), capture, ["a", "b"])
    assert isinstance(whole.module, torch.fx.GraphModule) and whole.module is not model
    assert whole.name == "<model>"
    torch.testing.assert_close(whole.module(x), model(x))
    one = capture_export(model, (x,), ["a"])
    assert whole_piece(model, (x,), one, ["a"]) is one.pieces[0]  # one unit: the same piece, by construction


@pytest.mark.parametrize("mode", ["export", "hooks"])
def test_overhead_piece_is_one_multiply_that_needs_grad(mode: str) -> None:
    piece = overhead_piece(mode, CPU)
    x = piece.args[0].clone().requires_grad_(True)
    y = piece.module(x)
    y.sum().backward()
    assert piece.arg_needs_grad == (True,) and y.shape == (1, 1)
    assert x.grad is not None and float(x.grad) == 1.0
    if mode == "export":
        # the multiply sits at the piece's top level: no nested module call inside it
        assert isinstance(piece.module, torch.fx.GraphModule)
        assert not [n for n in piece.module.graph.nodes if n.op == "call_module"]


def test_rounds_go_on_until_they_span_the_time_floor(monkeypatch) -> None:
    def slow(i: int, r: int) -> PieceMeasurement:
        time.sleep(0.01)  # every round takes at least 10 ms: a 0.1 s floor needs 2 to 10 of them
        return PieceMeasurement(1.0, 0.0, 0, 0, None)

    extra: list[int] = []
    taken: list[int] = []
    rounds = measure_rounds(
        1,
        slow,
        watch=[[0]],
        min_rounds=1,
        max_rounds=1,
        stable_within=0.01,
        min_time_s=0.1,
        on_extra_round=lambda: extra.append(1),
        on_done=taken.append,
    ).rounds
    assert 2 <= rounds <= 10
    assert len(extra) == rounds - 1 and taken == [rounds]  # the bar grows for each round past the most, only
    monkeypatch.setattr(rounds_module, "MAX_ROUNDS", 5)
    capped = measure_rounds(1, slow, watch=[[0]], min_rounds=1, max_rounds=1, stable_within=0.01, min_time_s=1e9)
    assert capped.rounds == 5
