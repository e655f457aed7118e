"""torchtitan 0.3 config functions for pipeplan plans: ``--module examples.torchtitan.config_registry --config NAME``.

torchtitan 0.3 refuses weight tying under pipeline parallelism (``models/common/decoder.py``: "Weight tying is
not supported with Pipeline Parallel."), and Llama 3.2 1B and 3B tie their head to the embedding. These configs
build them untied: the head gets a weight of its own, which trains apart from the embedding (a checkpoint's
tied weight loads into both). The rest is torchtitan's ``llama3_8b`` config (optimizer, data, schedule).
"""

from __future__ import annotations

__all__ = ["llama3_2_1b_untied", "llama3_2_3b_untied"]


def _untied(flavor: str):
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.config_registry import llama3_8b

    config = llama3_8b()
    config.model_spec = model_registry(flavor)
    config.model_spec.model.enable_weight_tying = False
    return config


def llama3_2_1b_untied():
    """Llama 3.2 1B with its own head weight."""
    return _untied("1B")


def llama3_2_3b_untied():
    """Llama 3.2 3B (examples/llama-3b.json's shape) with its own head weight."""
    return _untied("3B")
