"""Command lines as the trainers' parsers read them: words (a file of arguments, shell comments and
continuations), then ``--flag value`` / ``--flag=value`` pairs and switches."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from planner.errors import ConfigError, shorten

__all__ = ["Flags", "command_words", "read_flags", "as_int"]


def command_words(text: str) -> list[str]:
    """The words of a command line or a file of arguments: ``#`` comments dropped, ``\\`` continuations joined,
    quotes removed, as a shell would."""
    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise ConfigError(f"cannot read the arguments as a shell would: {exc}") from None


@dataclass
class Flags:
    """Flags read from words: each flag's last value (as argparse keeps it), switches given, and flags not read."""

    values: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)
    ignored: list[str] = field(default_factory=list)
    positional: list[str] = field(default_factory=list)


def read_flags(words: Sequence[str], valued: Collection[str], switches: Collection[str]) -> Flags:
    """``valued`` flags take the next word (or ``=value``), ``switches`` none; any other ``--flag`` is kept as
    ignored, with the word after it when that is not a flag (it is then taken as its value)."""
    flags = Flags()
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            flags.positional.append(word)
            continue
        name, eq, inline = word.partition("=")
        if name in switches:
            if eq:
                raise ConfigError(f"{name} is a switch and takes no value, got {shorten(word, 60)}")
            flags.switches.add(name)
        elif name in valued:
            if eq:
                flags.values[name] = inline
            elif i < len(words) and not _is_flag(words[i]):
                flags.values[name] = words[i]
                i += 1
            else:
                raise ConfigError(f"{name} needs a value")
        else:
            flags.ignored.append(name)
            if not eq and i < len(words) and not _is_flag(words[i]):
                i += 1
    return flags


def _is_flag(word: str) -> bool:
    return word.startswith("--")


def as_int(flag: str, text: str, least: int = 1) -> int:
    """A flag's integer value, at least ``least``."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{flag} must be an integer, got {shorten(repr(text), 40)}") from None
    if value < least:
        raise ConfigError(f"{flag} must be >= {least}, got {value}")
    return value
