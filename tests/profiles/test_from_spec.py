"""profile_spec: the threads a CPU profile is timed with when the user names none."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from profiles import from_spec
from profiles.profile_options import ProfileOptions


@pytest.fixture
def threads_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """profile_model replaced by a recorder of torch's intra-op threads at the moment it would measure."""
    seen: list[int] = []

    def record(*args: Any, **kwargs: Any) -> str:
        seen.append(torch.get_num_threads())
        return "profile"

    before = torch.get_num_threads()
    monkeypatch.setattr(from_spec, "profile_model", record)
    monkeypatch.setattr("profiles.cores.os.cpu_count", lambda: 8)
    yield seen
    torch.set_num_threads(before)


def test_a_cpu_profile_is_timed_at_a_two_rank_pipelines_threads_by_default(threads_seen: list[int]) -> None:
    assert from_spec.profile_spec(ProfileOptions(model="mlp", no_progress=True)) == "profile"
    assert threads_seen == [4]  # 8 cores // 2 ranks, not all 8


def test_ranks_and_threads_choose_other_counts(threads_seen: list[int]) -> None:
    from_spec.profile_spec(ProfileOptions(model="mlp", ranks=8, no_progress=True))
    from_spec.profile_spec(ProfileOptions(model="mlp", threads=3, no_progress=True))
    # More ranks than cores: 1 thread each.
    from_spec.profile_spec(ProfileOptions(model="mlp", ranks=16, no_progress=True))
    assert threads_seen == [1, 3, 1]
