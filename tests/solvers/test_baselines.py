"""Baselines on hand cases whose answers were worked out from the original algorithms."""

from __future__ import annotations

import pytest

from planner.errors import SolverError, UsageError
from solvers.baselines import balanced_by_params, balanced_by_time, uniform_by_count


def test_uniform_spreads_the_remainder_over_the_first_stages():
    assert uniform_by_count(8, 4) == (0, 2, 4, 6)
    assert uniform_by_count(10, 4) == (0, 3, 6, 8)  # sizes 3, 3, 2, 2
    assert uniform_by_count(5, 5) == (0, 1, 2, 3, 4)
    assert uniform_by_count(7, 1) == (0,)


def test_uniform_rejects_more_stages_than_units():
    with pytest.raises(UsageError, match="3 units into 4"):
        uniform_by_count(3, 4)


def test_params_balanced_on_equal_weights():
    assert balanced_by_params([5] * 8, 4) == (0, 2, 4, 6)


def test_params_isolates_a_heavy_embedding():
    # Spreads: [10 | 1 1 1 1 1] -> 10 - 5 = 5; any other first cut is worse.
    assert balanced_by_params([10, 1, 1, 1, 1, 1], 2) == (0, 1)


def test_params_minimises_the_spread_not_only_the_maximum():
    # [3,3 | 2,2,2] has max 6, min 6: spread 0. [3 | 3,2,2,2] would have max 9.
    assert balanced_by_params([3, 3, 2, 2, 2], 2) == (0, 2)
    # [1,2,3 | 4,5 | 6] has sums 6, 9, 6: spread 3, the least of any split into three.
    assert balanced_by_params([1, 2, 3, 4, 5, 6], 3) == (0, 3, 5)


def test_params_ties_prefer_the_latest_cut():
    # [1 | 1 1 1] and [1 1 1 | 1] both have spread 2; [1 1 | 1 1] has 0.
    assert balanced_by_params([1, 1, 1, 1], 2) == (0, 2)
    # All zero weights: every cut has spread 0, DeepSpeed keeps the last start.
    assert balanced_by_params([0, 0, 0], 2) == (0, 2)


def test_params_one_unit_per_stage_when_counts_match():
    assert balanced_by_params([7, 1, 3], 3) == (0, 1, 2)


def test_time_starts_from_equal_counts_and_stops_within_one_largest_unit():
    # Equal times normalise to zeros: the initial split n // P per stage is already balanced.
    assert balanced_by_time([4, 4, 4, 4, 4, 4], 3) == (0, 2, 4)
    # Initial [0,0,0 | 1,0,0] in normalised units: heaviest 1 <= lightest 0 + 1, so no move.
    assert balanced_by_time([1, 1, 1, 9, 1, 1], 2) == (0, 3)


def test_time_moves_units_towards_the_light_block():
    # Normalised: [0, 0.25, 0.5, 0.75, 1, 1] (times 1..5,5). Start [0,.25,.5 | .75,1,1] = 0.75 vs 2.75:
    # move unit 3 into the first block -> 1.5 vs 2.0, within 1: stop.
    assert balanced_by_time([1, 2, 3, 4, 5, 5], 2) == (0, 4)


def test_time_with_the_remainder_in_the_last_block():
    # 7 units on 3 stages start as 2, 2, 3 units; all equal: no move.
    assert balanced_by_time([2.0] * 7, 3) == (0, 2, 4)


def test_time_reports_where_torchgpipe_would_leave_an_empty_stage():
    # A case torchgpipe 0.0.7 answers with a zero-length partition (GPipe rejects it).
    with pytest.raises(SolverError, match="empty stage"):
        balanced_by_time([5, 4, 2, 1, 1, 1, 1, 4, 5, 4, 1], 8)
