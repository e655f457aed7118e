"""Built-in models: random-initialised with fixed seeds, nothing downloaded.

Each factory takes an optional keyword ``seq_len`` (ignored where it does not apply) and returns a
:class:`profiles.workload.Workload` whose ``model(*inputs)`` returns a tensor, so that
``torch.distributed.pipelining`` can split it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping

from profiles.workload_type import Workload

__all__ = ["BUILTIN_MODELS", "BUILTIN_NAMES"]

# name -> (module, factory); imported on first use so that `pipeplan plan --help` does not load transformers.
_FACTORIES: dict[str, tuple[str, str]] = {
    "mlp": ("profiles.models.mlp", "mlp"),
    "gpt2-tiny": ("profiles.models.hf", "gpt2_tiny"),
    "gpt2-small": ("profiles.models.hf", "gpt2_small"),
    "llama-small": ("profiles.models.hf", "llama_small"),
    "unet-small": ("profiles.models.unet", "unet_small"),
}
BUILTIN_NAMES: tuple[str, ...] = tuple(_FACTORIES)


class _LazyFactories(Mapping[str, Callable[..., Workload]]):
    def __getitem__(self, name: str) -> Callable[..., Workload]:
        module, attr = _FACTORIES[name]
        return getattr(importlib.import_module(module), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(_FACTORIES)

    def __len__(self) -> int:
        return len(_FACTORIES)


BUILTIN_MODELS: Mapping[str, Callable[..., Workload]] = _LazyFactories()
