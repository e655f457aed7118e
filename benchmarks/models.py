"""Benchmark-only workloads, used through the MODEL spec protocol (``benchmarks/models.py:gpt2_deep``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiles.models.hf import _gpt2  # noqa: E402
from profiles.workload import Workload  # noqa: E402

__all__ = ["gpt2_deep", "GPT2_DEEP_SPEC"]

GPT2_DEEP_SPEC = "benchmarks/models.py:gpt2_deep"


def gpt2_deep() -> Workload:
    """GPT-2 with 48 blocks of width 256 (8 heads), GPT-2's vocabulary (50257), 128 tokens, random init.

    Deep and narrow: 52 units where the LM head weighs as much as many blocks, the case where a
    partitioner must both balance many small units and place one large one.
    """
    return _gpt2(
        "gpt2-deep",
        128,
        n_layer=48,
        n_embd=256,
        n_head=8,
        n_positions=128,
    )
