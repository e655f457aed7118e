"""HF transformers causal LMs (GPT-2, Llama), random-initialised and wrapped to return logits.

The wrapper holds the HF model's own children (``transformer``/``model`` and ``lm_head``) as its
direct children, so FQNs stay HF's (``transformer.h.0``, ``lm_head``) and the weight tying of the
embedding and the LM head survives (the same Parameter object is kept).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from profiles.workload_type import Workload

__all__ = ["CausalLMLogits", "gpt2_tiny", "gpt2_small", "llama_small", "lm_loss"]


class CausalLMLogits(nn.Module):
    """``forward(input_ids) -> logits`` (a tensor, not a ModelOutput) over an HF backbone + LM head."""

    def __init__(self, hf_model: nn.Module, backbone_attr: str) -> None:
        super().__init__()
        self._backbone_attr = backbone_attr
        # Registered under HF's own attribute name so FQNs match the HF checkpoint layout.
        self.add_module(backbone_attr, getattr(hf_model, backbone_attr))
        self.lm_head = hf_model.lm_head
        self.config = hf_model.config

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        backbone = getattr(self, self._backbone_attr)
        hidden = backbone(input_ids=input_ids, use_cache=False, return_dict=True).last_hidden_state
        return self.lm_head(hidden)


def lm_loss(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the vocabulary, averaged over all tokens."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1))


def _lm_workload(
    name: str, hf_model: nn.Module, backbone_attr: str, vocab: int, seq_len: int, units: tuple[str, ...]
) -> Workload:
    model = CausalLMLogits(hf_model, backbone_attr)

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        ids = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    return Workload(model, make_batch, lm_loss, name, units)


def _gpt2(name: str, seq_len: int, **config: Any) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, **config)
    if seq_len > cfg.n_positions:
        from planner.errors import UsageError

        raise UsageError(
            f"seq_len {seq_len} exceeds {name}'s {cfg.n_positions} positions: use --seq-len <= {cfg.n_positions}"
        )
    cfg._attn_implementation = "eager"  # fvcore then counts attention's matmuls
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(cfg)
    units = ("transformer.wte", "transformer.wpe") + tuple(f"transformer.h.{i}" for i in range(cfg.n_layer))
    units += ("transformer.ln_f", "lm_head")
    return _lm_workload(name, hf, "transformer", cfg.vocab_size, seq_len, units)


def gpt2_tiny(seq_len: int | None = None) -> Workload:
    """4 layers, width 64, 4 heads, vocab 1000, 128 positions; seq_len default 32. For tests."""
    return _gpt2(
        "gpt2-tiny",
        seq_len or 32,
        n_layer=4,
        n_embd=64,
        n_head=4,
        vocab_size=1000,
        n_positions=128,
        bos_token_id=999,
        eos_token_id=999,
    )


def gpt2_small(seq_len: int | None = None) -> Workload:
    """The real GPT-2 124M architecture (12 layers, 768, vocab 50257); seq_len default 128."""
    return _gpt2("gpt2-small", seq_len or 128)


def llama_small(seq_len: int | None = None) -> Workload:
    """LlamaForCausalLM: 8 layers, hidden 512, 8 heads, vocab 32000; seq_len default 128."""
    from transformers import LlamaConfig, LlamaForCausalLM

    seq_len = seq_len or 128
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=max(2048, seq_len),
        use_cache=False,
        attention_dropout=0.0,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg)
    units = ("model.embed_tokens",) + tuple(f"model.layers.{i}" for i in range(cfg.num_hidden_layers))
    units += ("model.norm", "lm_head")
    return _lm_workload("llama-small", hf, "model", cfg.vocab_size, seq_len, units)
