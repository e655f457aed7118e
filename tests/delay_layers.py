"""A delay layer whose measured forward order is certain by design (after torchgpipe's tests)."""

from __future__ import annotations

import time

import torch
from torch import nn


class Sleep(nn.Module):
    """A Linear whose forward also sleeps: its forward time is at least ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.fc(x)
