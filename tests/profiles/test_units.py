"""Unit discovery (profiles/units.py): the default rules on small hand-built models, with exact answers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from planner.errors import UsageError
from profiles.units import attention_heads, choose_units, expert_layout, find_units

torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


class EncoderDecoder(nn.Module):
    """Two block lists and an embedding shared by both halves (called twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 8)
        self.encoder = nn.ModuleList(Block() for _ in range(2))
        self.decoder = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(x)
        for block in self.encoder:
            h = block(h)
        d = self.shared(x) + h
        for block in self.decoder:
            d = block(d)
        return self.head(d)


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.m = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x)


X4 = (torch.randn(2, 4),)


def test_every_block_list_gives_units_and_a_module_called_twice_gives_none() -> None:
    choice = choose_units(EncoderDecoder(), X4)
    assert list(choice.units) == ["encoder.0", "encoder.1", "decoder.0", "decoder.1", "decoder.2", "head"]
    assert choice.how == "default: a unit per block of encoder (2), decoder (3)"


def test_a_unit_called_twice_is_refused_when_listed() -> None:
    with pytest.raises(UsageError, match="unit 'shared' is called 2 times in one forward pass"):
        find_units(EncoderDecoder(), X4, ["shared", "head"])


def test_wrappers_are_descended_and_a_top_level_sequential_gives_its_children() -> None:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(Block(), Block()), nn.Linear(8, 2))
    choice = choose_units(Wrapper(Wrapper(inner)), X4)
    assert list(choice.units) == ["m.m.0", "m.m.2.0", "m.m.2.1", "m.m.3"]
    assert choice.how == "default: inside wrapper m.m; a unit per block of m.m.2 (2)"
    assert choice.warnings == ()


def test_a_dominant_unit_is_split_and_a_sequential_is_opened() -> None:
    class Features(nn.Module):  # most of the parameters, no repeated blocks
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Linear(4, 64)
            self.proj = nn.Linear(64, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(torch.relu(self.conv(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = Features()
            self.classifier = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x))

    choice = choose_units(Net(), X4)
    assert list(choice.units) == ["features.conv", "features.proj", "classifier.0", "classifier.2"]
    assert "split features, classifier into its children" in choice.how


def test_too_few_units_warns_with_the_fix() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    choice = choose_units(Two(), X4)
    assert list(choice.units) == ["a", "b"]
    assert choice.how == "default: no repeated block list: the top-level modules with parameters"
    assert len(choice.warnings) == 2 and choice.warnings[0].startswith("only 2 units: ")
    assert "--units" in choice.warnings[0]
    # a holds 40 of the 58 parameters, and a Linear has no children to split it into
    assert choice.warnings[1].startswith("unit a holds 69% of the parameters and cannot be split further")


def test_explicit_and_depth_specs_keep_their_forms() -> None:
    model = EncoderDecoder()
    assert choose_units(model, X4, ["head", "encoder.0"]).how == "listed explicitly"
    assert find_units(model, X4, ["head", "encoder.0"]) == ["encoder.0", "head"]
    depth2 = ["shared", "encoder.0", "encoder.1", "decoder.0", "decoder.1", "decoder.2", "head"]
    assert find_units(model, X4, 2) == depth2


def test_expert_layout_names_the_unit_and_the_routing() -> None:
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_experts = 4
            self.w = nn.Parameter(torch.zeros(4, 8, 8))

    class Moe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.top_k = 2
            self.experts = Experts()

    model = nn.Sequential(nn.Linear(8, 8), Moe())
    assert expert_layout(model, ["0", "1"]) == [{"module": "1.experts", "unit": "1", "experts": 4, "top_k": 2}]
    assert expert_layout(nn.Linear(2, 2), [""]) == []


def test_attention_heads_come_from_the_first_config_that_names_them() -> None:
    from types import SimpleNamespace

    class Wrapper(nn.Module):
        def __init__(self, config: object) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.inner.config = config  # type: ignore[assignment]

    # Llama: grouped-query attention, 32 heads sharing 8 key-value heads.
    assert attention_heads(Wrapper(SimpleNamespace(num_attention_heads=32, num_key_value_heads=8))) == {
        "attention_heads": 32,
        "kv_heads": 8,
    }
    # GPT-2: no key-value heads of its own: as many as the heads.
    assert attention_heads(Wrapper(SimpleNamespace(num_attention_heads=12))) == {"attention_heads": 12, "kv_heads": 12}
    assert attention_heads(nn.Linear(2, 2)) == {}
