"""Tiny models as a user brings them, for the model matrix (tests/e2e/test_model_matrix.py).

Each NAME is a ``tests/model_zoo.py:NAME`` model spec: a zero-argument function returning a Workload.
They are written the way a new user would write them: transformers models as they come (a forward that
returns a ModelOutput, keyword inputs in a dict), a CNN as one ``nn.Sequential``, a model wrapped in one
extra module. Sizes are tiny (hidden 32, 2 layers, vocabulary 96, 8 tokens) so that each profiles, plans
and runs in seconds; dropout is 0 so that two runs give the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from profiles.workload import Workload

VOCAB = 96
SEQ = 8
HIDDEN = 32


def _ids(batch_size: int, length: int = SEQ + 1, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 7 * salt + batch_size)
    return torch.randint(0, VOCAB, (batch_size, length), generator=g)


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _causal_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    ids = _ids(batch_size)
    return {"input_ids": ids[:, :-1].contiguous()}, ids[:, 1:].contiguous()


def _eager(cfg: Any) -> Any:
    cfg._attn_implementation = "eager"
    return cfg


def gpt2() -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=2, n_embd=HIDDEN, n_head=2, vocab_size=VOCAB, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return Workload(GPT2LMHeadModel(_eager(cfg)), _causal_batch, token_loss, "tests/model_zoo.py:gpt2")


def llama() -> Workload:
    """Grouped-query attention (4 heads, 2 key/value heads) and tied input/output embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return Workload(LlamaForCausalLM(_eager(cfg)), _causal_batch, token_loss, "tests/model_zoo.py:llama")


def bert_mlm() -> Workload:
    """Masked LM: the decoder is tied to the word embeddings; an int attention mask reaches every layer."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)

    def make_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        ids = _ids(batch_size, SEQ)
        mask = torch.ones_like(ids)
        mask[:, -2:] = 0  # padding: the mask is a real input, not all ones
        return {"input_ids": ids, "attention_mask": mask}, ids

    return Workload(BertForMaskedLM(_eager(cfg)), make_batch, token_loss, "tests/model_zoo.py:bert_mlm")


def vit() -> Workload:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=16,
        patch_size=4, num_channels=3, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        return torch.randn(batch_size, 3, 16, 16, generator=g), torch.randint(0, 5, (batch_size,), generator=g)

    return Workload(
        ViTForImageClassification(_eager(cfg)), make_batch, nn.functional.cross_entropy, "tests/model_zoo.py:vit"
    )


def t5() -> Workload:
    """Encoder-decoder: the encoder's output is read by every decoder block (cross-attention)."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)

    def make_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        source, target = _ids(batch_size, SEQ), _ids(batch_size, SEQ + 1, salt=1)
        return {"input_ids": source, "decoder_input_ids": target[:, :-1].contiguous()}, target[:, 1:].contiguous()

    return Workload(T5ForConditionalGeneration(_eager(cfg)), make_batch, token_loss, "tests/model_zoo.py:t5")


def mixtral() -> Workload:
    """A Mixtral-like mixture of experts: 4 experts, top-2 routing."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        use_cache=False, router_jitter_noise=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return Workload(MixtralForCausalLM(_eager(cfg)), _causal_batch, token_loss, "tests/model_zoo.py:mixtral")


def _basic_block(channels: int) -> nn.Module:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
            self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))

    return Residual()


def cnn_sequential() -> Workload:
    """A small ResNet written as one ``nn.Sequential`` (stem, two stages of residual blocks, head)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Sequential(_basic_block(8), _basic_block(8)),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.Sequential(_basic_block(16), _basic_block(16)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        return torch.randn(batch_size, 3, 16, 16, generator=g), torch.randint(0, 10, (batch_size,), generator=g)

    return Workload(model, make_batch, nn.functional.cross_entropy, "tests/model_zoo.py:cnn_sequential")


def unet() -> Workload:
    from profiles.models.unet import unet_small

    w = unet_small()
    return Workload(w.model, w.make_batch, w.loss_fn, "tests/model_zoo.py:unet")


class Wrapped(nn.Module):
    """One extra module around a transformers model, as training code often has it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.m = inner

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids).logits


def wrapped_gpt2() -> Workload:
    w = gpt2()
    return Workload(Wrapped(w.model), w.make_batch, w.loss_fn, "tests/model_zoo.py:wrapped_gpt2")
