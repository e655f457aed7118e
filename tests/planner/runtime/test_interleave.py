"""verify_plans: several plans of one model in one launch, interleaved round by round."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import sleepy_loss
from conftest import make_plan

from planner.errors import UsageError
from planner.runtime.interleave import InterleavedRun, _round_medians, rounds_within, verify_plans


def test_round_medians_take_each_rounds_steps_and_the_slowest_rank() -> None:
    rank0 = SimpleNamespace(iteration_s=(1.0, 3.0, 2.0, 10.0), step_rounds=(0, 0, 0, 1))
    rank1 = SimpleNamespace(iteration_s=(1.5, 1.5, 1.5, 4.0), step_rounds=(0, 0, 0, 1))
    assert _round_medians([rank0, rank1], 2) == (2.0, 10.0)


def test_a_ratio_is_the_median_of_the_rounds_ratios() -> None:
    # The machine ran twice as slow in round 1: each round's ratio is 2, the ratio of medians would not be.
    run = InterleavedRun(reports=(), round_iteration_s=((2.0, 4.0, 2.2), (1.0, 2.0, 1.1)))
    assert run.ratio(0, 1) == pytest.approx(2.0)
    assert run.ratio(1, 0) == pytest.approx(0.5)


def test_copies_of_a_plan_count_by_the_geometric_mean_of_their_round_times() -> None:
    # Plan 0 ran as copies 0 and 2 (1.0 and 4.0 in round 0: geometric mean 2.0), plan 1 as copy 1.
    run = InterleavedRun(reports=(), round_iteration_s=((1.0, 2.0, 3.0), (4.0, 8.0, 6.0), (4.0, 8.0, 12.0)))
    assert run.ratio([0, 2], 1) == pytest.approx(statistics.median([2.0 / 4.0, 4.0 / 8.0, 6.0 / 6.0]))
    assert run.ratio(1, (0, 2)) == pytest.approx(2.0)
    assert run.ratio([0], [1]) == run.ratio(0, 1)


def test_rounds_fill_the_budget_by_blocks_or_predicted_steps_whichever_is_longer() -> None:
    short = SimpleNamespace(predicted=SimpleNamespace(iteration_s=0.01))
    long = SimpleNamespace(predicted=SimpleNamespace(iteration_s=2.0))
    # A round: 0.1 s + 0.1 s for two short plans, 0.1 s + 2 s with a long one.
    assert rounds_within([short, short], 10.0, at_least=3, at_most=100, min_block_s=0.1) == 50
    assert rounds_within([short, long], 10.0, at_least=3, at_most=100, min_block_s=0.1) == 4
    assert rounds_within([long, long], 10.0, at_least=3, at_most=100, min_block_s=0.1) == 3
    assert rounds_within([short], 100.0, at_least=3, at_most=20, min_block_s=0.1) == 20


def test_two_plans_in_one_launch_each_get_a_report_and_every_round() -> None:
    # The loss sleeps 30 ms: a step of 4 micro-batches sleeps 120 ms on the last rank, one of 2 sleeps 60 ms,
    # so however the machine runs, the first plan is the slower by design.
    spec = f"{Path(sleepy_loss.__file__)}:workload"
    four = make_plan(sleepy_loss.workload(), ["2"], "1f1b", num_microbatches=4)
    two = make_plan(sleepy_loss.workload(), ["2"], "gpipe", num_microbatches=2)
    # Profiled unit sums: each rank times its own units after each round, and the two plans (same size, same
    # stages) share them.
    four, two = (replace(p, device={**p.device, "unit_sum_s": 0.04, "capture": "hooks"}) for p in (four, two))
    run = verify_plans([four, two], spec, rounds=3, warmup=1, min_warmup_s=0.0, min_block_s=0.0, timeout_s=180)
    assert [r.schedule.value for r in run.reports] == ["1f1b", "gpipe"]
    assert [r.num_microbatches for r in run.reports] == [4, 2]
    for report in run.reports:
        assert report.mode == "processes" and report.steps == 3  # one step a round, three rounds
        assert all(s.measured_memory is not None and s.measured_memory.peak > 0 for s in report.stages)
        assert report.reference_s is not None and len(report.ranks) == 2
    # The last rank's units end with the loss, which sleeps: the sum of the ranks' units holds that sleep.
    assert {r.reference for r in run.reports} == {"units"} and run.reports[0].reference_s == run.reports[1].reference_s
    assert run.reports[0].reference_s is not None and run.reports[0].reference_s >= sleepy_loss.LOSS_SLEEP_S
    assert [len(r) for r in run.round_iteration_s] == [3, 3]
    assert min(run.round_iteration_s[0]) >= 4 * sleepy_loss.LOSS_SLEEP_S
    assert run.ratio(0, 1) > 1.2
    last = run.reports[0].stages[-1]
    assert last.measured_forward_s >= sleepy_loss.LOSS_SLEEP_S  # each plan's own stage timers


def test_a_plan_left_out_of_the_unit_references_takes_the_machines_speed_reference() -> None:
    spec = f"{Path(sleepy_loss.__file__)}:workload"
    plans = [make_plan(sleepy_loss.workload(), ["2"], s, num_microbatches=2) for s in ("1f1b", "gpipe")]
    plans = [replace(p, device={**p.device, "unit_sum_s": 0.04, "capture": "hooks"}) for p in plans]
    run = verify_plans(
        plans,
        spec,
        rounds=2,
        warmup=1,
        min_warmup_s=0.0,
        min_block_s=0.0,
        timeout_s=180,
        unit_references=[True, False],
        track_memory=False,
    )
    assert [r.reference for r in run.reports] == ["units", "layer"]
    # A launch that learns times alone tracks no memory: the first test's reports hold it, these none.
    assert all(s.measured_memory is None for r in run.reports for s in r.stages)
    # The units hold the sleeping loss (a floor under their time); the fixed layer does not (its time, which a
    # loaded machine can stretch past the sleep, says nothing more), and both plans still step every round.
    assert run.reports[0].reference_s >= sleepy_loss.LOSS_SLEEP_S and run.reports[1].reference_s > 0
    assert [len(r) for r in run.round_iteration_s] == [2, 2]


def test_plans_that_cannot_share_a_launch_are_refused_in_one_line() -> None:
    workload = sleepy_loss.workload()
    spec = f"{Path(sleepy_loss.__file__)}:workload"
    with pytest.raises(UsageError, match="at least one round"):
        verify_plans([], spec)
    two = make_plan(workload, ["2"], "1f1b")
    three = make_plan(workload, ["1", "2"], "1f1b", num_ranks=3)
    with pytest.raises(UsageError, match="same ranks and threads"):
        verify_plans([two, three], spec)
    with pytest.raises(UsageError, match="unit_references has 1 entries for 2 plans"):
        verify_plans([two, two], spec, unit_references=[True])


def test_plans_of_one_launch_build_the_model_once_and_each_step_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from planner.runtime import rank_timing
    from profiles.workload import load_workload

    built: list[str] = []

    def counted(spec: str):  # type: ignore[no-untyped-def]
        built.append(spec)
        return load_workload(spec)

    monkeypatch.setattr(rank_timing, "load_workload", counted)
    loaded: dict = {}
    first, second = (rank_timing._own_workload("mlp", loaded) for _ in range(2))
    assert built == ["mlp"]
    kept = loaded["mlp"].model
    assert len({id(first.model), id(second.model), id(kept)}) == 3
    # Same weights as a build of its own, and a step on one copy leaves the others as built.
    for name, value in load_workload("mlp").model.state_dict().items():
        assert torch.equal(first.model.state_dict()[name], value)
    with torch.no_grad():
        for p in first.model.parameters():
            p.add_(1.0)
    assert all(torch.equal(a, b) for a, b in zip(second.model.parameters(), kept.parameters(), strict=True))
    assert rank_timing._own_workload("mlp", None).model is not kept
