"""Threads for untimed work: every core where nothing else keeps them busy, the current threads where it does."""

from __future__ import annotations

import pytest
import torch

from profiles import cores
from profiles.cores import untimed_on_every_core


@pytest.mark.parametrize(
    ("load", "device", "expected"), [(0.9, "cpu", "every"), (1.6, "cpu", "same"), (0.1, "cuda", "same")]
)
def test_untimed_work_takes_every_core_only_where_the_others_are_idle(
    monkeypatch: pytest.MonkeyPatch, load: float, device: str, expected: str
) -> None:
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cores.os, "getloadavg", lambda: (load, load, load))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with untimed_on_every_core(device):
            inside = torch.get_num_threads()
        assert torch.get_num_threads() == 1  # restored
    finally:
        torch.set_num_threads(before)
    assert inside == (2 if expected == "every" else 1)
