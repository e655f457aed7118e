"""Choosing the units a profile measures: module FQNs in execution order.

The default is each block of the model's largest repeated block list (``transformer.h.0..11``)
plus, as units of their own, the modules with parameters that run before and after it
(embeddings, final norm, LM head).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from planner.errors import UsageError

__all__ = ["find_units", "execution_order", "largest_block_list"]


def execution_order(model: nn.Module, example_inputs: tuple[Any, ...]) -> dict[str, int]:
    """FQN -> rank of its first call in one forward pass (modules never called are absent)."""
    order: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():

        def pre_hook(_module: nn.Module, _args: Any, _name: str = name) -> None:
            order.setdefault(_name, len(order))

        handles.append(module.register_forward_pre_hook(pre_hook))
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return order


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def largest_block_list(model: nn.Module) -> str | None:
    """FQN of the ``ModuleList``/``Sequential`` of >= 2 same-type children with the most parameters."""
    best: tuple[int, str] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        count = _param_count(module)
        if count > 0 and (best is None or count > best[0]):
            best = (count, name)
    return None if best is None else best[1]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _default_units(model: nn.Module, order: dict[str, int]) -> list[str]:
    block_list = largest_block_list(model)
    if block_list is None:
        # No repeated blocks: the top-level children that hold parameters.
        return [n for n, m in model.named_children() if _param_count(m) > 0 and n in order]
    units = [_join(block_list, n) for n, _ in model.get_submodule(block_list).named_children()]
    # Siblings of the block list and of each of its ancestors: the code before and after it.
    parts = block_list.split(".")
    for depth in range(len(parts)):
        ancestor = ".".join(parts[:depth])
        on_path = _join(ancestor, parts[depth])
        for name, child in model.get_submodule(ancestor).named_children():
            fqn = _join(ancestor, name)
            if fqn != on_path and _param_count(child) > 0:
                units += _called(model, fqn, order)
    return [u for u in units if u in order]


def _called(model: nn.Module, fqn: str, order: dict[str, int]) -> list[str]:
    """``[fqn]`` if it is called, else its called descendants: containers (ModuleList) are never called."""
    if fqn in order:
        return [fqn]
    found: list[str] = []
    for name, _ in model.get_submodule(fqn).named_children():
        found += _called(model, _join(fqn, name), order)
    return found


def _depth_units(model: nn.Module, depth: int, order: dict[str, int]) -> list[str]:
    if depth < 1:
        raise UsageError(f"unit depth {depth} is out of range: give a depth >= 1 (1 = the model's children)")
    units: list[str] = []

    def visit(name: str, module: nn.Module, level: int) -> None:
        children = list(module.named_children())
        # A container that is never called itself (ModuleList) is looked through.
        if name and name in order and (level >= depth or not children):
            if _param_count(module) > 0:
                units.append(name)
            return
        for child_name, child in children:
            visit(_join(name, child_name), child, level + 1)

    visit("", model, 0)
    return units


def _validate(model: nn.Module, units: Sequence[str], order: dict[str, int]) -> None:
    modules = dict(model.named_modules())
    seen: set[str] = set()
    for unit in units:
        if unit not in modules or unit == "":
            close = [n for n in modules if n and n.endswith(unit.rsplit(".", 1)[-1])][:3]
            hint = f" (similar: {', '.join(close)})" if close else ""
            raise UsageError(f"unknown unit {unit!r}: not a submodule of {type(model).__name__}{hint}")
        if unit in seen:
            raise UsageError(f"unit {unit!r} is listed twice")
        seen.add(unit)
    for a in units:
        for b in units:
            if b.startswith(a + "."):
                raise UsageError(f"units {a!r} and {b!r} overlap: {b!r} is inside {a!r}; keep one of them")
    for unit in units:
        if unit not in order:
            raise UsageError(
                f"unit {unit!r} is never called in the forward pass (a container?): list its children instead"
            )


def find_units(model: nn.Module, example_inputs: tuple[Any, ...], spec: Sequence[str] | int | None = None) -> list[str]:
    """Unit FQNs in execution order.

    Parameters
    ----------
    model, example_inputs:
        The model and a batch it accepts (``model(*example_inputs)``), run once without grad.
    spec:
        ``None`` for the default (largest repeated block list + what runs before/after it), a list of
        FQNs (validated, returned in execution order), or an int depth (all modules with parameters at
        that depth, 1 = the model's children; shallower leaves too).

    Raises
    ------
    UsageError
        Unknown FQN, a unit never called, duplicated or nested units, depth < 1, no units found.
    """
    order = execution_order(model, example_inputs)
    if spec is None:
        units = _default_units(model, order)
    elif isinstance(spec, bool):
        raise UsageError(f"unit spec {spec!r} is not a list of module names or a depth")
    elif isinstance(spec, int):
        units = _depth_units(model, spec, order)
    else:
        units = list(spec)
        _validate(model, units, order)
    if not units:
        raise UsageError(f"no units found in {type(model).__name__}: pass the unit FQNs explicitly")
    return sorted(units, key=order.__getitem__)
