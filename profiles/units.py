"""Choosing the units a profile measures: module FQNs in execution order.

The default follows the model's structure (:func:`choose_units`):

1. Single-child wrappers are descended (``self.m = HFModel(...)``): the model is what they wrap.
2. Every repeated block list (an ``nn.ModuleList`` or ``nn.Sequential`` of two or more children of one
   type with parameters) contributes each block as a unit: an encoder's and a decoder's blocks, a UNet's
   down and up paths, a vision tower's and a language model's layers. A block is never split further
   (the experts inside a MoE layer stay in their layer).
3. A module that holds a block list somewhere below it is opened: its children with parameters become
   units, or are opened in turn. The children of a top-level ``nn.Sequential`` are units whatever their
   types (and a child that is a block list gives its blocks).
4. A unit that is an ``nn.Sequential``, or that holds more than half of the parameters, is replaced by its
   children while it has two or more with parameters.
5. A unit runs exactly once per forward: a module called twice (T5's shared embedding, called by the
   encoder and the decoder) is no unit; its code runs inside the units around its calls.

Units are sorted by their first call. :class:`UnitChoice` says how they were chosen and warns when there
are too few to cut well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.errors import UsageError

__all__ = [
    "UnitChoice",
    "choose_units",
    "find_units",
    "execution_order",
    "largest_block_list",
    "is_block_list",
    "expert_layout",
    "attention_heads",
]

# Below this many units a plan has few cut points to choose from: the profile warns.
FEW_UNITS = 4
# A unit holding more than this fraction of the parameters is split when it can be.
DOMINANT_FRACTION = 0.5


@dataclass(frozen=True)
class UnitChoice:
    """The units a profile measures and how they were chosen."""

    units: tuple[str, ...]
    """Module FQNs in execution order."""
    how: str
    """One line: the rule that chose them (block lists found, wrappers descended, explicit list, depth)."""
    warnings: tuple[str, ...] = ()
    """Why these units may cut badly (too few, one unit holding most of the parameters)."""


def _trace_calls(model: nn.Module, example_inputs: tuple[Any, ...]) -> tuple[dict[str, int], dict[str, int]]:
    """FQN -> rank of its first call, and FQN -> number of calls, in one forward pass without grad."""
    order: dict[str, int] = {}
    calls: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():

        def pre_hook(_module: nn.Module, _args: Any, _name: str = name) -> None:
            order.setdefault(_name, len(order))
            calls[_name] = calls.get(_name, 0) + 1

        handles.append(module.register_forward_pre_hook(pre_hook))
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    return order, calls


def execution_order(model: nn.Module, example_inputs: tuple[Any, ...]) -> dict[str, int]:
    """FQN -> rank of its first call in one forward pass (modules never called are absent)."""
    return _trace_calls(model, example_inputs)[0]


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def is_block_list(module: nn.Module) -> bool:
    """A ``ModuleList``/``Sequential`` of >= 2 children of one type, with parameters: repeated blocks."""
    if not isinstance(module, (nn.ModuleList, nn.Sequential)):
        return False
    children = list(module.children())
    return len(children) >= 2 and len({type(c) for c in children}) == 1 and _param_count(module) > 0


def largest_block_list(model: nn.Module) -> str | None:
    """FQN of the block list (:func:`is_block_list`) with the most parameters."""
    best: tuple[int, str] | None = None
    for name, module in model.named_modules():
        if is_block_list(module):
            count = _param_count(module)
            if best is None or count > best[0]:
                best = (count, name)
    return None if best is None else best[1]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class _Discovery:
    """The default rule (module docstring), with what it did for :attr:`UnitChoice.how`."""

    def __init__(self, model: nn.Module, order: dict[str, int], calls: dict[str, int]) -> None:
        self.model = model
        self.order = order
        self.calls = calls
        self.total = max(1, _param_count(model))
        self.block_lists: list[str] = []
        self.split: list[str] = []

    def children(self, fqn: str) -> list[str]:
        return [_join(fqn, n) for n, c in self.model.get_submodule(fqn).named_children() if _param_count(c) > 0]

    def has_block_list(self, fqn: str) -> bool:
        return any(is_block_list(m) for m in self.model.get_submodule(fqn).modules())

    def called(self, fqn: str) -> list[str]:
        """``[fqn]`` if it runs once; else its descendants that do (containers are never called)."""
        count = self.calls.get(fqn, 0)
        if count == 1:
            return [fqn]
        if count > 1:
            return []  # called more than once: its code runs inside the units around each call
        return [u for child in self.children(fqn) for u in self.called(child)]

    def expand(self, fqn: str, top: bool = False) -> list[str]:
        module = self.model.get_submodule(fqn)
        if is_block_list(module):
            self.block_lists.append(fqn)
            return [u for child in self.children(fqn) for u in self.called(child)]
        if top or self.has_block_list(fqn):
            return [u for child in self.children(fqn) for u in self.expand(child)]
        return self.called(fqn)

    def splittable(self, fqn: str) -> list[str] | None:
        """The units that replace ``fqn`` (rule 4), or None to keep it."""
        module = self.model.get_submodule(fqn)
        dominant = _param_count(module) > DOMINANT_FRACTION * self.total
        if not (isinstance(module, nn.Sequential) or dominant):
            return None
        parts = [u for child in self.children(fqn) for u in self.expand(child)]
        return parts if len(parts) >= 2 else None

    def run(self) -> tuple[list[str], list[str]]:
        root, wrappers = "", []
        while True:  # rule 1: descend single-child wrappers
            module = self.model.get_submodule(root)
            children = self.children(root)
            own = any(True for _ in module.parameters(recurse=False))
            if len(children) != 1 or own or is_block_list(module):
                break
            root = children[0]
            wrappers.append(root)
        units = self.expand(root, top=True) if self.children(root) else self.called(root)
        pending = list(units)
        units = []
        while pending:  # rule 4, to a fixed point
            unit = pending.pop(0)
            parts = self.splittable(unit)
            if parts is None:
                units.append(unit)
            else:
                self.split.append(unit)
                pending = parts + pending
        how: list[str] = []
        if wrappers:
            how.append(f"inside wrapper {wrappers[-1]}")
        if self.block_lists:
            lists = ", ".join(f"{b or '<root>'} ({len(self.children(b))})" for b in self.block_lists)
            how.append(f"a unit per block of {lists}")
        elif isinstance(self.model.get_submodule(root), nn.Sequential):
            how.append("the children of the top-level Sequential")
        else:
            how.append("no repeated block list: the top-level modules with parameters")
        if self.split:
            how.append(f"split {', '.join(self.split[:3])}{' ...' if len(self.split) > 3 else ''} into its children")
        return units, how


def _default_units(model: nn.Module, order: dict[str, int], calls: dict[str, int]) -> tuple[list[str], str]:
    units, how = _Discovery(model, order, calls).run()
    return units, "default: " + "; ".join(how)


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


def _validate(model: nn.Module, units: Sequence[str], order: dict[str, int], calls: dict[str, int]) -> None:
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
        if calls.get(unit, 0) > 1:
            raise UsageError(
                f"unit {unit!r} is called {calls[unit]} times in one forward pass (a shared module?): a unit runs "
                "once; list the modules that call it, or leave it out"
            )


def _warnings(model: nn.Module, units: Sequence[str], default: bool) -> tuple[str, ...]:
    out = []
    if len(units) < FEW_UNITS:
        out.append(
            f"only {len(units)} unit{'s' if len(units) != 1 else ''}: a plan cuts only between units, so at most "
            f"{len(units)} stages; name smaller modules with --units FQN,FQN,... or a depth (--units 2)"
        )
    total = max(1, _param_count(model))
    for unit in units:
        share = _param_count(model.get_submodule(unit)) / total
        if default and share > DOMINANT_FRACTION and len(units) > 1:
            out.append(
                f"unit {unit} holds {share:.0%} of the parameters and cannot be split further by the default rule: "
                "stages will be uneven; name its submodules with --units"
            )
    return tuple(out)


def choose_units(
    model: nn.Module, example_inputs: tuple[Any, ...], spec: Sequence[str] | int | None = None
) -> UnitChoice:
    """Unit FQNs in execution order, how they were chosen, and warnings.

    Parameters
    ----------
    model, example_inputs:
        The model and a batch it accepts (``model(*example_inputs)``), run once without grad.
    spec:
        ``None`` for the default (the module docstring's rules), a list of FQNs (validated, returned in
        execution order), or an int depth (all modules with parameters at that depth, 1 = the model's
        children; shallower leaves too).

    Raises
    ------
    UsageError
        Unknown FQN, a unit never called or called twice, duplicated or nested units, depth < 1, no units.
    """
    order, calls = _trace_calls(model, example_inputs)
    if spec is None:
        units, how = _default_units(model, order, calls)
    elif isinstance(spec, bool):
        raise UsageError(f"unit spec {spec!r} is not a list of module names or a depth")
    elif isinstance(spec, int):
        units, how = _depth_units(model, spec, order), f"modules with parameters at depth {spec}"
    else:
        units, how = list(spec), "listed explicitly"
        _validate(model, units, order, calls)
    if not units:
        raise UsageError(f"no units found in {type(model).__name__}: pass the unit FQNs explicitly")
    units = sorted(units, key=order.__getitem__)
    return UnitChoice(tuple(units), how, _warnings(model, units, spec is None))


def find_units(model: nn.Module, example_inputs: tuple[Any, ...], spec: Sequence[str] | int | None = None) -> list[str]:
    """:func:`choose_units`' unit FQNs alone."""
    return list(choose_units(model, example_inputs, spec).units)


_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
_EXPERT_TOP_K = ("top_k", "num_experts_per_tok", "router_top_k")


def _int_attr(module: object, names: Sequence[str]) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def attention_heads(model: nn.Module) -> dict[str, int]:
    """``{"attention_heads": H, "kv_heads": KV}`` from the first transformers-style ``config`` among ``model`` and
    its submodules (``num_attention_heads``, ``num_key_value_heads`` defaulting to it); empty when none says.
    A tensor-parallel plan splits the heads, so its degree must divide both (planner/tensor_parallel.py)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        heads = _int_attr(config, ("num_attention_heads",)) if config is not None else None
        if heads is not None:
            kv = _int_attr(config, ("num_key_value_heads",)) or heads
            return {"attention_heads": heads, "kv_heads": kv}
    return {}


def expert_layout(model: nn.Module, units: Sequence[str]) -> list[dict[str, Any]]:
    """The mixture-of-experts modules of ``model``: where they are, how many experts, how many per token.

    A module counts as an expert container when it has an int ``num_experts`` (or ``num_local_experts``,
    ``n_routed_experts``: transformers' names) and a parameter stacked per expert or a child per expert;
    ``top_k`` is read from it or its parent (the MoE block that routes); a router, whose weight is
    (experts, hidden), does not count. Each entry: ``{"module", "unit", "experts", "top_k"}`` (``unit``
    None when outside every unit, ``top_k`` None when not found). Only the innermost such modules count.
    """
    modules = dict(model.named_modules())

    def holds_experts(module: nn.Module) -> bool:
        # The experts themselves: a weight per expert stacked on dim 0 (transformers' fused experts), or one
        # child module per expert. A router also knows num_experts, but its weight is (experts, hidden).
        count = _int_attr(module, _EXPERT_COUNTS)
        if count is None:
            return False
        stacked = any(p.dim() >= 3 and p.shape[0] == count for p in module.parameters(recurse=False))
        listed = any(isinstance(c, nn.ModuleList) and len(c) == count for c in module.children())
        return stacked or listed or (isinstance(module, nn.ModuleList) and len(module) == count)

    counted = [n for n, m in modules.items() if holds_experts(m)]
    found: list[dict[str, Any]] = []
    for name in counted:
        if any(o != name and (name == "" or o.startswith(name + ".")) for o in counted):
            continue  # an outer holder of the setting, not the experts themselves
        module = modules[name]
        count = _int_attr(module, _EXPERT_COUNTS)
        parent = modules.get(name.rpartition(".")[0]) if name else None
        top_k = _int_attr(module, _EXPERT_TOP_K) or (_int_attr(parent, _EXPERT_TOP_K) if parent is not None else None)
        unit = next((u for u in units if name == u or name.startswith(u + ".")), None)
        found.append({"module": name, "unit": unit, "experts": count, "top_k": top_k})
    return found
