"""Numbers for people and plain-text tables: the one place bytes, seconds, counts and FLOPs are written.

Three significant digits, no exponent (``1000 MiB``, never ``1e+03 MiB``), binary prefixes for bytes, SI for
counts, and the unit that keeps the number between 1 and 1000.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table", "human_bytes", "human_seconds", "human_count", "human_flops", "human_rate"]


def _three(value: float) -> str:
    """Three significant digits without an exponent: 1.23, 12.3, 123, 1234."""
    magnitude = abs(value)
    if magnitude >= 99.95:
        return f"{value:.0f}"
    if magnitude >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}"


def human_bytes(num_bytes: float) -> str:
    """``1536`` -> ``1.50 KiB``; ``10 * 2**20`` -> ``10.0 MiB``; whole bytes below 1 KiB."""
    value = float(num_bytes)
    if abs(value) < 1024:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1023.5 or unit == "TiB":
            return f"{_three(value)} {unit}"
    raise AssertionError("unreachable")


def human_seconds(seconds: float) -> str:
    """``0.0123`` -> ``12.3 ms``; us below a millisecond, s from a second on; ``0`` -> ``0 s``."""
    if seconds == 0:
        return "0 s"
    magnitude = abs(seconds)
    if magnitude < 999.5e-6:
        return f"{_three(seconds * 1e6)} us"
    if magnitude < 0.9995:
        return f"{_three(seconds * 1e3)} ms"
    return f"{_three(seconds)} s"


def human_count(count: float) -> str:
    """``133392`` -> ``133k``; ``124.4e6`` -> ``124M``; below 1,000 as it is."""
    magnitude = abs(count)
    for divisor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= divisor * 0.9995:
            return f"{_three(count / divisor)}{suffix}"
    return f"{count:.0f}" if float(count).is_integer() else _three(count)


def human_flops(flops: float) -> str:
    """FLOPs as a count: ``4.9e5`` -> ``492k``; ``0`` -> ``0``."""
    return human_count(flops)


def human_rate(bytes_per_s: float) -> str:
    """A link's bandwidth in decimal bytes per second, as links are quoted: ``1.1e9`` -> ``1.10 GB/s``."""
    value = float(bytes_per_s)
    for divisor, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if abs(value) >= divisor * 0.9995:
            return f"{_three(value / divisor)} {unit}"
    return f"{value:.0f} B/s"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, align: str = "") -> str:
    """Columns padded to their widest cell; ``align`` holds one of ``<``/``>`` per column (default: left).

    The rule under the header spans only columns that have a header."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    aligns = align or "<" * len(headers)

    def line(row: Sequence[str]) -> str:
        return "  ".join(f"{cell:{aligns[i]}{widths[i]}}" for i, cell in enumerate(row)).rstrip()

    rule = "  ".join(("-" if headers[i] else " ") * w for i, w in enumerate(widths)).rstrip()
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])
