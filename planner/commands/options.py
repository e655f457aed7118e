"""argparse pieces of the command line: a parser that reports a bad argument as one line, and the types that
read numbers, sizes, rates, lists and pins with the limits of planner/limits.py."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence

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
        command = self.prog.split()[-1]
        prefix = "pipeplan" if command == "pipeplan" else f"pipeplan {command}"
        write_line(f"{prefix}: error: {shorten(message, 200)} (see --help)")
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


MIN_DEVICE_BYTES = 2**20
"""A bare number below this is not a device's memory: ``--memory 10`` is refused, not read as 10 bytes."""

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKMGT]?)(i?)(B|b|bit|bps|Bps)?\s*(/s|ps)?\s*$")


def memory(text: str) -> int:
    """``80GiB``, ``16GB``, ``512MiB`` or a byte count of at least 1 MiB."""
    if len(text) > 40:
        raise bad(text, "is not a memory size: write e.g. 80GiB, 16GB or 1073741824")
    if text.strip().startswith("-"):
        raise bad(text, "must be a positive memory size, e.g. 80GiB")
    try:
        value = parse_bytes(text)
    except (UsageError, OverflowError, ValueError):
        raise bad(text, "is not a memory size: write e.g. 80GiB, 16GB or 1073741824 (bytes)") from None
    if text.strip().isdigit() and value < MIN_DEVICE_BYTES:
        raise bad(text, f"bytes is not a device's memory: give a unit, e.g. {text.strip()}GiB or {text.strip()}GB")
    if value > MAX_JSON_INT:
        raise bad(text, "is over pipeplan's limit of 2**53 bytes (8 PiB)")
    return value


def memory_list(text: str) -> tuple[int, ...]:
    return tuple(memory(t) for t in items(text, MAX_RANKS))


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
    from planner.limits import MAX_DEVICES

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
