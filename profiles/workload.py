"""The model-spec protocol: what a MODEL argument names, and how it is resolved.

A MODEL is a built-in name (``pipeplan profile --help`` lists them), ``path/to/file.py:NAME`` or
``package.module:NAME``. NAME is a zero-argument callable returning a :class:`Workload`
(or a ``(model, make_batch, loss_fn)`` tuple).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import ModelSpecError, shorten

if TYPE_CHECKING:  # torch is imported where a model is built, so that the planner's CLI starts fast
    import torch
    from torch import nn

__all__ = [
    "Workload",
    "load_workload",
    "as_tuple",
    "check_model_signature",
    "check_batch",
    "check_output",
    "active_dropout",
]


@dataclass(frozen=True)
class Workload:
    """A model with the means to feed it.

    ``make_batch(batch_size)`` returns ``(inputs, target)``: ``inputs`` a tensor or a tuple of tensors
    passed positionally to ``model``, ``target`` what ``loss_fn(model(*inputs), target)`` takes.
    For pipelining, ``model(*inputs)`` must return a tensor (e.g. logits, not a ModelOutput).
    """

    model: nn.Module
    make_batch: Callable[[int], tuple[Any, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    name: str = ""
    units: tuple[str, ...] | None = None
    """Optional default unit FQNs, in execution order; the profiler finds them when None."""


def as_tuple(inputs: Any) -> tuple[torch.Tensor, ...]:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _one_line(exc: BaseException) -> str:
    return shorten(f"{type(exc).__name__}: {exc}", 200)


def _resolve_callable(spec: str) -> Callable[..., Any]:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ModelSpecError(
            f"unknown model {spec!r}: give a built-in name, path/to/file.py:NAME or package.module:NAME"
        )
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ModelSpecError(f"model file not found: {path}")
        module_name = f"_pipeplan_user_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelSpecError(f"cannot import {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except SystemExit as exc:  # sys.exit() in a model file would end pipeplan with no profile written
            raise ModelSpecError(
                f"importing {path} called sys.exit({exc.code!r}): a model file must not exit"
            ) from None
        except Exception as exc:  # the user's file: any error is theirs to see in one line
            raise ModelSpecError(f"importing {path} failed: {_one_line(exc)}") from None
    else:
        try:
            module = importlib.import_module(target)
        except SystemExit as exc:
            raise ModelSpecError(
                f"importing {target} called sys.exit({exc.code!r}): a model module must not exit"
            ) from None
        except Exception as exc:
            raise ModelSpecError(f"cannot import module {target!r}: {_one_line(exc)}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ModelSpecError(f"{target} has no attribute {attr!r}") from None


def load_workload(spec: str, **builtin_options: Any) -> Workload:
    """Resolve a MODEL spec into a :class:`Workload`.

    ``builtin_options`` (e.g. ``seq_len``) reach built-in models only; user callables take no arguments.
    """
    from profiles.models import BUILTIN_MODELS

    options = {k: v for k, v in builtin_options.items() if v is not None}
    if spec in BUILTIN_MODELS:
        workload = BUILTIN_MODELS[spec](**options)
        return workload
    if ":" not in spec:
        raise ModelSpecError(
            f"unknown model {spec!r}: built-ins are {', '.join(sorted(BUILTIN_MODELS))}; "
            "or give path/to/file.py:NAME or package.module:NAME"
        )
    factory = _resolve_callable(spec)
    if not callable(factory):
        raise ModelSpecError(f"{spec} is not callable: NAME must be a zero-argument function returning a Workload")
    try:
        result = factory()
    except SystemExit as exc:
        raise ModelSpecError(f"calling {spec}() called sys.exit({exc.code!r}): it must return a Workload") from None
    except Exception as exc:
        raise ModelSpecError(f"calling {spec}() failed: {_one_line(exc)}") from None
    if isinstance(result, tuple) and len(result) == 3:
        result = Workload(*result)
    if not isinstance(result, Workload):
        raise ModelSpecError(
            f"{spec}() returned {type(result).__name__}: expected a Workload or (model, make_batch, loss_fn)"
        )
    from torch import nn

    if not isinstance(result.model, nn.Module):
        raise ModelSpecError(f"{spec}(): model is {type(result.model).__name__}, expected a torch.nn.Module")
    if not callable(result.make_batch) or not callable(result.loss_fn):
        raise ModelSpecError(f"{spec}(): make_batch and loss_fn must be callable")
    if not result.name:
        result = Workload(result.model, result.make_batch, result.loss_fn, spec, result.units)
    return result


def check_model_signature(model: nn.Module) -> None:
    """The pipeline calls ``model(*inputs)``: a required keyword-only argument can never be passed."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return  # a builtin or C forward: nothing to inspect
    required = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if required:
        raise ModelSpecError(
            f"{type(model).__name__}.forward has required keyword-only arguments ({', '.join(required)}): "
            "the pipeline passes make_batch's inputs positionally; give them defaults or make them positional"
        )


def check_batch(batch_size: int, inputs: Any, target: Any) -> None:
    """``make_batch(batch_size)`` returned tensors whose first dimension is ``batch_size``."""
    import torch

    tensors = as_tuple(inputs)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        kinds = ", ".join(type(t).__name__ for t in tensors) or "nothing"
        raise ModelSpecError(
            f"make_batch({batch_size}) returned inputs of {kinds}: expected a tensor or a tuple of tensors"
        )
    if not isinstance(target, torch.Tensor):
        raise ModelSpecError(
            f"make_batch({batch_size}) returned a target of {type(target).__name__}: expected a tensor"
        )
    for what, t in [*((f"input {i}", t) for i, t in enumerate(tensors)), ("the target", target)]:
        if t.dim() == 0 or t.shape[0] != batch_size:
            raise ModelSpecError(
                f"make_batch({batch_size}) returned {what} of shape {tuple(t.shape)}: its first dimension must be "
                f"the batch size {batch_size} (make_batch must use its batch_size argument)"
            )


def check_output(model: nn.Module, inputs: tuple[Any, ...], batch_size: int) -> None:
    """One forward without gradients: it runs on make_batch's inputs and returns a tensor."""
    import torch

    try:
        with torch.no_grad():
            out = model(*inputs)
    except SystemExit as exc:
        raise ModelSpecError(f"the model's forward called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise ModelSpecError(
            f"the model's forward failed on make_batch({batch_size})'s inputs "
            f"(shapes {[tuple(getattr(t, 'shape', ())) for t in inputs]}): {_one_line(exc)}"
        ) from None
    if not isinstance(out, torch.Tensor):
        raise ModelSpecError(
            f"forward must return a tensor (it returned {type(out).__name__}): torch.distributed.pipelining "
            "splits a model whose forward returns one tensor; return e.g. the logits (output.logits, output[0])"
        )


def active_dropout(model: nn.Module) -> list[str]:
    """Dropout modules with p > 0: in training mode they make every run, and so every profile, differ."""
    from torch import nn

    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    return [name for name, m in model.named_modules() if isinstance(m, kinds) and m.p > 0]
