"""A complete MODEL spec: ``pipeplan profile examples/custom_model.py:workload``.

pipeplan imports this file and calls ``workload()`` with no arguments. It must return a
``Workload(model, make_batch, loss_fn)`` (or that 3-tuple):

- ``model``: an ``nn.Module`` whose ``model(*inputs)`` returns a TENSOR (not a dict or a
  ModelOutput), so that ``torch.distributed.pipelining`` can split it into stages;
- ``make_batch(batch_size)``: returns ``(inputs, target)``; ``inputs`` is a tensor or a tuple of
  tensors passed positionally to the model. Seed it per size so every call gives the same batch;
- ``loss_fn(output, target)``: the scalar loss the last pipeline stage computes.

Optionally ``units``: the module FQNs to cut between, in execution order. Without it pipeplan takes
each block of the largest repeated block list (here ``blocks.0..5``) plus the modules before and
after it (``embed``, ``norm``, ``head``).
"""

from __future__ import annotations

import torch
from torch import nn

from profiles.workload import Workload

WIDTH, DEPTH, CLASSES, FEATURES = 128, 6, 10, 32


class Block(nn.Module):
    """A pre-norm residual MLP block: the repeated unit a pipeline cuts between."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, WIDTH)
        # An nn.ModuleList of identical blocks: pipeplan finds it and makes each block a unit.
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # a tensor of logits, not a dict


def workload() -> Workload:
    """The zero-argument entry point pipeplan calls."""
    torch.manual_seed(0)  # the same weights every run: profiles and plans can be compared
    model = Classifier()

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        return torch.randn(batch_size, FEATURES, generator=g), torch.randint(0, CLASSES, (batch_size,), generator=g)

    return Workload(model, make_batch, nn.functional.cross_entropy, name="custom-classifier")


if __name__ == "__main__":
    # Quick check without pipeplan's CLI: profile at two micro-batch sizes and print the table.
    from profiles.measure_settings import MeasureSettings
    from profiles.profiler import profile_model
    from profiles.report import format_profile_table

    print(format_profile_table(profile_model(workload(), MeasureSettings(micro_batch_sizes=(1, 4), repeats=3))))
