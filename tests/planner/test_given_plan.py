"""A given layout's memory is each rank's, its stages together: an interleaved rank holds, at its peak, as many
stage-loads of activations as its schedule has forwards in flight, not every stage at its own fullest."""

from __future__ import annotations

import pytest

from planner.given_plan import GivenLayout, given_plan
from planner.request import PlanOptions, plan_request
from planner.schedule.orders import Schedule
from synthetic import make_profile

MIB = 2**20


def _rank_peaks_mib(schedule: Schedule, ranks: int, stages_per_rank: int, microbatches: int) -> list[float]:
    # One unit a stage, each saving 1 MiB a micro-batch; weights and the tensors between units next to nothing.
    num_stages = ranks * stages_per_rank
    profile = make_profile(
        [1.0] * num_stages, param_counts=[1] * num_stages, saved_bytes=[MIB] * num_stages, activation_bytes=1
    )
    request = plan_request(profile, PlanOptions(ranks=ranks, global_batch=microbatches))
    stages = tuple((u.name,) for u in profile.units)
    layout = GivenLayout(stages, schedule, 1, microbatches, (False,) * num_stages)
    _, memory = given_plan(profile, request, layout, sha256=None)
    assert [r.rank for r in memory] == list(range(ranks))
    return [r.peak_bytes / MIB for r in memory]


@pytest.mark.parametrize(("ranks", "virtual", "microbatches"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (2, 4, 8)])
def test_an_interleaved_rank_holds_its_warm_up_forwards(ranks: int, virtual: int, microbatches: int) -> None:
    # Narayanan et al. (SC 2021) / Megatron's and torch's interleaved 1F1B: rank r runs 2 (p - 1 - r) + (v - 1) p
    # warm-up forwards and one more before its first backward, each holding one stage's activations.
    peaks = _rank_peaks_mib(Schedule.INTERLEAVED_1F1B, ranks, virtual, microbatches)
    expected = [min(2 * (ranks - 1 - r) + (virtual - 1) * ranks + 1, virtual * microbatches) for r in range(ranks)]
    assert peaks == pytest.approx(expected, abs=0.01)


def test_a_rank_of_one_stage_peaks_as_its_stage() -> None:
    # 1F1B: stage s holds p - s micro-batches.
    peaks = _rank_peaks_mib(Schedule.ONE_F_ONE_B, 4, 1, 8)
    assert peaks == pytest.approx([4.0, 3.0, 2.0, 1.0], abs=0.01)


def test_megatrons_schedules_keep_no_receive_buffers() -> None:
    # torch.distributed.pipelining keeps a receive buffer a micro-batch for a stage's input and its output's
    # gradient; Megatron receives into fresh tensors (the input is the first unit's saved activation).
    cut, microbatches = 3 * MIB, 8
    profile = make_profile([1.0] * 4, param_counts=[1] * 4, saved_bytes=[MIB] * 4, activation_bytes=cut)
    request = plan_request(profile, PlanOptions(ranks=4, global_batch=microbatches))
    stages = tuple((u.name,) for u in profile.units)
    kept, fresh = (
        given_plan(
            profile,
            request,
            GivenLayout(stages, Schedule.ONE_F_ONE_B, 1, microbatches, (False,) * 4, receive_buffers=buffers),
            sha256=None,
        )[1]
        for buffers in (True, False)
    )
    # A middle rank's buffers: its input and its output's gradient, one of each a micro-batch.
    assert kept[1].peak_bytes - fresh[1].peak_bytes == pytest.approx(microbatches * 2 * cut, rel=1e-6)
    assert all(f.peak_bytes < k.peak_bytes for k, f in zip(kept, fresh, strict=True))
