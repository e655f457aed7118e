"""``mlp``: a tiny residual MLP with a repeated block list (``layers.0..3``) and a regression head."""

from __future__ import annotations

import torch
from torch import nn

from profiles.workload_type import Workload

__all__ = ["MLPBlock", "TinyMLP", "mlp"]

IN_FEATURES = 64
HIDDEN = 256
OUT_FEATURES = 16
NUM_BLOCKS = 4


class MLPBlock(nn.Module):
    """Linear-ReLU-Linear with a residual connection."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class TinyMLP(nn.Module):
    def __init__(
        self,
        width: int = IN_FEATURES,
        hidden: int = HIDDEN,
        out: int = OUT_FEATURES,
        num_blocks: int = NUM_BLOCKS,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MLPBlock(width, hidden) for _ in range(num_blocks))
        self.head = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def mlp(seq_len: int | None = None) -> Workload:
    """Input (B, 64) float32, target (B, 16), MSE loss. ``seq_len`` does not apply and is ignored."""
    del seq_len
    torch.manual_seed(0)
    model = TinyMLP()

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        x = torch.randn(batch_size, IN_FEATURES, generator=g)
        y = torch.randn(batch_size, OUT_FEATURES, generator=g)
        return x, y

    units = tuple(f"layers.{i}" for i in range(NUM_BLOCKS)) + ("head",)
    return Workload(model, make_batch, nn.functional.mse_loss, "mlp", units)
