"""The optimizer's cost for ``pipeplan calibrate`` (its step 3): time a step of Adam and of SGD on sets of
parameters of several sizes and counts, every rank at once, and fit ``per_step + per_param * parameters +
per_tensor * tensors`` to the times (:func:`fit_optimizers`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from planner.calibration import OptimizerCost

__all__ = ["time_optimizers", "fit_optimizers", "COLD_PAUSE_S", "CUDA_OPTIMIZER_SCALE"]

OptimizerTimes = dict[str, list[tuple[int, int, float, float]]]
"""Per optimizer, ``(parameters, tensors, back to back, after a pause)`` per set, in seconds."""


def _median_time(
    fn: Callable[[], Any], repeats: int, sync: Callable[[], None], min_s: float = 0.0, pause_s: float = 0.0
) -> float:
    """Median time of ``fn``: ``repeats`` calls, and on until ``min_s`` have passed; each call after an
    untimed ``pause_s`` of sleep when given."""
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - started < min_s:
        sync()
        if pause_s:
            time.sleep(pause_s)
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


_OPTIMIZER_SETS = ((1 << 18, 8), (1 << 21, 8), (1 << 18, 256))
"""(parameters, tensors) timed for the optimizer fit: two sizes at one count, two counts at one size."""
CUDA_OPTIMIZER_SCALE = 32
"""On a GPU the sets hold this many times the parameters: there an Adam step on 2^21 parameters is a few kernel
launches and the size difference drowned in them (an H200 fitted 0 s a parameter: 2^18 in 0.51 ms, 2^21 in
0.33 ms). 2^26 parameters with gradients and Adam's two moments are 1 GiB in float32."""
COLD_PAUSE_S = 0.005
"""Each optimizer set is also timed after this pause. A training step runs the optimizer once, after the
schedule's last action, never back to back with itself, and a step after other work costs more than the
back-to-back repeats a fit of its own would see: on the development VM an Adam step took 0.2-0.5 ms more
(2^18 parameters in 8 tensors 0.40 -> 0.61 ms, 2^21 in 8 6.9 -> 7.4 ms, 272k in 52 1.13 -> 1.51 ms), the same
after a transformer layer's forward+backward as after the pause (docs/BENCHMARKS.md, "Fidelity").
The fit stays on the back-to-back times (their differences give the per-parameter and per-tensor
slopes); the median cold extra is added to ``per_step``."""


def time_optimizers(dev: torch.device, sync: Callable[[], None], repeats: int, min_measure_s: float) -> OptimizerTimes:
    """Each optimizer's step on each set, back to back and after a pause (:data:`COLD_PAUSE_S`), ``repeats`` times
    at least and at least a quarter of ``min_measure_s``, every rank at once (as in training)."""
    import torch.distributed as dist

    out: OptimizerTimes = {}
    for name in ("adam", "sgd"):
        points = []
        scale = CUDA_OPTIMIZER_SCALE if dev.type == "cuda" else 1
        for numel, count in ((n * scale, k) for n, k in _OPTIMIZER_SETS):
            params = [nn.Parameter(torch.randn(numel // count, device=dev)) for _ in range(count)]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = (
                torch.optim.Adam(params, lr=1e-4) if name == "adam" else torch.optim.SGD(params, lr=1e-4, momentum=0.9)
            )
            opt.step()  # state allocation happens once, not every step

            def step(opt: torch.optim.Optimizer = opt, params: list[nn.Parameter] = params) -> None:
                # The schedule's scale_grads: a pass over every gradient, per tensor, before the step
                # (gpt2-tiny's 26-tensor stage: 0.37 ms of a 3.5 ms tail).
                for p in params:
                    p.grad.div_(2)  # type: ignore[union-attr]
                opt.step()
                for p in params:  # zero_grad(set_to_none=True) would free what the next step needs
                    p.grad.zero_()  # type: ignore[union-attr]

            dist.barrier()
            warm = _median_time(step, repeats, sync, min_measure_s / 4)
            dist.barrier()
            cold = _median_time(step, repeats, sync, min_measure_s / 4, pause_s=COLD_PAUSE_S)
            points.append((numel, count, warm, cold))
        out[name] = points
    return out


def fit_optimizers(per_rank: Sequence[OptimizerTimes]) -> dict[str, OptimizerCost]:
    """The cost of each optimizer's step from every rank's :func:`time_optimizers`: the back-to-back times give
    the per-parameter and per-tensor slopes, the median extra after a pause joins ``per_step``."""
    head = per_rank[0]
    optimizer = {}
    for name in ("adam", "sgd"):
        # Every rank stepped at once; the slowest rank is what the iteration waits for.
        (n1, t1, a), (n2, _, b), (_, t2, c) = [
            (n, k, max(r[name][i][2] for r in per_rank)) for i, (n, k, *_) in enumerate(head[name])
        ]
        cold_extra = statistics.median(
            max(max(r[name][i][3] for r in per_rank) - warm, 0.0) for i, warm in enumerate((a, b, c))
        )
        per_param = max((b - a) / (n2 - n1), 0.0)
        per_tensor = max((c - a) / (t2 - t1), 0.0)
        per_step = max(a - per_param * n1 - per_tensor * t1, 0.0) + cold_extra
        optimizer[name] = OptimizerCost(per_param_s=per_param, per_step_s=per_step, per_tensor_s=per_tensor)
    return optimizer
