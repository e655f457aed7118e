"""profiles/resume.py: the whole model's extra time after an idle gap, measured by the profiler."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from profiles.dataflow import Piece
from profiles.resume import MAX_STEP_S, RESUME_GAPS_S, measure_resume

torch.set_num_threads(1)


class SlowAfterIdle(nn.Module):
    """Sleeps, before its forward, as long as it was idle since its last backward (at most 20 ms): a refill
    cost by design."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.last_end: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.last_end is not None:
            time.sleep(min(time.perf_counter() - self.last_end, 0.02))
        out = self.layer(x)
        out.register_hook(self._backward_reached)
        return out

    def _backward_reached(self, grad: torch.Tensor) -> None:
        self.last_end = time.perf_counter()


def test_the_forward_extra_follows_the_idle_gap_by_design():
    piece = Piece("model", SlowAfterIdle(), (torch.randn(2, 4),), (False,))
    forward, backward = measure_resume(
        piece, device=torch.device("cpu"), loss_fn=nn.functional.mse_loss, target=torch.randn(2, 4), step_s=0.001
    )
    assert len(forward) == len(backward) == len(RESUME_GAPS_S) == 3
    # Designed extras: each gap, 1, 3 and 10 ms. A sleep lasts at least what it is asked, so the extra after
    # the longest gap is at least most of it; how much longer a loaded machine makes it is not bounded.
    assert forward[0] < forward[1] < forward[2]
    assert forward[2] > RESUME_GAPS_S[2] / 2
    assert all(b >= 0 for b in backward)


def test_a_long_step_is_not_measured():
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise AssertionError("a step over MAX_STEP_S must not run")

    piece = Piece("model", Boom(), (torch.randn(2, 4),), (False,))
    zeros = (0.0,) * len(RESUME_GAPS_S)
    assert measure_resume(piece, device=torch.device("cpu"), loss_fn=None, target=None, step_s=MAX_STEP_S * 2) == (
        zeros,
        zeros,
    )


@pytest.mark.parametrize("sizes", [(1, 2)])
def test_the_profile_holds_one_curve_per_size(sizes):
    from profiles.measure_settings import MeasureSettings
    from profiles.models import BUILTIN_MODELS
    from profiles.profiler import profile_model

    profile = profile_model(
        BUILTIN_MODELS["mlp"](),
        MeasureSettings(micro_batch_sizes=sizes, repeats=1, max_repeats=1, min_time_s=0.0, progress=False),
    )
    resume = profile.resume
    assert resume is not None and resume.gaps_s == RESUME_GAPS_S
    assert len(resume.forward_s) == len(resume.backward_s) == len(sizes)
    assert all(len(row) == 3 and all(0 <= t < 0.1 for t in row) for row in resume.forward_s + resume.backward_s)
    assert resume.curve(1) == tuple(zip(RESUME_GAPS_S, resume.forward_s[1], resume.backward_s[1], strict=True))
    from profiles.report import format_profile_table

    table = format_profile_table(profile)
    assert "after a wait of 1, 3, 10 ms, the whole model's forward / backward took longer by:" in table
    assert table.count("\nb=2: +") == 1
