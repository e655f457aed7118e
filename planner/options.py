"""Options declared once: a dataclass field carries its command-line flag, help, default, unit and check.

Each command's options are one frozen dataclass whose fields are made with :func:`option` (torchtitan's
``JobConfig`` is the pattern): the command line is built from it (``planner.commands.options.add_options``)
and the Python API takes it, so a flag, its help text, its default and its limits exist in one place. The
readers below turn a flag's text into its value within the bounds of planner/limits.py; a reader refuses
with ``argparse.ArgumentTypeError`` (argparse's one-line error) and, where it has one, its ``check`` refuses
the same bad value given through the Python API with a :class:`UsageError`.

Only the standard library and the planner base are imported here: ``profiles`` and ``planner.runtime``
declare their options with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass
from typing import Any

from planner.errors import UsageError, shorten
from planner.limits import (
    MAX_DEVICES,
    MAX_GLOBAL_BATCH,
    MAX_JSON_INT,
    MAX_PROFILED_SIZES,
    MAX_RANKS,
    MAX_SECONDS,
    MAX_UNITS,
)

__all__ = [
    "Option",
    "Nested",
    "option",
    "option_like",
    "nested",
    "option_of",
    "flag_of",
    "check_fields",
    "bad",
    "int_in",
    "int_range",
    "number",
    "positive_float",
    "nonneg_float",
    "speed",
    "items",
    "int_list",
    "float_list",
    "speed_list",
    "bandwidth",
    "auto_or_positive_int",
    "tensor_parallel_degree",
    "heads_pair",
    "pin",
    "rename",
]

Check = Callable[[Any], None]


@dataclass(frozen=True)
class Option:
    """The command-line facts of one field: everything ``argparse.add_argument`` is told, and the check."""

    help: str
    flags: tuple[str, ...] = ()
    """The option strings; empty: ``--field-name`` (or, for a positional, none)."""
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    """The text -> value reader (argparse's ``type``)."""
    choices: tuple[str, ...] | None = None
    unit: str | None = None
    """What the value counts (``s``, ``bytes``, ``bytes/s``) where it is a quantity."""
    check: Check | None = None
    """Refuses a bad value given through the Python API (raises UsageError); default: the reader's own."""
    required: bool = False
    repeat: bool = False
    """Given once per value (argparse's ``append``); the field holds a tuple."""
    positional: bool = False
    exclusive: str | None = None
    """Options sharing this name are mutually exclusive."""
    cli: bool = True
    """False: a field of the Python API only (no flag)."""


@dataclass(frozen=True)
class Nested:
    """A field that is itself an options dataclass: its options join the command's, in a group if titled."""

    kind: type
    title: str | None = None
    description: str | None = None
    amend: tuple[tuple[str, str], ...] = ()
    """(field, text) pairs: text appended to a nested field's help in this command only."""


def option(
    default: Any = MISSING,
    *,
    help: str,  # noqa: A002 - the word argparse uses
    flag: str | tuple[str, ...] = (),
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Sequence[str] | None = None,
    unit: str | None = None,
    check: Check | None = None,
    required: bool = False,
    repeat: bool = False,
    positional: bool = False,
    exclusive: str | None = None,
    cli: bool = True,
) -> Any:
    """A dataclass field whose metadata holds its :class:`Option`; ``default`` is the CLI's and the API's."""
    facts = Option(
        help=help,
        flags=(flag,) if isinstance(flag, str) else tuple(flag),
        metavar=metavar,
        parse=parse,
        choices=None if choices is None else tuple(choices),
        unit=unit,
        check=check,
        required=required,
        repeat=repeat,
        positional=positional,
        exclusive=exclusive,
        cli=cli,
    )
    return dataclasses.field(default=default, metadata={"option": facts})


def option_like(kind: type, name: str) -> Any:
    """A field declared as ``kind``'s field ``name`` is (flag, reader, default, help, unit): an option two
    commands share is declared once, where it first belongs."""
    source = {f.name: f for f in dataclasses.fields(kind)}[name]
    return dataclasses.field(default=source.default, metadata={"option": option_of(source)})


def nested(
    kind: type, *, title: str | None = None, description: str | None = None, amend: dict[str, str] | None = None
) -> Any:
    """A field holding the options dataclass ``kind``, given whole (its own required fields have no default)."""
    return dataclasses.field(metadata={"nested": Nested(kind, title, description, tuple((amend or {}).items()))})


def option_of(field: dataclasses.Field) -> Option | None:
    return field.metadata.get("option")


def flag_of(field: dataclasses.Field) -> str:
    """How messages name a field: its first flag, or its metavar / name for a positional."""
    facts = option_of(field)
    if facts is None or facts.positional or not facts.cli:
        return facts.metavar if facts is not None and facts.metavar else field.name
    return facts.flags[0] if facts.flags else "--" + field.name.replace("_", "-")


def check_fields(options: object) -> None:
    """Run each field's check on the value it holds (None: not given). Called by ``__post_init__``."""
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        facts = option_of(field)
        value = getattr(options, field.name)
        if facts is None or value is None:
            continue
        if facts.choices is not None and not facts.repeat and value not in facts.choices:
            raise UsageError(f"{flag_of(field)} must be one of {', '.join(facts.choices)}, got {value!r}")
        check = facts.check or getattr(facts.parse, "check", None)
        if check is not None:
            for item in value if facts.repeat else (value,):
                try:
                    check(item)
                except UsageError as exc:
                    raise UsageError(f"{flag_of(field)} {exc}") from None


# --- readers: text -> value, each refusing what planner/limits.py bounds ------------------------------------


def bad(text: str, why: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{shorten(repr(text), 40)} {why}")


def int_in(minimum: int, maximum: int, text: str) -> int:
    # Digits only (sign allowed): '4.0', '1e3', 'abc' and 400-digit numbers are refused before int().
    stripped = text.strip()
    if not stripped.lstrip("+-").isdigit() or len(stripped) > 19:
        raise bad(text, f"is not an integer in {minimum}..{maximum:,}")
    value = int(stripped)
    if not minimum <= value <= maximum:
        raise bad(text, f"must be an integer in {minimum}..{maximum:,}")
    return value


def _int_check(minimum: int, maximum: int) -> Check:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise UsageError(f"must be an integer in {minimum}..{maximum:,}, got {value!r}")

    return check


def int_range(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return int_in(minimum, maximum, text)

    parse.check = _int_check(minimum, maximum)  # type: ignore[attr-defined]
    return parse


def number(text: str, low: float, high: float, *, low_open: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        raise bad(text, "is not a number") from None
    if not math.isfinite(value) or not (value > low if low_open else value >= low) or value > high:
        if low == 0 and low_open:
            raise bad(text, f"must be a positive finite number, at most {high:g}")
        raise bad(text, f"must be a finite number {'>' if low_open else '>='} {low:g} and <= {high:g}")
    return value


def _number_check(low: float, high: float, *, low_open: bool = True) -> Check:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"must be a number, got {value!r}")
        try:
            number(repr(float(value)), low, high, low_open=low_open)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(str(exc)) from None

    return check


def positive_float(text: str) -> float:
    return number(text, 0.0, MAX_SECONDS)


def nonneg_float(text: str) -> float:
    return number(text, 0.0, MAX_SECONDS, low_open=False)


positive_float.check = _number_check(0.0, MAX_SECONDS)  # type: ignore[attr-defined]
nonneg_float.check = _number_check(0.0, MAX_SECONDS, low_open=False)  # type: ignore[attr-defined]


def speed(text: str) -> float:
    # Relative speeds outside [1e-3, 1e3] are not a device; they only push the solver's numbers out of range.
    return number(text, 1e-3, 1e3, low_open=False)


def items(text: str, limit: int) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise bad(text, "is not a comma-separated list of values (empty item)")
    if len(items) > limit:
        raise bad(text, f"has {len(items)} values, over pipeplan's limit of {limit}")
    return items


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int_in(1, MAX_GLOBAL_BATCH, t) for t in items(text, MAX_PROFILED_SIZES))


def float_list(text: str) -> tuple[float, ...]:
    return tuple(positive_float(t) for t in items(text, MAX_UNITS))


def speed_list(text: str) -> tuple[float, ...]:
    return tuple(speed(t) for t in items(text, MAX_RANKS))


_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKMGT]?)(i?)(B|b|bit|bps|Bps)?\s*(/s|ps)?\s*$")


def bandwidth(text: str) -> float:
    """A link's bandwidth in bytes per second: ``25GB/s``, ``1.1GB/s``, ``100Gbps`` or ``100Gb/s`` (bits, / 8),
    ``10GiB/s``; a bare number is refused (bytes or bits?)."""
    match = _RATE.match(text) if len(text) <= 40 else None
    if text.strip().startswith("-"):
        raise bad(text, "must be a positive bandwidth, e.g. 25GB/s")
    if not match or not match.group(4):
        raise bad(text, "is not a bandwidth: write e.g. 25GB/s, 100Gbps or 450GB/s (bytes or bits per second)")
    number, prefix, binary, unit = float(match.group(1)), match.group(2).upper(), match.group(3), match.group(4)
    bits = unit in ("b", "bit", "bps")
    value = number * (1024 if binary else 1000) ** " KMGT".index(prefix) / (8 if bits else 1)
    if not (math.isfinite(value) and value >= 1.0):
        raise bad(text, "must be at least 1 byte per second")
    if value > MAX_JSON_INT:
        raise bad(text, "is over pipeplan's limit of 2**53 bytes per second")
    return value


def auto_or_positive_int(text: str) -> int | None:
    return None if text.strip() == "auto" else int_in(1, MAX_GLOBAL_BATCH, text)


def tensor_parallel_degree(text: str) -> int | str:
    """``auto`` or a degree in 1..MAX_DEVICES."""
    return "auto" if text.strip() == "auto" else int_in(1, MAX_DEVICES, text)


def heads_pair(text: str) -> tuple[int, int]:
    """``H`` or ``H,KV``: attention heads, and key-value heads (default H)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 2):
        raise bad(text, "is not H or H,KV (attention heads, key-value heads), e.g. 64,8")
    heads = int_in(1, 1 << 20, parts[0])
    return heads, int_in(1, heads, parts[1]) if len(parts) == 2 else heads


def pin(text: str) -> tuple[str, int]:
    name, sep, stage = text.rpartition("=")
    if not sep or not name:
        raise bad(text, "is not UNIT=STAGE, e.g. lm_head=3 (or lm_head=-1, the last stage)")
    return name, int_in(-MAX_UNITS, MAX_UNITS, stage)


def rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    old, new = old.strip(), new.strip()
    if not sep or not old:
        raise bad(text, "is not OLD=NEW, e.g. model.layers=layers (NEW may be empty: strip the prefix)")
    return old, new
