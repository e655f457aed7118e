"""Units timed in context (profiles/in_context.py): inside whole-model steps, each unit gets its own time.

A model of layers that sleep a known time in their forward and in their backward: each unit's in-context time
is its own sleep, within a tolerance certain by design (the sleeps differ by at least 20 ms, and a sleep's
overshoot and the step's other work are a few milliseconds); and on a real model the units sum to the whole
model's step, by construction."""

from __future__ import annotations

import time

import pytest
import torch
from export_plans import GPT2_TINY
from torch import nn

from planner.errors import ProfilingError
from profiles.in_context import time_in_context
from profiles.measure_settings import MeasureSettings
from profiles.profiler import profile_model
from profiles.workload import load_workload

FORWARD_S = (0.02, 0.08, 0.04, 0.06)
BACKWARD_S = (0.06, 0.02, 0.08, 0.04)


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, seconds: float) -> torch.Tensor:  # type: ignore[override]
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        time.sleep(ctx.seconds)
        return grad, None


class SleepyLayer(nn.Module):
    """A Linear that sleeps ``forward_s`` in its forward and ``backward_s`` in its backward."""

    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.forward_s, self.backward_s = forward_s, backward_s
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.forward_s)
        return _SleepInBackward.apply(self.fc(x), self.backward_s)


def test_each_unit_gets_its_own_sleep() -> None:
    model = nn.Sequential(*(SleepyLayer(f, b) for f, b in zip(FORWARD_S, BACKWARD_S, strict=True)))
    x = torch.randn(4, 8)
    times = time_in_context(
        model, (x,), None, lambda out, _t: out.sum(), ["0", "1", "2", "3"], torch.device("cpu"), steps=3, warmup=1
    )
    for k in range(4):
        assert times.forward_s[k] == pytest.approx(FORWARD_S[k], abs=0.01), times
        assert times.backward_s[k] == pytest.approx(BACKWARD_S[k], abs=0.01), times
    assert sum(times.forward_s) == pytest.approx(times.whole_forward_s, rel=1e-9)
    assert sum(times.backward_s) == pytest.approx(times.whole_backward_s, rel=1e-9)
    assert times.method == "clock" and times.markers_s < 0.01


def test_a_real_model_s_units_sum_to_its_step() -> None:
    workload = load_workload("gpt2-tiny")
    torch.manual_seed(0)
    inputs, target = workload.make_batch(2)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    units = list(GPT2_TINY)
    times = time_in_context(workload.model, inputs, target, workload.loss_fn, units, torch.device("cpu"), steps=3)
    assert len(times.forward_s) == len(units) and all(t > 0 for t in times.forward_s + times.backward_s)
    assert sum(times.forward_s) == pytest.approx(times.whole_forward_s, rel=1e-9)
    assert sum(times.backward_s) == pytest.approx(times.whole_backward_s, rel=1e-9)
    # The blocks are the work: each takes longer than the position embedding.
    blocks = [t for name, t in zip(units, times.forward_s, strict=True) if ".h." in name]
    assert min(blocks) > times.forward_s[units.index("transformer.wpe")]


def test_a_unit_that_is_not_a_module_is_refused() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(ProfilingError, match="not a module"):
        time_in_context(model, (torch.randn(1, 2),), None, lambda o, _t: o.sum(), ["9"], torch.device("cpu"))


def test_the_gpu_path_profiles_units_in_context(monkeypatch) -> None:
    """The profiler's CUDA path (units timed in context, the I/W split in proportion), run on the CPU's clock:
    the profile says how its units were timed, and its units are the in-context times, which sum to the unmarked
    step by construction. (How close that is to the whole model timed apart is a measurement, not a test:
    benchmarks/gpu_check.py records it.)"""
    import profiles.loaded_profile as loaded

    monkeypatch.setattr(loaded, "IN_CONTEXT_DEVICES", ("cpu", "cuda"))
    taken = []

    def kept(*args, **kwargs):
        taken.append(time_in_context(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(loaded, "time_in_context", kept)
    settings = MeasureSettings(micro_batch_sizes=(2,), repeats=1, warmup=1, min_time_s=0.0, progress=False)
    profile = profile_model(load_workload("gpt2-tiny"), settings)
    timing = profile.settings["unit_timing"]
    assert timing["units"] == "in context (clock)" and timing["markers_s"] == [taken[0].markers_s]
    (times,) = taken
    assert all(u.forward_s[0] > 0 and u.backward_s[0] > 0 for u in profile.units)
    assert [u.forward_s[0] for u in profile.units] == list(times.forward_s)
    assert [u.backward_s[0] for u in profile.units] == list(times.backward_s)
    whole = times.whole_forward_s + times.whole_backward_s
    assert profile.unit_sum_s(0) == pytest.approx(whole, rel=1e-9)
