"""A failed rank says where: the stage, the unit, and the user's own line (planner/runtime/failure.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.errors import ExecutionError
from planner.runtime.failure import mark_stage, where
from planner.runtime.launch import run_ranks
from planner.runtime.stages import split_stages

torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(self.a(x))))  # the line a failure in b or c points at


def _line_of(text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(Net.forward)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_failure_inside_a_stage_names_the_stage_the_unit_and_the_model_line() -> None:
    torch.manual_seed(0)
    stages = split_stages(Net(), (torch.randn(2, 4),), ["b"], [False, False])
    with pytest.raises(RuntimeError) as info:
        stages[1](torch.randn(2, 5))  # the wrong width reaches b's matmul in the generated code
    mark_stage(info.value, 1, ("b", "c"), stages[1])
    assert where(info.value) == f"in stage 1, unit b, at test_failure.py:{_line_of('self.c(')} in forward"


def _user_helper() -> None:
    raise ValueError("bad target")


def test_a_failure_outside_any_stage_names_the_users_frame() -> None:
    with pytest.raises(ValueError) as info:
        _user_helper()
    assert where(info.value) == f"at test_failure.py:{_user_helper.__code__.co_firstlineno + 1} in _user_helper"


def _rank_fails(rank: int, world_size: int) -> None:
    if rank == 1:
        _user_helper()


def test_a_rank_error_puts_the_place_first_and_keeps_the_traceback() -> None:
    with pytest.raises(ExecutionError) as info:
        run_ranks(_rank_fails, (), 2, timeout_s=60, backend=None)
    line = _user_helper.__code__.co_firstlineno + 1
    assert str(info.value) == f"rank 1 failed at test_failure.py:{line} in _user_helper: ValueError: bad target"
    assert "Traceback" in info.value.remote_traceback and "_rank_fails" in info.value.remote_traceback
