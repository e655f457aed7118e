"""The built-in models: they build, return tensors of the right shape, and keep HF's names and tying."""

from __future__ import annotations

import math

import pytest
import torch

from profiles.models import BUILTIN_MODELS
from profiles.workload import load_workload

torch.set_num_threads(1)

# (name, batch, expected output shape) - gpt2-small and llama-small at a short seq_len to keep it fast.
CASES = [
    ("mlp", {}, 3, (3, 16)),
    ("gpt2-tiny", {}, 2, (2, 32, 1000)),
    ("gpt2-small", {"seq_len": 8}, 1, (1, 8, 50257)),
    ("llama-small", {"seq_len": 8}, 1, (1, 8, 32000)),
    ("unet-small", {}, 2, (2, 3, 32, 32)),
]


@pytest.mark.parametrize(("name", "options", "batch", "shape"), CASES, ids=[c[0] for c in CASES])
def test_builds_and_returns_a_tensor(name: str, options: dict, batch: int, shape: tuple[int, ...]) -> None:
    workload = BUILTIN_MODELS[name](**options)
    inputs, target = workload.make_batch(batch)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    out = workload.model(*inputs)
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == shape
    assert math.isfinite(workload.loss_fn(out, target).item())
    modules = dict(workload.model.named_modules())
    assert workload.units is not None and all(u in modules for u in workload.units)


def test_same_seed_gives_same_weights_and_batches() -> None:
    a, b = BUILTIN_MODELS["gpt2-tiny"](), BUILTIN_MODELS["gpt2-tiny"]()
    for (na, pa), (nb, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    assert torch.equal(a.make_batch(4)[0], b.make_batch(4)[0])
    assert not torch.equal(a.make_batch(4)[0][:1], a.make_batch(1)[0])  # seeded per size, not one stream


def test_gpt2_small_has_the_real_parameter_count() -> None:
    model = BUILTIN_MODELS["gpt2-small"]().model
    assert sum(p.numel() for p in model.parameters()) == 124_439_808


def test_gpt2_keeps_hf_names_and_tied_weights() -> None:
    model = BUILTIN_MODELS["gpt2-tiny"]().model
    names = dict(model.named_modules())
    assert {"transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.3", "lm_head"} <= set(names)
    assert model.lm_head.weight is model.transformer.wte.weight
    tied = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert "lm_head.weight" in tied and "transformer.wte.weight" in tied


def test_gpt2_has_no_dropout_and_eager_attention() -> None:
    cfg = BUILTIN_MODELS["gpt2-tiny"]().model.config
    assert (cfg.resid_pdrop, cfg.embd_pdrop, cfg.attn_pdrop) == (0.0, 0.0, 0.0)
    assert cfg._attn_implementation == "eager"
    assert cfg.use_cache is False


def test_seq_len_option_applies_to_language_models_only() -> None:
    assert BUILTIN_MODELS["gpt2-tiny"](seq_len=16).make_batch(2)[0].shape == (2, 16)
    assert BUILTIN_MODELS["mlp"](seq_len=16).make_batch(2)[0].shape == (2, 64)


def test_load_workload_resolves_builtin_names() -> None:
    workload = load_workload("mlp")
    assert workload.name == "mlp"
