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


def test_expected_memory_is_counted_once_when_an_operator_first_writes_into_it() -> None:
    tracker = LiveBytes(default_owner=0)
    made_elsewhere = torch.empty(256)  # 1 KiB, as DDP's reducer makes its buckets: before the tracker
    tracker.expect(1024, owner=0, category="buffers")
    assert tracker.live(0) == MemorySample(buffers_bytes=1024)
    with tracker:
        grad = torch.ones(256)
        torch.mul(grad, 0.5, out=made_elsewhere)  # the first write: known now, not counted again
        fresh = torch.mul(grad, 0.5)  # made by the operator: new
    assert tracker.live(0) == MemorySample(buffers_bytes=1024, transient_bytes=2048)
    del made_elsewhere
    assert tracker.live(0) == MemorySample(transient_bytes=2048)
    del grad, fresh


def test_a_part_of_a_storage_counts_its_own_bytes_and_its_views_nothing() -> None:
    tracker = LiveBytes(default_owner=0)
    whole = torch.zeros(2, 128)  # two replicas' batch, 1 KiB
    mine = whole[1]
    tracker.register_part([mine], owner=0, category="buffers")
    with tracker:
        chunks = mine.chunk(4)  # the schedule's micro-batches: views
    assert tracker.live(0) == MemorySample(buffers_bytes=512)
    del chunks


def test_ddp_buckets_count_once_a_gradient_each(tmp_path) -> None:
    """A one-process gloo group: DDP's reducer copies the gradients into its buckets (``aten.mul.out``) in the
    step's last backward; registered before the step, they are counted once."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from planner.runtime.stage_memory import ddp_bucket_bytes

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
        grad_bytes = sum(p.numel() * 4 for p in model.parameters())  # 1,051,648
        ddp = DistributedDataParallel(model)

        def step() -> None:  # as torch's PipelineStage runs a DDP stage: no_sync but for the last backward
            with ddp.no_sync():
                ddp(torch.randn(8, 256)).sum().backward()
            out = ddp(torch.randn(8, 256))
            ddp.reducer.prepare_for_backward([out])
            out.sum().backward()
            model.zero_grad(set_to_none=True)

        step()
        step()  # DDP rebuilds its buckets at its second step
        assert sum(ddp_bucket_bytes(ddp)) == grad_bytes
        tracker = LiveBytes(default_owner=0)
        tracker.register(model.parameters(), 0, "weights")
        for nbytes in ddp_bucket_bytes(ddp):
            tracker.expect(nbytes, 0, "buffers")
        with tracker:
            tracker.watch_grads(list(model.parameters()), lambda p: 0)
            step()
        peak = tracker.peak(0)
        assert peak.buffers_bytes == grad_bytes
        # The backward's own temporaries (a weight's gradient, 512 KiB, before it is accumulated): the bucket
        # counted again at its first write would be every gradient's bytes on top.
        assert peak.transient_bytes < grad_bytes
    finally:
        dist.destroy_process_group()
