"""A fixed reference workload: how fast the machine runs right now, to compare two moments.

A shared machine changes speed with its co-tenants, and slowly, by tens of percent between windows of tens of
seconds, with no steal time in ``/proc/stat`` to show it. A profile taken at one moment and a run measured at
another then disagree by that much, whatever the cost model. Timed call for call with a model's stage, this
reference moves with it (``python benchmarks/bench_runtime_probes.py --only track`` measures both).

The profiler times the reference once per round and records its median (``settings.reference_s``);
``verify`` times it between its steps and reports how much slower or faster the machine ran than while
profiling. It says how the machine moved, not how each model's pipeline moved with it, so the verdict takes the
error at its speed only where that is the smaller one; where the plan records the model's own unit sum, the units
are the reference instead (profiles/model_reference.py; docs/cost-model.md, "The machine's speed").
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

__all__ = ["SpeedReference"]

_WIDTH, _HEADS, _HIDDEN = 128, 4, 512
_SHAPE = (4, 64, _WIDTH)
"""A transformer encoder layer on 4 x 64 tokens: attention, LayerNorms and an MLP, like the blocks people
pipeline, and a few milliseconds forward+backward on one CPU core, so that timing it every round or every
step costs little."""


class SpeedReference:
    """The reference layer on ``device``, built the same way everywhere (seeded), ready to be timed."""

    def __init__(self, device: torch.device) -> None:
        gen = torch.Generator().manual_seed(0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(_WIDTH, _HEADS, _HIDDEN, dropout=0.0, batch_first=True)
        self.device = device
        self.layer = layer.to(device)
        self.x = torch.randn(_SHAPE, generator=gen).to(device)
        self.grad = torch.randn(_SHAPE, generator=gen).to(device)
        self.samples: list[float] = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _step(self) -> float:
        self._sync()
        t0 = time.perf_counter()
        self.layer(self.x).backward(self.grad)
        self._sync()
        elapsed = time.perf_counter() - t0
        self.layer.zero_grad(set_to_none=True)
        return elapsed

    def time_once(self) -> float:
        """One forward+backward, in seconds, right after an untimed one; also kept in ``samples``.

        Warm, because what came before should not count: right after a large model's step the first call runs
        far slower than the next ones, and a reference timed cold after each step would read the machine much
        slower than its stages ran.
        """
        self._step()
        elapsed = self._step()
        self.samples.append(elapsed)
        return elapsed

    def warm_up(self, times: int = 3) -> None:
        for _ in range(times):
            self.time_once()
        self.samples.clear()

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None
