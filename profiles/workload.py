"""The model-spec protocol: what a MODEL argument names, and how it is resolved.

A MODEL is a built-in name (``pipeplan profile --help`` lists them), ``path/to/file.py:NAME``,
``package.module:NAME`` or ``hf:path/to/config.json`` (:mod:`profiles.models.hf_config`). NAME is a
zero-argument callable returning a :class:`Workload` (or a ``(model, make_batch, loss_fn)`` tuple).

The checks and adapters a user's workload goes through are here too. The :class:`Workload` type itself lives
one floor down (:mod:`profiles.workload_type`, re-exported here), where the built-in models this resolver looks
up can import it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import ModelSpecError, shorten
from profiles.workload_type import Workload

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
    "adapt_workload",
    "pick_output",
]


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


def load_workload(spec: str, *, meta: bool = False, **builtin_options: Any) -> Workload:
    """Resolve a MODEL spec into a :class:`Workload`.

    ``builtin_options`` (``seq_len``; ``task`` for ``hf:``) reach built-in models and ``hf:`` configs
    only; user callables take no arguments. A user's workload goes through :func:`adapt_workload`.

    With ``meta`` the model is built with its parameters on the meta device (no weights held, buffers
    kept: :mod:`profiles.meta`); the workload's ``meta_buffers`` is then set. Raises
    :class:`ModelSpecError` when the spec cannot be built that way (its model made at import time).
    """
    from profiles.models import BUILTIN_MODELS

    if meta:
        from profiles.meta import move_to_meta, parameters_on_meta

        try:
            with parameters_on_meta():
                workload = _build_workload(spec, builtin_options)
        except ModelSpecError as exc:  # e.g. the spec moves its model (.to(device)): meta cannot be copied out
            raise ModelSpecError(f"cannot build {shorten(spec, 60)} on the meta device: {exc}") from None
        workload = replace(workload, meta_buffers=move_to_meta(workload.model, spec))
    else:
        workload = _build_workload(spec, builtin_options)
    # built-ins return tensors from positional inputs already: nothing to adapt
    return workload if spec in BUILTIN_MODELS else adapt_workload(workload)


def _build_workload(spec: str, builtin_options: Mapping[str, Any]) -> Workload:
    """The spec's workload as built, before :func:`adapt_workload`."""
    from profiles.models import BUILTIN_MODELS

    options = {k: v for k, v in builtin_options.items() if v is not None}
    if spec.startswith("hf:"):
        from profiles.models.hf_config import hf_config_workload

        return hf_config_workload(spec, task=options.get("task"), seq_len=options.get("seq_len"))
    if "task" in options:
        raise ModelSpecError(f"--task applies to hf:CONFIG.json models only, not to {shorten(spec, 80)}")
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec](**options)
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
        result = replace(result, name=spec)
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


def pick_output(out: Any) -> torch.Tensor:
    """The tensor a loss takes from a model's output: itself, its ``logits``, or its first tensor.

    A ModelOutput or dict is searched in its key order (``logits`` first), a tuple or list in order.
    """
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        values = list(out.values())
    elif isinstance(out, (tuple, list)):
        values = list(out)
    else:
        raise ModelSpecError(
            f"the model returned {type(out).__name__}: return a tensor, a ModelOutput, a dict or a tuple of tensors, "
            "or give the Workload an output function"
        )
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    for value in values:  # a nested structure: its first tensor
        if isinstance(value, (Mapping, tuple, list)):
            try:
                return pick_output(value)
            except ModelSpecError:
                continue
    raise ModelSpecError(f"the model returned a {type(out).__name__} with no tensor in it: nothing to take a loss of")


def _describe_pick(out: Any) -> str:
    import torch

    if isinstance(out, Mapping):
        for key, value in out.items():
            if value is pick_output(out) or (key == "logits" and isinstance(value, torch.Tensor)):
                return f"{key!r} of the {type(out).__name__} it returns"
    if isinstance(out, (tuple, list)):
        return f"the first tensor of the {type(out).__name__} it returns"
    return f"the tensor picked from the {type(out).__name__} it returns"


def _adapted_forward(
    forward: Callable[..., Any], keys: tuple[str, ...] | None, pick: Callable[[Any], Any]
) -> Callable[..., Any]:
    """``model.forward`` made positional-in, tensor-out: keyword inputs in a fixed order, one output picked.

    Installed on the instance, not as a wrapper module, so that every FQN, parameter tie and the
    fingerprint stay the model's own (a wrapper would prefix every name). A plain function, because
    torch.export reads ``forward.__code__``.
    """

    def adapted(*args: Any, **kwargs: Any) -> Any:
        if keys is not None:
            kwargs = {**dict(zip(keys, args, strict=False)), **kwargs}
            args = ()
        return pick(forward(*args, **kwargs))

    params = inspect.Parameter
    if keys is not None:
        # torch.export binds the example inputs to this signature: one named parameter per input.
        adapted.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [params(k, params.POSITIONAL_OR_KEYWORD) for k in keys]
        )
    else:
        try:
            adapted.__signature__ = inspect.signature(forward)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
    adapted._pipeplan_adapted = True  # type: ignore[attr-defined]
    return adapted


def adapt_workload(workload: Workload, batch_size: int = 1) -> Workload:
    """``workload`` with ``model(*inputs)`` returning a tensor: what torch's pipelining can split.

    Keyword inputs (``make_batch`` returning a dict) are passed positionally in the dict's key order;
    a ModelOutput, dict or tuple output is reduced to ``workload.output(out)`` or :func:`pick_output`.
    Runs one forward without gradients on ``make_batch(batch_size)`` to see what the model returns.
    Returns ``workload`` itself when nothing needs adapting (or it was adapted already); otherwise a
    Workload whose ``notes`` say what was done. The model's ``forward`` is replaced on the instance.
    """
    import torch

    model = workload.model
    if getattr(model.__dict__.get("forward"), "_pipeplan_adapted", False):
        return workload
    try:
        inputs, _ = workload.make_batch(batch_size)
    except SystemExit as exc:
        raise ModelSpecError(f"make_batch({batch_size}) called sys.exit({exc.code!r})") from None
    except Exception as exc:
        raise ModelSpecError(f"make_batch({batch_size}) failed: {_one_line(exc)}") from None
    keys = tuple(inputs) if isinstance(inputs, Mapping) else None
    if keys is not None and not all(isinstance(k, str) for k in keys):
        raise ModelSpecError(f"make_batch({batch_size}) returned a dict whose keys are not all names: {keys!r}")
    # In eval mode, so that the look does not move BatchNorm's running statistics (nor fail on a batch of 1).
    # A model on the meta device (load_workload(meta=True)) runs on fake meta inputs: profiles/meta.py.
    probe = contextlib.nullcontext(inputs)
    if workload.meta_buffers is not None:
        from profiles.meta import eager_on_meta

        probe = eager_on_meta(inputs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), probe as inputs:
            out = model(**inputs) if keys is not None else model(*as_tuple(inputs))
    except (Exception, SystemExit) as exc:
        if keys is None:
            return workload  # check_output reports it, with the shapes
        if isinstance(exc, SystemExit):
            raise ModelSpecError(f"the model's forward called sys.exit({exc.code!r})") from None
        raise ModelSpecError(
            f"the model's forward failed on make_batch({batch_size})'s inputs (by keyword: {', '.join(keys)}): "
            f"{_one_line(exc)}"
        ) from None
    finally:
        model.train(was_training)
    if keys is None and workload.output is None and isinstance(out, torch.Tensor):
        return workload
    pick = workload.output or pick_output
    notes = []
    if keys is not None:
        notes.append(f"inputs passed by keyword: {', '.join(keys)}")
    if workload.output is not None:
        notes.append("output: the Workload's output function")
    elif not isinstance(out, torch.Tensor):
        pick_output(out)  # a structure with no tensor fails here, in one line
        notes.append(f"output: {_describe_pick(out)} (give the Workload an output function to choose another)")
    model.forward = _adapted_forward(model.forward, keys, pick)
    make_batch = original = workload.make_batch
    if keys is not None:
        order = keys

        def positional(batch_size: int) -> tuple[Any, Any]:
            inputs, target = original(batch_size)
            if not isinstance(inputs, Mapping) or tuple(inputs) != order:
                raise ModelSpecError(
                    f"make_batch({batch_size}) returned inputs {shorten(repr(list(inputs)), 80)}, "
                    f"not the keywords {list(order)} of make_batch(1)"
                )
            return tuple(inputs[k] for k in order), target

        make_batch = positional
    return replace(workload, make_batch=make_batch, notes=(*workload.notes, *notes))
