"""argparse pieces of the command line: a parser that reports a bad argument as one line, and the bridge
between argparse and the options dataclasses (planner/options.py): a command's flags are added from its
dataclass (:func:`add_options`) and its parsed namespace becomes that dataclass again (:func:`options_from`)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from planner.errors import MAX_MESSAGE_CHARS, shorten
from planner.options import Nested, option_of

__all__ = ["EXIT_USAGE", "Parser", "add_options", "options_from", "flat", "write_line", "negative_values_attached"]

T = TypeVar("T")

EXIT_USAGE = 2
"""Exit code of every error a user can cause."""


def write_line(line: str) -> None:
    """One line on stderr that cannot fail: a lone surrogate in a name is escaped, not an UnicodeEncodeError."""
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    line = shorten(line, MAX_MESSAGE_CHARS)
    sys.stderr.write(line.encode(encoding, "backslashreplace").decode(encoding, "replace") + "\n")
    sys.stderr.flush()


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (exit 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.split()[-1]
        prefix = "pipeplan" if command == "pipeplan" else f"pipeplan {command}"
        write_line(f"{prefix}: error: {shorten(message, 200)} (see --help)")
        self.exit(EXIT_USAGE)


def _add_one(parser: Any, field: dataclasses.Field, amend: dict[str, str]) -> None:
    facts = option_of(field)
    if facts is None or not facts.cli:
        return
    default = None if field.default is dataclasses.MISSING or facts.repeat else field.default
    kwargs: dict[str, Any] = {"help": facts.help + amend.get(field.name, "")}
    if facts.positional:
        names: tuple[str, ...] = (field.name,)
        if field.default is not dataclasses.MISSING:
            kwargs.update(nargs="?", default=default)
    else:
        names = facts.flags or ("--" + field.name.replace("_", "-"),)
        kwargs.update(dest=field.name, default=default)
        if facts.required:
            kwargs["required"] = True
    if facts.repeat:
        kwargs["action"] = "append"
    elif default is False and facts.parse is None and facts.choices is None:
        kwargs["action"] = "store_true"
    for key, value in (("type", facts.parse), ("choices", facts.choices), ("metavar", facts.metavar)):
        if value is not None:
            kwargs[key] = value
    if not facts.positional and "metavar" not in kwargs and "choices" not in kwargs and "action" not in kwargs:
        # Named by its flag, as argparse names it from the dest: ``--timeout TIMEOUT``, not ``TIMEOUT_S``.
        kwargs["metavar"] = names[0].lstrip("-").replace("-", "_").upper()
    parser.add_argument(*names, **kwargs)


def add_options(parser: argparse.ArgumentParser, kind: type, amend: dict[str, str] | None = None) -> None:
    """Add the flags of the options dataclass ``kind`` to ``parser``, in field order: a nested dataclass's in
    place (in an argument group where it has a title), fields sharing ``exclusive`` in one exclusive group."""
    exclusive: dict[str, Any] = {}
    for field in dataclasses.fields(kind):
        inner: Nested | None = field.metadata.get("nested")
        if inner is not None:
            target = parser.add_argument_group(inner.title, inner.description) if inner.title else parser
            add_options(target, inner.kind, dict(inner.amend))  # type: ignore[arg-type]
            continue
        facts = option_of(field)
        target = parser
        if facts is not None and facts.exclusive:
            if facts.exclusive not in exclusive:
                exclusive[facts.exclusive] = parser.add_mutually_exclusive_group()
            target = exclusive[facts.exclusive]
        _add_one(target, field, amend or {})


def options_from(args: argparse.Namespace, kind: type[T]) -> T:
    """The options dataclass ``kind`` holding what ``args`` (parsed from :func:`add_options`' flags) says."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(kind):  # type: ignore[arg-type]
        inner: Nested | None = field.metadata.get("nested")
        facts = option_of(field)
        if inner is not None:
            values[field.name] = options_from(args, inner.kind)
        elif facts is not None and facts.cli:
            value = getattr(args, field.name)
            values[field.name] = (tuple(value) if value else field.default) if facts.repeat else value
    return kind(**values)


def flat(options: object) -> dict[str, Any]:
    """Every field of an options dataclass by name, a nested one's fields in its place."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        value = getattr(options, field.name)
        out.update(flat(value) if "nested" in field.metadata else {field.name: value})
    return out


def negative_values_attached(argv: Sequence[str]) -> list[str]:
    """``--memory -1GiB`` as ``--memory=-1GiB``: argparse reads a value that starts with ``-`` as an option and
    says "expected one argument"; attached, the option's own check says what is wrong with the value."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-[0-9.]", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out
