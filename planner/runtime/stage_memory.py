"""What a rank's pipeline stages hold, measured stage by stage during one training step.

:func:`track_rank_memory` runs one more step of a rank's training loop (schedule, tied-gradient sum, optimizer
step, ``zero_grad``) under :class:`profiles.memory.LiveBytes` and returns each stage's peak of live tensor bytes
with its breakdown, and the rank's. Memory is deterministic: after the warm-up every step allocates the same
tensors, so one step tells the peak of all; it runs after the timed steps because the tracker's bookkeeping
(Python, per operator) would slow the steps it watched.

What is counted, and as what, is :mod:`profiles.memory`'s; what exists before the step is registered here:
each stage's parameters (weights) and gradients, the optimizer's state, torch's receive buffers of every
micro-batch (``PipelineStage.args_recv_info`` / ``grad_recv_info``, made once when the schedule first runs),
the step's batch on the ranks that read it (under a cluster plan, the replica's slice of it), and what the
replicas' gradient reduction holds (DDP's buckets, made in C++ when DDP is built: counted from the start, and
known as themselves once the reducer writes into them). A tensor torch hands from one
stage to the next on the same rank becomes the receiving stage's buffer, as it takes that buffer's place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from planner.runtime.apply import PipelineRun
from profiles.memory import LiveBytes, MemorySample

__all__ = ["track_rank_memory", "stage_owner", "recv_buffers", "ddp_bucket_bytes"]


def stage_owner(run: PipelineRun) -> Callable[[torch.Tensor], int | None]:
    """The stage (plan index) a parameter of this rank belongs to; the first stage holding it."""
    owner: dict[int, int] = {}
    for module, s in zip(run.stage_modules, run.stage_indices, strict=True):
        for p in module.parameters():
            owner.setdefault(id(p), s)
    return lambda p: owner.get(id(p))


def recv_buffers(stage: Any) -> list[torch.Tensor]:
    """torch's receive buffers of a ``PipelineStage``: one per input and micro-batch for activations, one per
    output and micro-batch for their gradients, kept from one step to the next (stage.py, ``_RecvInfo``)."""
    out: list[torch.Tensor] = []
    for table in (stage.args_recv_info, stage.grad_recv_info):
        for infos in table.values():
            for info in infos:
                buffer = getattr(info, "buffer", None)
                if isinstance(buffer, torch.Tensor):
                    out.append(buffer)
    return out


def ddp_bucket_bytes(module: Any) -> list[int]:
    """Bytes of a DDP module's gradient buckets (its reducer's flat buffers, as DDP logs them); none otherwise.
    Together they are the gradients' bytes, whatever ``bucket_cap_mb`` cuts them into (DDP fills a bucket until it
    reaches the cap, 25 MiB, the first one 1 MiB); the log may give their total as one number (44,062,720 logged,
    2,099,200 + 41,963,520 bytes written), which the tracker takes as a total (``LiveBytes.expect``)."""
    if not hasattr(module, "_get_ddp_logging_data"):
        return []
    data = module._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") if data.get("has_rebuilt_buckets") else None
    return [int(x) for x in str(sizes or data.get("bucket_sizes", "")).split(",") if x.strip()]


@contextmanager
def _acting_stages(run: PipelineRun, tracker: LiveBytes) -> Iterator[None]:
    """Wrap each stage's compute (on the instance, as verify's timers do) so what it makes is that stage's."""
    saved: list[tuple[Any, str, Any]] = []

    def wrap(obj: Any, method: str, owner: int, category: str) -> None:
        original = getattr(obj, method, None)
        if original is None:
            return

        def acting(*args: Any, **kwargs: Any) -> Any:
            with tracker.acting(owner, category):
                return original(*args, **kwargs)

        saved.append((obj, method, obj.__dict__.get(method)))
        setattr(obj, method, acting)

    def receive(obj: Any, method: str, owner: int) -> None:
        """Across a cut on one rank torch hands the tensors over in place of the receiving stage's buffers,
        which keep them: from then on they are that stage's buffers."""
        original = getattr(obj, method, None)
        if original is None:
            return

        def handed(values: Any, mb: int) -> Any:
            for t in values if isinstance(values, (tuple, list)) else (values,):
                if isinstance(t, torch.Tensor):
                    tracker.classify(t, "buffers", owner)
            return original(values, mb)

        saved.append((obj, method, obj.__dict__.get(method)))
        setattr(obj, method, handed)

    for stage, s in zip(run.stages, run.stage_indices, strict=True):
        receive(stage, "set_local_fwd_input", s)
        receive(stage, "set_local_bwd_input", s)
        wrap(stage, "forward_one_chunk", s, "activations")
        wrap(stage, "backward_one_chunk", s, "transient")
        wrap(stage, "backward_weight_one_chunk", s, "transient")
        wrap(stage, "perform_reduce_grad", s, "transient")
    if run.is_last:
        # The loss is computed right after the last stage's forward, outside forward_one_chunk: what it saves
        # for its backward (the log-softmax of the logits) is held like an activation.
        wrap(run.schedule, "_compute_loss", run.plan.num_stages - 1, "activations")
    try:
        yield
    finally:
        for obj, method, before in reversed(saved):
            if before is None:
                delattr(obj, method)
            else:
                setattr(obj, method, before)


def track_rank_memory(
    run: PipelineRun,
    optimizer: torch.optim.Optimizer,
    step: Callable[[], object],
    inputs: tuple[torch.Tensor, ...],
    target: torch.Tensor,
) -> tuple[tuple[MemorySample, ...], MemorySample]:
    """Run ``step`` once under the tracker: each of the rank's stages' peak (in ``run.stage_indices`` order)
    and the rank's peak (all its stages at once, with what no stage claimed)."""
    single = run.stage_indices[0] if len(run.stage_indices) == 1 else None
    tracker = LiveBytes(default_owner=single)
    owner = stage_owner(run)
    for module, s in zip(run.stage_modules, run.stage_indices, strict=True):
        tracker.register(module.parameters(), s, "weights")
        tracker.register(module.buffers(), s, "weights")
        tracker.register((p.grad for p in module.parameters() if p.grad is not None), s, "grads")
    for stage, s in zip(run.stages, run.stage_indices, strict=True):
        tracker.register(recv_buffers(stage), s, "buffers")
        tracker.register(stage.output_chunks, s, "activations")
        for nbytes in ddp_bucket_bytes(stage.submod):
            tracker.expect(nbytes, s, "buffers")
    # A replica's own part of the step's batch: each replica of a real run loads only its slice.
    if run.is_first:
        tracker.register_part(run.replica_slice(inputs), 0, "buffers")
    if run.is_last:
        tracker.register_part(run.replica_slice((target,)), run.plan.num_stages - 1, "buffers")
    params = [p for module in run.stage_modules for p in module.parameters()]
    with tracker, _acting_stages(run, tracker):
        tracker.watch_grads(params, owner)
        tracker.watch_optimizer(optimizer, owner)
        step()
    return tuple(tracker.peak(s) for s in run.stage_indices), tracker.peak_all()
