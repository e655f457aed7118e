"""A model spec whose every training forward appends ``pid batch`` to the file named by PIPEPLAN_TEST_STEP_LOG: a
process that runs it leaves a record of when and at which size it computed (tests/test_colocation.py)."""

from __future__ import annotations

import os

import torch
from torch import nn

from profiles.workload import Workload


class LoggedLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:  # adapt_workload's look at the output, in eval mode: not a step
            return self.fc(x)
        with open(os.environ["PIPEPLAN_TEST_STEP_LOG"], "a") as log:
            log.write(f"{os.getpid()} {x.shape[0]}\n")
        return self.fc(x)


def workload() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(LoggedLinear(), nn.ReLU(), nn.Linear(8, 2))
    return Workload(
        model=model,
        make_batch=lambda b: (torch.randn(b, 8), torch.randn(b, 2)),
        loss_fn=nn.functional.mse_loss,
        name="step-log",
    )
