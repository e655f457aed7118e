"""Where a rank failed: the stage, the unit and the user's own line, for the one-line error.

A pipelined rank runs the model as traced graph code: a failure's traceback is torch's schedule, the
generated code of a split piece and an aten op, none of it the user's. :func:`where` finds, from the
exception and its traceback:

- the stage, recorded on the exception by the stage wrappers of :mod:`planner.runtime.apply`;
- the unit: the innermost module of the split piece whose generated code (or ``torch.fx.Interpreter``)
  was running, named by its original FQN, reduced to the stage's unit that contains it;
- the user's frame: the source line the traced node came from (``node.meta["stack_trace"]``), or else
  the innermost frame outside torch, pipeplan and the standard library (a ``loss_fn``, a ``make_batch``).
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Sequence
from types import TracebackType
from typing import Any

__all__ = ["STAGE_ATTR", "where", "mark_stage", "format_traceback"]

STAGE_ATTR = "_pipeplan_stage"
"""Set on an exception raised inside a stage: ``(stage index, unit FQNs of the stage, stage module)``."""

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_OWN_DIRS = (os.path.join(_ROOT, "planner") + os.sep, os.path.join(_ROOT, "profiles") + os.sep)


def _library_dirs() -> tuple[str, ...]:
    dirs = {os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep}
    try:
        import torch

        dirs.add(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return tuple(dirs) + _OWN_DIRS


def mark_stage(exc: BaseException, stage: int, units: Sequence[str], module: Any) -> None:
    """Record the stage on ``exc`` unless an inner stage did already (the innermost stage is the one)."""
    if getattr(exc, STAGE_ATTR, None) is None:
        try:
            setattr(exc, STAGE_ATTR, (stage, tuple(units), module))
        except (AttributeError, TypeError):  # an exception type that refuses attributes: no stage then
            pass


def _frames(tb: TracebackType | None) -> list[Any]:
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _graph_node(frame: Any, lineno: int) -> tuple[Any, Any] | None:
    """(module, fx node) running in a generated-code or Interpreter frame, else None."""
    import torch

    owner = frame.f_locals.get("self")
    if isinstance(owner, torch.fx.Interpreter):
        node = frame.f_locals.get("node")
        return (owner.module, node) if isinstance(node, torch.fx.Node) else None
    if not frame.f_code.co_filename.startswith("<eval_with_key>") or not isinstance(owner, torch.nn.Module):
        return None
    gm = owner.__dict__.get("graph_module", owner)  # an unflattened InterpreterModule runs its GraphModule's code
    lineno_map = getattr(gm, "_lineno_map", None)
    nodes = list(getattr(gm, "graph", torch.fx.Graph()).nodes)
    # torch.fx keys the map by the line's offset from the ``def forward`` line (``_prologue_start``)
    start = getattr(gm, "_prologue_start", frame.f_code.co_firstlineno)
    index = lineno_map.get(lineno - start) if isinstance(lineno_map, dict) else None
    node = nodes[index] if isinstance(index, int) and 0 <= index < len(nodes) else None
    return owner, node


def _unit_of(module_name: str, units: Sequence[str]) -> str | None:
    matching = [u for u in units if module_name == u or module_name.startswith(u + ".")]
    return max(matching, key=len) if matching else None


def _source_line(stack_trace: str) -> str | None:
    """``file:line in func`` of the innermost frame of a traced node's stack trace outside torch (the model's)."""
    library = _library_dirs()
    for line in reversed([ln.strip() for ln in stack_trace.splitlines() if ln.strip().startswith('File "')]):
        # File "/path/modeling_bert.py", line 123, in forward
        path, _, rest = line[len('File "') :].partition('", line ')
        lineno, _, func = rest.partition(", in ")
        if lineno and not os.path.abspath(path).startswith(library):
            return f"{os.path.basename(path)}:{lineno} in {func}"
    return None


def where(exc: BaseException) -> str:
    """``in stage 1, unit bert.encoder.layer.1, at modeling_bert.py:123 in forward``; "" when nothing is known."""
    parts: list[str] = []
    stage = getattr(exc, STAGE_ATTR, None)
    frames = _frames(exc.__traceback__)
    unit: str | None = None
    source: str | None = None
    if stage is not None:
        index, units, stage_module = stage
        parts.append(f"in stage {index}")
        names = {id(m): n for n, m in stage_module.named_modules()} if stage_module is not None else {}
        for frame, lineno in frames:
            found = _graph_node(frame, lineno)
            if found is None:
                continue
            module, node = found
            name = names.get(id(module), "")
            # StageModule.inner.<original FQN>: strip the wrapper's own prefix
            name = name.removeprefix("inner.")
            unit = _unit_of(name, units) or unit
            trace = node.meta.get("stack_trace") if node is not None else None
            if trace:
                source = _source_line(trace) or source
        if unit is None and len(units) == 1:
            unit = units[0]
        if unit is not None:
            parts.append(f"unit {unit}")
    if source is None:
        library = _library_dirs()
        for frame, lineno in reversed(frames):
            path = os.path.abspath(frame.f_code.co_filename)
            if frame.f_code.co_filename.startswith("<") or path.startswith(library):
                continue
            source = f"{os.path.basename(path)}:{lineno} in {frame.f_code.co_name}"
            break
    if source is not None:
        parts.append(f"at {source}")
    return ", ".join(parts)


def format_traceback(exc: BaseException) -> str:
    """The full traceback, as ``--verbose`` prints it."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
