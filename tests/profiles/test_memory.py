"""profiles.memory.LiveBytes: live tensor bytes by owner and category, with exact byte counts."""

from __future__ import annotations

import torch
from torch import nn

from profiles.memory import LiveBytes, MemorySample


def test_a_storage_counts_while_alive_and_views_share_it() -> None:
    tracker = LiveBytes(default_owner="a")
    with tracker:
        x = torch.zeros(256)  # 1 KiB
        view = x[:10]
        assert tracker.live("a") == MemorySample(transient_bytes=1024)
        del x
        assert tracker.live("a").total_bytes == 1024  # the view keeps the storage
        del view
        assert tracker.live("a").total_bytes == 0
    assert tracker.peak("a").total_bytes == 1024


def test_acting_sets_owner_and_category_and_outside_it_the_inputs_owner_wins() -> None:
    tracker = LiveBytes()
    w = torch.ones(64)
    tracker.register([w], owner=1, category="weights")
    with tracker:
        with tracker.acting(0, "activations"):
            a = torch.ones(128)
        b = w * 2  # no action: the input's owner, as a temporary
    assert tracker.live(0) == MemorySample(activations_bytes=512)
    assert tracker.live(1) == MemorySample(weights_bytes=256, transient_bytes=256)
    assert tracker.peak_all().total_bytes == 1024
    del a, b


def test_gradients_and_optimizer_state_are_reclassified() -> None:
    torch.manual_seed(0)
    model = nn.Linear(16, 16)  # 16 * 16 + 16 = 272 parameters, 1088 bytes
    optimizer = torch.optim.Adam(model.parameters())
    tracker = LiveBytes(default_owner=0)
    tracker.register(model.parameters(), 0, "weights")
    with tracker:
        tracker.watch_grads(model.parameters(), lambda p: 0)
        tracker.watch_optimizer(optimizer, lambda p: 0)
        with tracker.acting(0, "activations"):
            loss = model(torch.ones(4, 16)).sum()
        with tracker.acting(0, "transient"):
            loss.backward()
        assert tracker.live(0).grads_bytes == 1088
        optimizer.step()
        # Adam's m and v, and a 4-byte step per parameter tensor.
        assert tracker.live(0).optimizer_bytes == 2 * 1088 + 2 * 4
        optimizer.zero_grad(set_to_none=True)
        assert tracker.live(0).grads_bytes == 0
        del loss


def test_a_resized_storage_is_counted_at_its_new_size() -> None:
    tracker = LiveBytes(default_owner=0)
    with tracker:
        x = torch.zeros(100)
        x.untyped_storage().resize_(0)  # how FSDP frees an unsharded parameter
        assert tracker.live(0).total_bytes == 0
        x.untyped_storage().resize_(800)
        assert tracker.live(0).total_bytes == 800
    assert tracker.peak(0).total_bytes == 800
