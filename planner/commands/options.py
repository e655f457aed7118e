"""argparse pieces of the command line: a parser that reports a bad argument as one line, and the types that
read numbers, sizes, rates, lists and pins with the limits of planner/limits.py."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from planner.cost import parse_bytes
from planner.errors import MAX_MESSAGE_CHARS, UsageError, shorten
from planner.limits import MAX_GLOBAL_BATCH, MAX_JSON_INT, MAX_PROFILED_SIZES, MAX_RANKS, MAX_SECONDS, MAX_UNITS

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
        write_line(f"pipeplan {self.prog.split()[-1]}: error: {shorten(message, 200)} (see --help)")
        self.exit(EXIT_USAGE)


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


def int_range(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return int_in(minimum, maximum, text)

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


def positive_float(text: str) -> float:
    return number(text, 0.0, MAX_SECONDS)


def nonneg_float(text: str) -> float:
    return number(text, 0.0, MAX_SECONDS, low_open=False)


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


def memory(text: str) -> int:
    if len(text) > 40:
        raise bad(text, "is not a memory size: write e.g. 80GiB, 16GB or 1073741824")
    try:
        value = parse_bytes(text)
    except (UsageError, OverflowError, ValueError) as exc:
        raise argparse.ArgumentTypeError(shorten(str(exc), 120)) from None
    if value > MAX_JSON_INT:
        raise bad(text, "is over pipeplan's limit of 2**53 bytes (8 PiB)")
    return value


def memory_list(text: str) -> tuple[int, ...]:
    return tuple(memory(t) for t in items(text, MAX_RANKS))


def bandwidth(text: str) -> float:
    value = memory(text.strip().removesuffix("/s"))
    return float(value)


def auto_or_positive_int(text: str) -> int | None:
    return None if text.strip() == "auto" else int_in(1, MAX_GLOBAL_BATCH, text)


def pin(text: str) -> tuple[str, int]:
    name, sep, stage = text.rpartition("=")
    if not sep or not name:
        raise bad(text, "is not UNIT=STAGE, e.g. lm_head=3")
    return name, int_in(0, MAX_UNITS, stage)


def rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    old, new = old.strip(), new.strip()
    if not sep or not old:
        raise bad(text, "is not OLD=NEW, e.g. model.layers=layers (NEW may be empty: strip the prefix)")
    return old, new


