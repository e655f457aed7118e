"""One formatter for every number a table shows: three significant digits, never an exponent."""

from __future__ import annotations

import pytest

from planner.formatting import format_table, human_bytes, human_count, human_flops, human_rate, human_seconds


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0 B"),
        (1000, "1000 B"),
        (1536, "1.50 KiB"),
        (10 * 2**20, "10.0 MiB"),
        (1000 * 2**20, "1000 MiB"),  # not 1e+03 MiB
        (1023 * 2**20, "1023 MiB"),
        (1023.9 * 2**20, "1.00 GiB"),
        (21.2 * 2**30, "21.2 GiB"),
        (3 * 2**40, "3.00 TiB"),
    ],
)
def test_bytes(value: float, text: str) -> None:
    assert human_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0 s"),
        (4.2e-5, "42.0 us"),
        (0.0009996, "1.00 ms"),
        (0.0123, "12.3 ms"),
        (0.5, "500 ms"),
        (2.5, "2.50 s"),
        (14.2, "14.2 s"),
        (4593.0, "4593 s"),
    ],
)
def test_seconds(value: float, text: str) -> None:
    assert human_seconds(value) == text


def test_counts_flops_and_rates() -> None:
    assert [human_count(n) for n in (7, 999, 1000, 133_392, 124_439_808)] == ["7", "999", "1.00k", "133k", "124M"]
    assert [human_flops(f) for f in (0, 491_520, 2.5e9)] == ["0", "492k", "2.50G"]
    assert [human_rate(r) for r in (10, 1.1e9, 25e9)] == ["10 B/s", "1.10 GB/s", "25.0 GB/s"]


def test_table_rules_only_columns_with_a_header() -> None:
    text = format_table(["unit", "bytes", ""], [["a", "1", "skip"], ["bb", "22", ""]], align="<><")
    assert text.splitlines() == ["unit  bytes", "----  -----", "a         1  skip", "bb       22"]
