"""Models on the meta device: built without their weights, one piece materialised at a time.

A model larger than the profiling device is built with every parameter on ``meta`` (shapes and dtypes,
no storage), the way accelerate's ``init_empty_weights(include_buffers=False)`` does it: parameters are
moved to ``meta`` as they are registered, so no weight is ever held, while buffers are built for real
(Llama's rotary ``inv_freq`` is computed in ``__init__`` and cannot be recomputed generically). Their
values are set aside by FQN and the model then moves to ``meta`` whole, so that a forward on meta inputs
(unit choice, torch.export, the data-flow capture) runs without touching memory.

To measure a unit, its piece of the split graph is materialised on the device (:func:`materialise`):
empty storage, parameters filled deterministically, buffers copied back from the set-aside values; then
:func:`release` returns it to ``meta``. Timings do not depend on weight values, but NaNs and denormals
would slow the arithmetic down, so the values are of the usual initialisers' scale.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from planner.errors import ModelSpecError, ProfilingError, shorten
from profiles.allocator import return_freed_memory
from profiles.dataflow import used_parameters

__all__ = [
    "META",
    "parameters_on_meta",
    "move_to_meta",
    "too_large",
    "eager_on_meta",
    "retarget_devices",
    "materialise",
    "release",
    "INIT_STD",
]

META = torch.device("meta")
INIT_STD = 0.02
"""Standard deviation of the weights a materialised piece gets: transformers' ``initializer_range``."""


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside is moved to ``meta`` at once; buffers are left as built.

    ``nn.Linear`` and its kind create ``torch.empty`` storage (never touched, so never resident) before
    registering it, then initialise the meta tensor, which costs nothing. A parameter already on meta
    is kept as it is: re-wrapping it would break a tie (``lm_head.weight = embed.weight``).
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        p = module._parameters.get(name)
        if p is not None and not p.is_meta and not isinstance(p, nn.parameter.UninitializedParameter):
            module._parameters[name] = type(p)(p.detach().to(META), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _device_memory_bytes(device: str) -> int | None:
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None  # the profiler says so, in its own words
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_large(model: nn.Module, device: str, dtype: str) -> str:
    """Why a model (on meta) cannot be profiled whole on ``device``, or "" when it can.

    A loaded profile holds every weight and its gradient at once (activations come on top): when those
    two alone exceed the device's memory, only a meta profile can run.
    """
    from planner.formatting import human_bytes

    memory = _device_memory_bytes(device)
    count = sum({id(p): p.numel() for p in model.parameters()}.values())
    weights = count * _DTYPE_BYTES.get(dtype, 4)
    if memory is None or 2 * weights <= memory:
        return ""
    return (
        f"{count:,} parameters: {human_bytes(weights)} of {dtype} weights, {human_bytes(2 * weights)} with their "
        f"gradients, more than the {human_bytes(memory)} of this {device.split(':')[0]} device"
    )


def move_to_meta(model: nn.Module, spec: str) -> dict[str, torch.Tensor]:
    """Move ``model`` (built under :func:`parameters_on_meta`) wholly to meta; return its buffers' values.

    Raises :class:`ModelSpecError` when a parameter was not built on meta: the spec handed over a model
    built before pipeplan imported or called it.
    """
    stray = [(n, p.device) for n, p in model.named_parameters() if not p.is_meta]
    if stray or not any(True for _ in model.parameters()):
        where = f"parameter {stray[0][0]} is on {stray[0][1]}" if stray else "it has no parameters"
        raise ModelSpecError(
            f"cannot build {shorten(spec, 80)} on the meta device: {where}; a spec profiled with --meta must "
            "build its model when pipeplan imports or calls it (not take one built before)"
        )
    values = {name: b.detach().clone() for name, b in model.named_buffers() if not b.is_meta}
    missing = [name for name, b in model.named_buffers() if b.is_meta]
    if missing:
        raise ModelSpecError(
            f"cannot build {shorten(spec, 80)} on the meta device: buffer {missing[0]} has no value (made on meta)"
        )
    model.to(META)
    return values


@contextlib.contextmanager
def eager_on_meta(inputs: Any) -> Iterator[Any]:
    """``inputs`` as fake tensors on meta, under an active ``FakeTensorMode``: for eager forwards of a meta model.

    Plain meta tensors fail a model's data-dependent checks (transformers' mask code asks ``.all()`` of
    the position ids: "Tensor.item() cannot be called on meta tensors"); code that traces skips them, and
    transformers counts a fake tensor as tracing. The unit choice, the output check and adapt_workload's
    probe run this way.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # the meta parameters are not fake: let them in
    fake = tree_map(lambda t: mode.from_tensor(t.to(META)) if isinstance(t, torch.Tensor) else t, inputs)
    with mode:
        yield fake


def retarget_devices(module: nn.Module, device: torch.device) -> int:
    """Rewrite ``meta`` to ``device`` in the graphs of a piece exported on meta; returns the nodes changed.

    An export on meta inputs records the inputs' device in the graph (``arange(..., device=meta)``, the
    device checks of ``_assert_tensor_metadata``): left as it is, the piece would make meta tensors, or
    fail its own checks, when run on real inputs. Code is regenerated for the changed graphs.
    """

    def swap(value: Any) -> Any:
        if isinstance(value, torch.device) and value.type == "meta":
            return device
        if isinstance(value, (tuple, list)):
            return type(value)(swap(v) for v in value)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        return value

    changed = 0
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        touched = False
        for node in graph.nodes:
            args, kwargs = swap(node.args), swap(node.kwargs)
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs = args, kwargs
                changed += 1
                touched = True
        if touched:
            if hasattr(sub, "finalize"):  # an InterpreterModule: its generated code lives in graph_module
                sub.finalize()
            elif isinstance(sub, torch.fx.GraphModule):
                sub.recompile()
    return changed


def _fill(name: str, tensor: torch.Tensor) -> None:
    """A parameter's deterministic values: normal(0, INIT_STD) for matrices, ones/zeros for norms/biases.

    Seeded by the name, so a unit gets the same weights in every run and at every micro-batch size.
    """
    leaf = name.rsplit(".", 1)[-1]
    if tensor.dim() >= 2:
        # in place: a float32 copy would double the peak of a vocabulary-sized weight
        g = torch.Generator(device=tensor.device).manual_seed(zlib.crc32(name.encode()))
        tensor.normal_(0.0, INIT_STD, generator=g)
    elif "bias" in leaf:
        tensor.zero_()
    else:  # a norm's scale (a 1-D weight): ones, as every norm starts
        tensor.fill_(1.0)


def materialise(module: nn.Module, buffers: Mapping[str, torch.Tensor], device: torch.device) -> None:
    """Give the piece ``module`` (named by model FQNs) real storage on ``device``, filled deterministically.

    Parameters get :func:`_fill`'s values, buffers their set-aside values. Raises :class:`ProfilingError`
    for a buffer with no recorded value or a tensor constant that stays on meta.
    """
    used = used_parameters(module)
    real: dict[int, nn.Parameter] = {}  # a parameter held under two names stays one tensor
    with torch.no_grad():
        for sub_name, sub in module.named_modules():
            for leaf, p in list(sub._parameters.items()):
                name = f"{sub_name}.{leaf}" if sub_name else leaf
                if p is None or name not in used:
                    continue
                if id(p) not in real:
                    tensor = torch.empty_like(p, device=device)
                    if tensor.is_floating_point():
                        _fill(name, tensor)
                    else:
                        tensor.zero_()
                    real[id(p)] = nn.Parameter(tensor, requires_grad=p.requires_grad)
                sub._parameters[leaf] = real[id(p)]
            for leaf, b in list(sub._buffers.items()):
                if b is not None:
                    sub._buffers[leaf] = torch.empty_like(b, device=device)
        for name, b in module.named_buffers():
            value = buffers.get(name)
            if value is None:
                raise ProfilingError(
                    f"buffer {name} of a unit has no value to restore on {device} after the meta build; "
                    "profile without --meta"
                )
            b.copy_(value)
    for sub_name, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                raise ProfilingError(
                    f"tensor constant {sub_name or '<piece>'}.{attr} stays on meta when its unit is materialised; "
                    "profile without --meta"
                )


def release(module: nn.Module) -> None:
    """Return the piece to ``meta``: its storage (and gradients) are freed once nothing else holds them."""
    module.zero_grad(set_to_none=True)
    module.to_empty(device=META)
    return_freed_memory()
