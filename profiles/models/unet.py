"""``unet-small``: a convolutional UNet with long skip connections; its units are its levels.

The output of encoder level ``enc.i`` is read by the next level and again, much later, by the
decoder level that works at the same resolution: the long-lived tensors a pipeline cut must carry.
"""

from __future__ import annotations

import torch
from torch import nn

from profiles.workload_type import Workload

__all__ = ["ConvBlock", "EncoderLevel", "DecoderLevel", "SmallUNet", "unet_small"]

IN_CHANNELS = 3
IMAGE_SIZE = 32
WIDTHS = (16, 32, 64)
BOTTLENECK = 128


class ConvBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm-free ReLU (batch-size independent numerics)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv2(self.act(self.conv1(x))))


class EncoderLevel(nn.Module):
    """Optionally halve the resolution, then a conv block."""

    def __init__(self, c_in: int, c_out: int, downsample: bool) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(2) if downsample else nn.Identity()
        self.block = ConvBlock(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.pool(x))


class DecoderLevel(nn.Module):
    """Double the resolution, concatenate the matching encoder output (the skip), then a conv block."""

    def __init__(self, c_in: int, c_skip: int, c_out: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(c_in, c_skip, 2, stride=2)
        self.block = ConvBlock(2 * c_skip, c_out)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.block(torch.cat([self.up(x), skip], dim=1))


class SmallUNet(nn.Module):
    def __init__(
        self, in_channels: int = IN_CHANNELS, widths: tuple[int, ...] = WIDTHS, bottleneck: int = BOTTLENECK
    ) -> None:
        super().__init__()
        chans = (in_channels, *widths)
        self.enc = nn.ModuleList(EncoderLevel(chans[i], chans[i + 1], downsample=i > 0) for i in range(len(widths)))
        self.mid = EncoderLevel(widths[-1], bottleneck, downsample=True)
        ups = (bottleneck, *reversed(widths))
        self.dec = nn.ModuleList(DecoderLevel(ups[i], ups[i + 1], ups[i + 1]) for i in range(len(widths)))
        self.head = nn.Conv2d(widths[0], in_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for level in self.enc:
            x = level(x)
            skips.append(x)
        x = self.mid(x)
        for level, skip in zip(self.dec, reversed(skips), strict=True):
            x = level(x, skip)
        return self.head(x)


def unet_small(seq_len: int | None = None) -> Workload:
    """Input (B, 3, 32, 32) float32, target of the same shape, MSE loss. ``seq_len`` is ignored."""
    del seq_len
    torch.manual_seed(0)
    model = SmallUNet()

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        shape = (batch_size, IN_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
        return torch.randn(shape, generator=g), torch.randn(shape, generator=g)

    n = len(WIDTHS)
    units = tuple(f"enc.{i}" for i in range(n)) + ("mid",) + tuple(f"dec.{i}" for i in range(n)) + ("head",)
    return Workload(model, make_batch, nn.functional.mse_loss, "unet-small", units)
