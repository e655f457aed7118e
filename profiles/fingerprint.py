"""A model fingerprint: structure and parameter shapes, so a profile or plan can be matched to its model."""

from __future__ import annotations

import hashlib

from torch import nn

__all__ = ["model_fingerprint", "describe_structure"]


def describe_structure(model: nn.Module) -> list[str]:
    """One line per module and per parameter/buffer; what the fingerprint hashes."""
    lines = [f"module {name or '<root>'} {type(module).__name__}" for name, module in model.named_modules()]
    lines += [f"param {name} {tuple(p.shape)}" for name, p in model.named_parameters(remove_duplicate=False)]
    lines += [f"buffer {name} {tuple(b.shape)}" for name, b in model.named_buffers()]
    return lines


def model_fingerprint(model: nn.Module) -> str:
    """sha256 hex digest of :func:`describe_structure` (independent of weight values and dtypes, so a
    bfloat16 profile matches the float32 model it came from)."""
    return hashlib.sha256("\n".join(describe_structure(model)).encode()).hexdigest()
