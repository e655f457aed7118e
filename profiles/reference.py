"""A fixed reference workload: how fast the machine runs right now, to compare two moments.

A shared machine changes speed with its co-tenants, and slowly: on the 2-core development VM a gpt2-tiny
stage's median forward+backward moved 0.78-1.17x its typical value between 10 s windows and 0.86-1.15x
between 30 s windows, with no steal time in ``/proc/stat``. A profile taken at one moment and a run
measured at another then disagree by that much, whatever the cost model. Timed call for call with the
stage, this reference moved with it: the ratio stage / reference stayed within 0.95-1.05 between 10 s
windows and 0.98-1.01 between 30 s windows (docs/BENCHMARKS.md, "Fidelity": the ``--only track`` probe, 2026-11-30).

The profiler times the reference once per round and records its median (``settings.reference_s``);
``verify`` times it between its steps and reports how much slower or faster the machine ran than while
profiling. A diagnostic, not a correction: over six models' pipelines it did not track every one
(docs/cost-model.md, "The machine's speed").
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

        Warm, because what came before should not count: right after a replayed gpt2-small step the first
        call took 10.1-12.2 ms and the next five 6.6-7.8 ms (2026-12-02), and timed cold once after each
        step, verify's reference read the machine 1.67x and 3.64x slower than while profiling in two runs
        whose stages ran 16-31 % slower and within 5 % of their profile (docs/BENCHMARKS.md, section 6.1).
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
