"""Plain-text tables and human-readable numbers for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table", "human_bytes", "human_seconds"]


def human_bytes(num_bytes: float) -> str:
    """``1536`` -> ``1.5 KiB``; binary prefixes, three significant digits."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_seconds(seconds: float) -> str:
    """Seconds in the unit that keeps three significant digits readable: µs, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, align: str = "") -> str:
    """Columns padded to their widest cell; ``align`` holds one of ``<``/``>`` per column (default: left)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    aligns = align or "<" * len(headers)

    def line(row: Sequence[str]) -> str:
        return "  ".join(f"{cell:{aligns[i]}{widths[i]}}" for i, cell in enumerate(row)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])
