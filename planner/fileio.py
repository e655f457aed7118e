"""Atomic file output: a failed run never leaves a half-written or clobbered file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from planner.errors import PipeplanError, UsageError

__all__ = [
    "check_output_path",
    "write_atomic",
    "write_json_atomic",
    "dumps_canonical",
    "read_json",
    "check_document",
]


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
        # mkstemp makes the file private (0600); give the output the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
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


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: str | os.PathLike[str], error: type[PipeplanError], kind: str) -> Any:
    """Parse a JSON file, rejecting NaN/Infinity; every failure is a one-line ``error``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{kind} file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {kind} {p}: {exc}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise error(f"{p} is not valid JSON (truncated?): {exc}") from None


def check_document(
    data: Any, schema: dict[str, Any], *, error: type[PipeplanError], kind: str, fmt: str, version: int
) -> None:
    """Check a parsed document's ``format`` and ``version``, then its JSON Schema, as one-line ``error``s."""
    import jsonschema

    if not isinstance(data, dict):
        raise error(f"not a pipeplan {kind}: the top level is not a JSON object")
    if data.get("format") != fmt:
        raise error(f"not a pipeplan {kind}: format is {data.get('format')!r}, expected {fmt!r}")
    if data.get("version") != version:
        raise error(f"unsupported {kind} version {data.get('version')!r}: this pipeplan reads version {version}")
    found = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
    if found is not None:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in found.absolute_path)
        raise error(f"invalid {kind} at {where}: {found.message}")
