"""The model's own units as a speed reference: what one timed pass runs."""

from __future__ import annotations

import time

import torch
from torch import nn

from profiles.dataflow import Piece
from profiles.measure import WARM_BELOW_S
from profiles.model_reference import WAKE_S, UnitReference


class _Counted(nn.Module):
    """A Linear that counts its forwards and sleeps ``sleep_s`` in each."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.linear, self.sleep_s, self.calls = nn.Linear(4, 4), sleep_s, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.sleep_s)
        return self.linear(x)


def _reference(sleep_s: float) -> tuple[UnitReference, _Counted]:
    module = _Counted(sleep_s)
    piece = Piece("unit", module, (torch.randn(2, 4),), (False,))
    return UnitReference([piece], torch.device("cpu"), None, torch.zeros(2, 4)), module


def _passes(reference: UnitReference, module: _Counted) -> int:
    """Forwards in one pass over the units (an untimed one where the unit is short, the timed one)."""
    reference.warm_up()
    before = module.calls
    reference._measure(first=False)
    return module.calls - before


def test_short_units_run_untimed_for_the_wake_window_before_each_timed_pass() -> None:
    # Right after a wait, more passes run first, for WAKE_S, where the units take less than that.
    reference, module = _reference(0.0)
    per_pass = _passes(reference, module)
    before = module.calls
    reference.time_once()
    assert (module.calls - before) // per_pass >= 2  # at least one untimed pass and the timed one
    assert len(reference.samples) == 1


def test_units_longer_than_the_wake_window_are_timed_after_their_own_probe_alone() -> None:
    reference, module = _reference(WAKE_S)
    per_pass = _passes(reference, module)
    reference.time_once()  # no sample yet: the first call warms up for WAKE_S
    before = module.calls
    assert reference.time_once() >= WAKE_S
    assert module.calls - before == per_pass  # the timed pass, nothing more


def test_a_pass_right_after_other_work_needs_no_wake_up() -> None:
    reference, module = _reference(0.0)
    per_pass = _passes(reference, module)
    before = module.calls
    reference.time_once(wake=False)
    assert module.calls - before == per_pass


def test_a_short_unit_is_timed_after_an_untimed_iteration_and_a_long_one_at_once() -> None:
    # As the profile's rounds past the first time them (profiles/measure.py, WARM_BELOW_S).
    short, short_module = _reference(0.0)
    assert _passes(short, short_module) == 2 and short.short == [True]
    long, long_module = _reference(WARM_BELOW_S)
    assert _passes(long, long_module) == 1 and long.short == [False]
