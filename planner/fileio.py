"""Files in and out: bounded JSON reading, and atomic writes that never clobber an input.

Reading: a file must be a regular file (a FIFO or ``/dev/zero`` is refused at once, not read forever),
at most :data:`planner.limits.MAX_FILE_BYTES`, UTF-8, nested at most :data:`MAX_JSON_DEPTH` deep,
with finite numbers and integers within :data:`MAX_JSON_INT`; every failure is one line.

Writing: temp file in the same folder, fsync, rename. The output never replaces an input of the same
command, a symlinked output is written through (the link is kept), an existing output keeps its mode.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from planner.errors import PipeplanError, UsageError, shorten
from planner.limits import MAX_FILE_BYTES, MAX_JSON_DEPTH, MAX_JSON_INT
from planner.schema_check import compile_check

__all__ = [
    "load_document",
    "check_output_path",
    "write_atomic",
    "write_json_atomic",
    "dumps_canonical",
    "read_json",
    "check_document",
]

_NAME_MAX = 255


def _same_file(a: Path, b: str | os.PathLike[str]) -> bool:
    try:
        other = Path(os.path.realpath(b))
    except (OSError, ValueError):
        return False
    if other == a:
        return True
    try:  # hard links: one file under two names
        return os.path.samefile(a, other)
    except OSError:
        return False


def check_output_path(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """Fail early, before any long work, when ``path`` cannot be written; return the file to write.

    The returned path is the symlink's target when ``path`` is a symlink, so the link survives the write.
    ``inputs`` are the command's input files: an output resolving to one of them is refused.
    """
    text = os.fspath(path)
    if not text:
        raise UsageError("the output path is empty: name a file")
    if text.endswith(("/", os.sep)):
        raise UsageError(f"output path {shorten(text)} ends with '/': name a file, not a folder")
    try:
        target = Path(os.path.realpath(text))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot use output path {shorten(text)}: {exc}") from None
    # Checked before any stat(): a name over NAME_MAX makes stat itself fail (ENAMETOOLONG).
    too_long = [part for part in target.parts if len(os.fsencode(part)) > _NAME_MAX]
    if too_long:
        raise UsageError(
            f"output path has a name of {len(os.fsencode(too_long[0]))} bytes, over the {_NAME_MAX} the file "
            f"system allows: {shorten(too_long[0], 60)}"
        )
    if target.is_dir():
        raise UsageError(f"output path is a folder, not a file: {shorten(text)}")
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"output folder does not exist: {shorten(str(Path(text).parent))} (create it first)")
    for given in inputs:
        if given is not None and _same_file(target, given):
            raise UsageError(
                f"output {shorten(text)} is this command's input {shorten(os.fspath(given))}: "
                "write to another file (pipeplan never replaces its own input)"
            )
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"output file is not writable: {shorten(text)} (check its permissions)")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"output folder is not writable: {shorten(str(parent))}")
    return target


def _mode_for(target: Path) -> int:
    """An existing output keeps its mode; a new one gets what a plain open() would give."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to a temp file in the same folder, fsync, then rename over ``path``."""
    out = check_output_path(path)
    try:
        # The name is cut so that the temp file's name fits where the output's does.
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name[:200]}.", suffix=".tmp", dir=out.parent)
    except OSError as exc:
        raise UsageError(f"cannot write {shorten(os.fspath(path))}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, _mode_for(out))
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {shorten(os.fspath(path))}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dumps_canonical(obj: Any) -> str:
    """JSON with sorted keys and fixed indentation, so the same content gives the same bytes."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    write_atomic(path, dumps_canonical(obj).encode("utf-8"))


class _ContentError(ValueError):
    """Valid JSON that pipeplan will not compute with: a number out of range, a lone surrogate, deep nesting."""


def _reject_constant(name: str) -> float:
    raise _ContentError(f"{name} is not valid JSON: numbers must be finite")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _ContentError(f"number {shorten(text, 40)} is out of range (not a finite float)")
    return value


def _parse_int(text: str) -> int:
    # A long digit string is refused before int() converts it (which is quadratic, and capped by Python).
    if len(text) > 17 or abs(int(text)) > MAX_JSON_INT:
        raise _ContentError(f"integer {shorten(text, 40)} is beyond pipeplan's limit of 2**53")
    return int(text)


def _where(path: tuple[Any, ...]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _check_tree(data: Any) -> None:
    """Depth, numbers and strings, without recursion (a deep document must not exhaust the stack)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, (dict, list)):
            if len(path) >= MAX_JSON_DEPTH:
                raise _ContentError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, value in items:
                if isinstance(key, str):
                    _check_text(key)
                stack.append((value, (*path, key)))
        elif isinstance(node, str):
            _check_text(node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise _ContentError(f"{shorten(_where(path))} is {node}: numbers must be finite")
        elif isinstance(node, int) and abs(node) > MAX_JSON_INT:
            raise _ContentError(
                f"{shorten(_where(path))} is {shorten(str(node), 30)}, beyond pipeplan's limit of 2**53"
            )


def check_tree(data: Any, error: type[PipeplanError], what: str) -> None:
    """What :func:`read_json` holds a file's content to, for a document about to be written (depth, finite numbers,
    integers within :data:`MAX_JSON_INT`, text): a failure is one line naming ``what``, so that nothing is written that
    pipeplan would not read back."""
    try:
        _check_tree(data)
    except _ContentError as exc:
        raise error(f"{what}: {exc}") from None


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = ascii(text)[:60]
        raise _ContentError(f"the string {shown} holds a lone surrogate (\\ud800-\\udfff), not text") from None


_Doc = TypeVar("_Doc")


def load_document(
    path: str | os.PathLike[str], error: type[PipeplanError], kind: str, parse: Callable[[Any], _Doc]
) -> _Doc:
    """Read ``path`` with :func:`read_json` and build it with ``parse``; a failure names the file, one line."""
    data = read_json(path, error, kind)
    try:
        return parse(data)
    except error as exc:
        raise error(f"{shorten(os.fspath(path))}: {exc}") from None


def read_json(path: str | os.PathLike[str], error: type[PipeplanError], kind: str) -> Any:
    """Parse a bounded JSON file (see the module docstring); every failure is a one-line ``error``."""
    p = Path(path)
    name = shorten(os.fspath(path))
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(f"{kind} file not found: {name}") from None
    except (OSError, ValueError) as exc:
        raise error(f"cannot read {kind} {name}: {getattr(exc, 'strerror', None) or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{kind} {name} is not a regular file (a folder, FIFO or device): give a JSON file")
        if info.st_size > MAX_FILE_BYTES:
            raise error(f"{kind} {name} is {info.st_size:,} bytes, over pipeplan's limit of {MAX_FILE_BYTES:,}")
        try:
            raw = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise error(f"cannot read {kind} {name}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise error(f"{kind} {name} is over pipeplan's limit of {MAX_FILE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{name} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int)
        _check_tree(data)
    except _ContentError as exc:
        raise error(f"{name}: {exc}") from None
    except RecursionError:
        raise error(f"{name}: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise error(f"{name} is not valid JSON (truncated?): {shorten(str(exc), 120)}") from None
    return data


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every ``{"$ref": "#/$defs/NAME"}`` replaced by that definition (the same constraint).

    jsonschema resolves a ``$ref`` each time it validates through it: for a 2,000-unit profile that was
    16,000 resolutions and most of a 2 s read. A node that is only a local ``$ref`` means exactly its target.
    """
    if isinstance(node, dict):
        ref = node.get("$ref")
        if len(node) == 1 and isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs:
            return _inline_refs(defs[ref[8:]], defs)
        return {k: _inline_refs(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def _strict_validator_class() -> Any:
    """Draft 2020-12, except that ``integer`` means a JSON integer: ``2.0`` is not a count."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=checker)


def _strict_validator(schema: dict[str, Any]) -> Any:
    return _strict_validator_class()(_inline_refs(schema, schema.get("$defs", {})))


_COMPILED: dict[int, tuple[dict[str, Any], Callable[[Any], bool]]] = {}
"""Each schema's predicate (planner/schema_check.py), by the schema's identity; the schema is kept beside it, so
that its identity is not reused."""


def _valid_at_once(data: Any, schema: dict[str, Any]) -> bool:
    """Whether ``data`` is valid, by the schema's compiled predicate (False sends it to jsonschema for the message)."""
    entry = _COMPILED.get(id(schema))
    if entry is None:
        defs = schema.get("$defs", {})

        def by_jsonschema(node: Any) -> Callable[[Any], bool]:  # a node checked as jsonschema checks it
            return _strict_validator({"$defs": defs, **node} if isinstance(node, dict) else node).is_valid

        entry = _COMPILED[id(schema)] = (schema, compile_check(schema, by_jsonschema))
    return entry[1](data)


def check_document(
    data: Any, schema: dict[str, Any], *, error: type[PipeplanError], kind: str, fmt: str, version: int
) -> None:
    """Check a parsed document's ``format`` and ``version``, then its JSON Schema, as one-line ``error``s."""
    if not isinstance(data, dict):
        raise error(f"not a pipeplan {kind}: the top level is not a JSON object")
    if data.get("format") != fmt:
        raise error(f"not a pipeplan {kind}: format is {shorten(repr(data.get('format')))}, expected {fmt!r}")
    if data.get("version") != version or isinstance(data.get("version"), bool):
        raise error(
            f"unsupported {kind} version {shorten(repr(data.get('version')))}: this pipeplan reads version {version}"
        )
    try:  # a document built in Python has not been through read_json
        _check_tree(data)
    except _ContentError as exc:
        raise error(f"invalid {kind}: {exc}") from None
    if _valid_at_once(data, schema):
        return
    import jsonschema

    found = jsonschema.exceptions.best_match(_strict_validator(schema).iter_errors(data))
    if found is not None:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in found.absolute_path)
        raise error(f"invalid {kind} at {shorten(where)}: {shorten(found.message, 160)}")
