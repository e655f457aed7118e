"""Benchmark-only workloads, used through the MODEL spec protocol (``benchmarks/models.py:gpt2_deep``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from profiles.models.hf import _gpt2  # noqa: E402
from profiles.workload import Workload  # noqa: E402

__all__ = ["gpt2_deep", "GPT2_DEEP_SPEC", "cnn13", "CNN13_SPEC"]

GPT2_DEEP_SPEC = "benchmarks/models.py:gpt2_deep"
CNN13_SPEC = "benchmarks/models.py:cnn13"


def gpt2_deep() -> Workload:
    """GPT-2 with 48 blocks of width 256 (8 heads), GPT-2's vocabulary (50257), 128 tokens, random init.

    Deep and narrow: 52 units where the LM head weighs as much as many blocks, the case where a
    partitioner must both balance many small units and place one large one.
    """
    return _gpt2(
        "gpt2-deep",
        128,
        n_layer=48,
        n_embd=256,
        n_head=8,
        n_positions=128,
    )


class _Residual(nn.Module):
    """A ResNet basic block (two 3x3 convolutions with batch norm and a skip), optionally downsampling."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def cnn13() -> Workload:
    """A 13-unit ResNet written as one ``nn.Sequential`` (as torchgpipe and DeepSpeed users write it).

    Stem, 10 residual blocks over three widths (32, 64, 128; 32x32 -> 8x8), pooling, classifier: uneven units
    (the stem and the wide blocks dominate). Its units are the Sequential's children, named explicitly.
    """
    torch.manual_seed(0)
    widths = [32] * 4 + [64] * 3 + [128] * 3
    blocks, cin = [], 32
    for i, w in enumerate(widths):
        blocks.append(_Residual(cin, w, 2 if i in (4, 7) else 1))
        cin = w
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()),
        *blocks,
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        nn.Linear(128, 10),
    )

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(2000 + batch_size)
        return torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)

    units = tuple(str(i) for i in range(len(model)))
    return Workload(model, make_batch, nn.functional.cross_entropy, name="cnn13", units=units)
