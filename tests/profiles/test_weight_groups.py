"""profiles/weight_groups.py: torch's split backward with a weight-made tensor used at several depths."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from profiles.weight_groups import made_from_weights_alone, weight_groups


class SharedBias(nn.Module):
    """A bias made from a weight and added in every layer, as T5's position bias is."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(4, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.table(torch.arange(4)).sum(0)
        for layer in self.layers:
            x = torch.tanh(layer(x) + bias)
        return x


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.LayerNorm(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _full_grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x.clone().requires_grad_()).square().sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _split(model: nn.Module, x: torch.Tensor, mend: bool) -> tuple[dict[str, torch.Tensor], list, list]:
    model.zero_grad(set_to_none=True)
    leaf = x.clone().requires_grad_()
    loss = model(leaf).square().sum()
    _, groups = stage_backward_input([loss], None, [leaf], model.parameters())
    mended = weight_groups(groups) if mend else groups
    stage_backward_weight(model.parameters(), mended)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, groups, mended


@pytest.mark.parametrize("repeat", range(4))  # torch files groups in sets: their order changes from run to run
def test_a_shared_weight_made_tensor_gets_every_gradient_once(repeat: int) -> None:
    torch.manual_seed(repeat)
    model, x = SharedBias(), torch.randn(2, 8)
    want = _full_grads(model, x)
    got, groups, mended = _split(model, x, mend=True)
    assert len(groups) > 1 and len(mended) == 1  # the table's nodes lie one below another: one call backs through
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_torch_s_own_groups_fail_on_it() -> None:
    """What the mending is for: torch 2.13's W, given its own groups, backs through a graph it freed."""
    torch.manual_seed(0)
    model, x = SharedBias(), torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _split(model, x, mend=False)


def test_a_stage_without_one_keeps_torch_s_groups() -> None:
    torch.manual_seed(0)
    model, x = Plain(), torch.randn(2, 8)
    want = _full_grads(model, x)
    got, groups, mended = _split(model, x, mend=True)
    assert mended is groups and len(groups) == 3  # each Linear's weight and bias, the LayerNorm's: torch's own
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, msg=name)


def test_nothing_to_mend_stays_nothing() -> None:
    assert weight_groups(None) is None
    assert weight_groups([]) == []


class _Node:
    """A stand-in for an autograd node: a name, and the nodes below it."""

    def __init__(self, name: str, *below: _Node) -> None:
        self.name, self.next_functions = name, tuple((n, 0) for n in below)

    def __repr__(self) -> str:
        return self.name


def test_groups_sharing_a_parameter_become_one_with_their_gradients_in_step() -> None:
    """torch's fault: a parameter filed in two groups (its gradient would be added twice)."""
    a, b, c = _Node("a"), _Node("b"), _Node("c")
    x, y, z = _Node("x", a), _Node("y", a, b), _Node("z", c)
    groups = [
        {"params": {a}, "intermediates": [x], "grads": [("gx",)]},
        {"params": {a, b}, "intermediates": [y, x], "grads": [("gy",), ("gx",)]},
        {"params": {c}, "intermediates": [z], "grads": [("gz",)]},
    ]
    mended = weight_groups(groups)
    assert [(g["params"], g["intermediates"], g["grads"]) for g in mended] == [
        ({a, b}, [x, y], [("gx",), ("gy",)]),
        ({c}, [z], [("gz",)]),
    ]


def test_nodes_one_below_another_make_every_group_one() -> None:
    a, b = _Node("a"), _Node("b")
    low = _Node("low", a)
    high = _Node("high", low, a)
    other = _Node("other", b)
    groups = [
        {"params": {a}, "intermediates": [high, low], "grads": [("gh",), ("gl",)]},
        {"params": {b}, "intermediates": [other], "grads": [("go",)]},
    ]
    (one,) = weight_groups(groups)
    assert one["params"] == {a, b} and one["intermediates"] == [high, low, other]
    assert one["grads"] == [("gh",), ("gl",), ("go",)]


class _Stage(nn.Module):
    """A stage that passes on its input's transform and, with ``alone``, an embedding of token ids it was given
    (made from its weights alone, as a T5 stage holding the decoder's embedding makes the decoder's input)."""

    def __init__(self, alone: bool, mixed: bool = False) -> None:
        super().__init__()
        self.linear, self.table = nn.Linear(8, 8), nn.Embedding(4, 8)
        self.alone, self.mixed = alone, mixed

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.mixed:
            return (self.linear(x) + self.table(ids),)
        return (self.linear(x), self.table(ids)) if self.alone else (self.linear(x),)


@pytest.mark.parametrize(
    ("alone", "mixed", "expected"), [(True, False, True), (False, False, False), (False, True, False)]
)
def test_an_output_made_from_weights_alone_is_found(alone: bool, mixed: bool, expected: bool) -> None:
    x, ids = torch.randn(2, 8, requires_grad=True), torch.tensor([1, 3])
    assert made_from_weights_alone(_Stage(alone, mixed)(x, ids), (x, ids)) is expected


def test_with_no_input_needing_a_gradient_every_output_is_made_from_weights_alone() -> None:
    x, ids = torch.randn(2, 8), torch.tensor([1, 3])
    assert made_from_weights_alone(_Stage(False)(x, ids), (x, ids))


def test_torch_s_split_misses_the_gradient_of_such_an_output() -> None:
    """Why such a stage runs its whole backward at I: W from torch's groups leaves the embedding without one."""
    torch.manual_seed(0)
    stage, ids = _Stage(True), torch.tensor([1, 3])
    x = torch.randn(2, 8, requires_grad=True)
    outputs = stage(x, ids)
    grads = [torch.ones_like(o) for o in outputs]
    _, groups = stage_backward_input(list(outputs), grads, [x], stage.parameters())
    stage_backward_weight(stage.parameters(), weight_groups(groups))
    assert stage.linear.weight.grad is not None and stage.table.weight.grad is None
