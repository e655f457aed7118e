"""One torch.export trace, split several ways (profiles/export_split.py): each split is the graph torch's own
``pipeline()`` gives for its points, a later split of the same model and shapes traces nothing, and anything else
traces again."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipeline

import profiles.export_split as export_split
from profiles.export_split import split_model
from profiles.workload import load_workload


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.d(self.c(self.b(h)) + h)  # h skips b and c


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.b(x)))


def _torch_pipe(model: nn.Module, inputs: tuple, points: list[str]):
    pipe = pipeline(model, mb_args=inputs, split_spec={p: SplitPoint.BEGINNING for p in points})
    for p in points:  # torch 2.13 leaves its wrapper in place
        model.get_submodule(p).__dict__.pop("forward", None)
    return pipe


def _graphs(pipe) -> list[str]:
    return [str(pipe.split_gm.graph), *(str(m.graph) for m in pipe.split_gm.children())]


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Each torch.export the module makes, by its first input's shape."""
    made: list[tuple[int, ...]] = []
    real = torch.export.export

    def counted(model, args, *rest, **kwargs):
        made.append(tuple(args[0].shape))
        return real(model, args, *rest, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    monkeypatch.setattr(export_split, "_last", None)
    return made


def test_splits_cut_from_one_trace_are_torchs_own(exports: list[tuple[int, ...]]) -> None:
    workload = load_workload("gpt2-tiny", seq_len=8)
    model, (inputs, _) = workload.model, workload.make_batch(2)
    units = ["transformer.h.0", "transformer.h.1", "transformer.h.2", "transformer.h.3", "lm_head"]
    every = split_model(model, (inputs,), units)
    stages = split_model(model, (inputs,), ["transformer.h.2"])
    whole = split_model(model, (inputs,), [])
    assert exports == [(2, 8)]  # the units' trace served the stages and the whole model
    assert [every.num_stages, stages.num_stages, whole.num_stages] == [6, 2, 1]
    assert _graphs(stages) == _graphs(_torch_pipe(model, (inputs,), ["transformer.h.2"]))
    assert _graphs(whole) == _graphs(_torch_pipe(model, (inputs,), []))
    assert _graphs(every) == _graphs(_torch_pipe(model, (inputs,), units))


def test_another_shape_or_a_point_not_marked_traces_again(exports: list[tuple[int, ...]]) -> None:
    model, x = Chain(), torch.randn(4, 8)
    split_model(model, (x,), ["b", "c"])
    split_model(model, (x,), ["c"])
    split_model(model, (torch.randn(2, 8),), ["c"])  # another shape
    split_model(model, (torch.randn(2, 8),), ["d"])  # a point the last trace did not mark
    split_model(Chain(), (x,), ["c"])  # another model
    assert exports == [(4, 8), (2, 8), (2, 8), (4, 8)]


def test_the_forwards_are_put_back(exports: list[tuple[int, ...]]) -> None:
    model, x = Chain(), torch.randn(4, 8)
    split_model(model, (x,), ["b", "c"])
    assert all("forward" not in model.get_submodule(p).__dict__ for p in ("b", "c"))
    assert _torch_pipe(model, (x,), ["c"]).num_stages == 2  # torch's own split still works on it
    assert torch.equal(model(x), Chain.forward(model, x))


def test_a_point_called_twice_is_cut_as_torch_cuts_it_and_not_kept(exports: list[tuple[int, ...]]) -> None:
    model, x = Twice(), torch.randn(4, 8)
    pipe = split_model(model, (x,), ["b"])
    # Two markers for one point, at every one of which torch cuts too: the caller counts the pieces.
    assert _graphs(pipe) == _graphs(_torch_pipe(model, (x,), ["b"]))
    assert export_split._last is None


def test_the_trace_goes_with_its_model(exports: list[tuple[int, ...]]) -> None:
    model = Chain()
    split_model(model, (torch.randn(4, 8),), ["c"])
    assert export_split._last is not None
    del model
    gc.collect()
    assert export_split._last is None
