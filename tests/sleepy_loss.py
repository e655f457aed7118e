"""A model whose loss sleeps: where verify counts the loss is certain by design (see test_verify.py)."""

from __future__ import annotations

import time

import torch
from torch import nn

from profiles.workload import Workload

LOSS_SLEEP_S = 0.03


def sleepy_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    time.sleep(LOSS_SLEEP_S)
    return nn.functional.mse_loss(output, target)


def workload() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(n)
        return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)

    return Workload(model, make_batch, sleepy_mse, "sleepy-loss", ("0", "1", "2"))
