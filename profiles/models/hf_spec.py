"""``hf:PATH[?task=T&seq_len=N]``, the spec of a transformers model built from a config file, read without
building anything (no torch): what :mod:`profiles.models.hf_config` builds and a device model profiles."""

from __future__ import annotations

from urllib.parse import parse_qsl

from planner.errors import ModelSpecError, shorten

__all__ = ["PREFIX", "parse_hf_spec", "resolve_hf_spec"]

PREFIX = "hf:"


def parse_hf_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``hf:PATH[?task=T&seq_len=N]`` -> (PATH, options)."""
    body = spec.removeprefix(PREFIX)
    path, _, query = body.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    unknown = sorted(set(options) - {"task", "seq_len"})
    if unknown:
        raise ModelSpecError(f"unknown option {unknown[0]!r} in {shorten(spec, 120)}: hf: specs take task and seq_len")
    if not path:
        raise ModelSpecError("hf: needs a config file: hf:path/to/config.json")
    return path, options


def resolve_hf_spec(spec: str, task: str | None, seq_len: int | None) -> tuple[str, str | None, int | None]:
    """(PATH, task, seq_len) of ``spec``, the spec's options and the CLI's (``task``, ``seq_len``) together.

    Raises :class:`ModelSpecError` for an option given twice with different values or a ``seq_len`` that is not
    a positive integer.
    """
    path, options = parse_hf_spec(spec)
    for key, value in (("task", task), ("seq_len", seq_len)):
        if value is not None and key in options and str(value) != options[key]:
            raise ModelSpecError(f"{key} is {options[key]} in the spec and {value} in the options: give it once")
    if "seq_len" in options:
        if not options["seq_len"].isdigit() or int(options["seq_len"]) < 1:
            raise ModelSpecError(f"seq_len={options['seq_len']!r} in {shorten(spec, 120)} is not a positive integer")
        seq_len = int(options["seq_len"])
    return path, task or options.get("task"), seq_len
