"""MeasureSettings: profile_model's settings, refused on construction when out of range."""

from __future__ import annotations

import dataclasses

import pytest

from planner.errors import UsageError
from profiles.measure_settings import MIN_TIME_S, MeasureSettings


def test_the_defaults_are_a_five_round_cpu_profile_at_three_sizes() -> None:
    s = MeasureSettings()
    assert (s.micro_batch_sizes, s.device, s.dtype, s.repeats, s.max_repeats) == ((1, 2, 4), "cpu", "float32", 5, None)
    assert (s.stable_within, s.warmup, s.min_time_s, s.units, s.capture) == (0.02, 2, MIN_TIME_S, None, None)
    assert s.progress and not s.sample_blocks


def test_sizes_given_as_a_list_are_kept_as_a_tuple() -> None:
    assert MeasureSettings(micro_batch_sizes=[4, 1]).micro_batch_sizes == (4, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        MeasureSettings().repeats = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"micro_batch_sizes": ()}, r"positive integers, got \[\]"),
        ({"micro_batch_sizes": (2, 2)}, r"duplicates: \[2, 2\]"),
        ({"repeats": 0}, "repeats must be >= 1 and warmup >= 0, got repeats=0, warmup=2"),
        ({"repeats": 5, "max_repeats": 3}, "max_repeats=3, repeats=5"),
        ({"min_time_s": float("inf")}, "min_time_s must be a finite number of seconds >= 0, got inf"),
        ({"stable_within": 1.0}, r"stable_within must be between 0 and 1 \(a fraction\), got 1.0"),
        ({"dtype": "float64"}, "unknown dtype 'float64': use one of float32, bfloat16, float16"),
        ({"capture": "trace"}, "unknown capture 'trace': use export or hooks"),
    ],
)
def test_a_value_out_of_range_is_refused_on_construction(given: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        MeasureSettings(**given)
