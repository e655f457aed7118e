"""Atomic file output: a failed run never leaves a half-written or clobbered file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from planner.errors import UsageError

__all__ = ["check_output_path", "write_atomic", "write_json_atomic", "dumps_canonical"]


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Fail early, before any long work, when ``path`` cannot be written."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"output folder does not exist: {parent} (create it first)")
    if out.is_dir():
        raise UsageError(f"output path is a folder, not a file: {out}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"output folder is not writable: {parent}")
    return out


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temp file in the same folder, fsync, then rename over ``path``."""
    out = check_output_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent or ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dumps_canonical(obj: Any) -> str:
    """JSON with sorted keys and fixed indentation, so the same content gives the same bytes."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    write_atomic(path, dumps_canonical(obj).encode("utf-8"))
