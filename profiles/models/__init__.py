"""Built-in models: random-initialised with fixed seeds, nothing downloaded.

Each factory takes an optional keyword ``seq_len`` (ignored where it does not apply) and returns a
:class:`profiles.workload.Workload` whose ``model(*inputs)`` returns a tensor, so that
``torch.distributed.pipelining`` can split it.
"""

from __future__ import annotations

from collections.abc import Callable

from profiles.models.hf import gpt2_small, gpt2_tiny, llama_small
from profiles.models.mlp import mlp
from profiles.models.unet import unet_small
from profiles.workload import Workload

__all__ = ["BUILTIN_MODELS"]

BUILTIN_MODELS: dict[str, Callable[..., Workload]] = {
    "mlp": mlp,
    "gpt2-tiny": gpt2_tiny,
    "gpt2-small": gpt2_small,
    "llama-small": llama_small,
    "unet-small": unet_small,
}
