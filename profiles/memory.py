"""Live tensor bytes by torch's own accounting: every storage, who holds it, what it is, and the peak.

A ``TorchDispatchMode`` (as torch's ``torch.distributed._tools.mem_tracker.MemTracker``, whose technique it
follows: a weak reference per ``UntypedStorage``, a callback when the storage is freed, ``resize_`` patched
because the dispatcher does not see it) that counts the bytes of every storage an operator creates inside
it, and of the storages registered before it (weights, optimizer state, receive buffers). Each storage has
an *owner* (a pipeline stage) and a *category*, so one process holding several stages is measured stage by
stage, and each stage's peak comes with its breakdown.

Why not ``MemTracker`` itself: it refuses a root module called more than once per iteration ("does not
support memory tracking for multiple iterative calls"), which is what a pipeline stage is (one call per
micro-batch), and it attributes memory to modules, not to the stages of a schedule that interleaves them.

What it counts is what the dispatcher allocates: outputs of operators, in every thread whose dispatch
state includes the mode (autograd's backward on CPU runs in the caller's thread). Kernel-internal scratch
(oneDNN workspaces) and allocations made in C++ outside an operator (gloo's staging, DDP's reducer buckets,
made at construction) are not seen; a caller registers the latter with :meth:`LiveBytes.expect` (counted from
then on; the storage, once an operator writes into it, is known as that memory and not counted twice).

Categories, as the plan breaks a stage's memory down (planner/cost.py ``MemoryBreakdown``):

- ``weights``: parameters (registered);
- ``grads``: a parameter's ``.grad`` (reclassified when autograd accumulates it);
- ``optimizer``: optimizer state (registered, and reclassified after each ``step``);
- ``activations``: made during a forward (or the loss) and still alive: saved tensors, held outputs;
- ``transient``: made during a backward, an optimizer step or between actions: gradients in flight,
  temporaries, input gradients waiting to be sent;
- ``buffers``: communication buffers (receive buffers, gradient buckets) and the step's batch (registered).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["CATEGORIES", "MemorySample", "LiveBytes", "tensor_storages"]

CATEGORIES = ("weights", "grads", "optimizer", "activations", "transient", "buffers")


@dataclass(frozen=True)
class MemorySample:
    """Live bytes of one owner (or of all owners together) at its peak, by category."""

    weights_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    activations_bytes: int = 0
    transient_bytes: int = 0
    buffers_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.transient_bytes
            + self.buffers_bytes
        )

    @classmethod
    def of(cls, by_category: dict[str, int]) -> MemorySample:
        return cls(**{f"{c}_bytes": by_category.get(c, 0) for c in CATEGORIES})


class _Entry:
    __slots__ = ("owner", "category", "nbytes", "ref")

    def __init__(self, owner: Hashable, category: str, nbytes: int) -> None:
        self.owner = owner
        self.category = category
        self.nbytes = nbytes
        self.ref: Any = None
        """The weak reference whose callback uncounts the storage (kept here, alive as long as the entry)."""


_CUDA_BLOCK_BYTES = 512
"""The CUDA caching allocator's smallest block: every allocation rounds up to a multiple of it (as torch's
``MemTracker`` counts, from c10/cuda/CUDACachingAllocator.cpp ``kMinBlockSize``)."""


def _allocated_bytes(storage: torch.UntypedStorage) -> int:
    nbytes = storage.nbytes()
    if storage.device.type == "cuda":
        return -(-nbytes // _CUDA_BLOCK_BYTES) * _CUDA_BLOCK_BYTES
    return nbytes


def tensor_storages(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages behind ``tensor``: its own, or a wrapper subclass's inner tensors' (a DTensor's shard)."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        inner = [getattr(tensor, name) for name in names]
        return [s for t in inner if isinstance(t, torch.Tensor) for s in tensor_storages(t)]
    if tensor.device.type == "meta":
        return []
    try:
        return [tensor.untyped_storage()]
    except (NotImplementedError, RuntimeError):  # a tensor without storage (a functional wrapper)
        return []


class LiveBytes(TorchDispatchMode):
    """Count live storages by owner and category while active; keep each owner's peak and the total's.

    Usage::

        tracker = LiveBytes()
        tracker.register(model.parameters(), owner=0, category="weights")
        with tracker, tracker.acting(0, "activations"):
            out = model(x)
        tracker.peak(0).total_bytes

    Storages made outside :meth:`acting` go to the owner of the first tracked storage among the operator's
    inputs (an optimizer's temporaries to the stage of the parameter it updates), else to ``default_owner``.
    """

    def __init__(self, default_owner: Hashable = None) -> None:
        super().__init__()
        self.default_owner = default_owner
        self._entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._live: dict[Hashable, dict[str, int]] = {}
        self._peak_total: dict[Hashable, int] = {}
        self._peak_sample: dict[Hashable, dict[str, int]] = {}
        self._all_live: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self._all_peak = 0
        self._all_peak_sample: dict[str, int] = dict(self._all_live)
        self._owner: Hashable = None
        self._category: str | None = None
        self._hooks: list[Any] = []
        self._resize: Callable[..., Any] | None = None
        self._expected: list[list[Any]] = []
        """``[owner, category, bytes]`` announced by :meth:`expect` that no operator has written into yet."""

    # -- bookkeeping ------------------------------------------------------------------------------------

    def _bucket(self, owner: Hashable) -> dict[str, int]:
        if owner not in self._live:
            self._live[owner] = dict.fromkeys(CATEGORIES, 0)
            self._peak_total[owner] = 0
            self._peak_sample[owner] = dict(self._live[owner])
        return self._live[owner]

    def _change(self, entry: _Entry, delta: int) -> None:
        bucket = self._bucket(entry.owner)
        bucket[entry.category] += delta
        self._all_live[entry.category] += delta
        if delta > 0:
            total = sum(bucket.values())
            if total > self._peak_total[entry.owner]:
                self._peak_total[entry.owner] = total
                self._peak_sample[entry.owner] = dict(bucket)
            everything = sum(self._all_live.values())
            if everything > self._all_peak:
                self._all_peak = everything
                self._all_peak_sample = dict(self._all_live)

    def _freed(self, entry: _Entry, _ref: Any) -> None:
        self._change(entry, -entry.nbytes)

    def _add(self, storage: torch.UntypedStorage, owner: Hashable, category: str) -> _Entry | None:
        entry = self._entries.get(storage)
        if entry is not None:
            return entry
        entry = _Entry(owner, category, _allocated_bytes(storage))
        entry.ref = weakref.ref(storage, functools.partial(self._freed, entry))
        self._entries[storage] = entry
        if entry.nbytes:
            self._change(entry, entry.nbytes)
        return entry

    def register(self, tensors: Iterable[Any], owner: Hashable, category: str) -> None:
        """Count storages that exist already (each once: a storage registered twice keeps its first owner)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for storage in tensor_storages(t):
                    self._add(storage, owner, category)

    def register_bytes(self, nbytes: int, owner: Hashable, category: str) -> None:
        """Count memory the dispatcher never sees at all, held throughout."""
        self._change(_Entry(owner, category, nbytes), nbytes)

    def expect(self, nbytes: int, owner: Hashable, category: str) -> None:
        """Count storage made in C++ before tracking that an ``out=`` operator will write into: DDP's gradient
        buckets, which its reducer fills with ``aten.mul.out`` during the step's last backward.

        The bytes count from now. An unknown storage that an operator is given as its ``out`` is this memory, as
        far as the bytes announced go: known from then on, not counted again, uncounted when freed. (DDP logs its
        buckets' total, not always their sizes: a 44,062,720-byte bucket logged, 2,099,200 + 41,963,520 bytes
        written.) Without this, a bucket counted once here and again at its first write put a DDP stage's step
        tail a gradient's size over what it holds."""
        self._change(_Entry(owner, category, nbytes), nbytes)
        self._expected.append([owner, category, nbytes])

    def register_part(self, tensors: Iterable[Any], owner: Hashable, category: str) -> None:
        """Count only the bytes each tensor spans of its storage (a replica's slice of the whole step's batch,
        which a replica of a real run loads alone); the storage is known from then on (its views, the schedule's
        micro-batch chunks, are not new), and the bytes are uncounted when it is freed."""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            for storage in tensor_storages(t):
                if storage in self._entries:
                    continue
                entry = _Entry(owner, category, min(t.numel() * t.element_size(), _allocated_bytes(storage)))
                entry.ref = weakref.ref(storage, functools.partial(self._freed, entry))
                self._entries[storage] = entry
                if entry.nbytes:
                    self._change(entry, entry.nbytes)

    def _adopt(self, storage: torch.UntypedStorage, kwargs: Any) -> bool:
        """Whether ``storage``, an operator's ``out``, is memory announced by :meth:`expect` (then known)."""
        out = kwargs.get("out") if isinstance(kwargs, dict) else None
        if not isinstance(out, torch.Tensor) or all(s.data_ptr() != storage.data_ptr() for s in tensor_storages(out)):
            return False  # not written into as an ``out``: made by the operator, or some other in-place write
        nbytes = _allocated_bytes(storage)
        pending = next((p for p in self._expected if p[2] >= nbytes), None)
        if pending is None:
            return False
        pending[2] -= nbytes
        if not pending[2]:
            self._expected.remove(pending)
        entry = _Entry(pending[0], pending[1], nbytes)
        entry.ref = weakref.ref(storage, functools.partial(self._freed, entry))
        self._entries[storage] = entry
        return True

    def classify(self, tensor: torch.Tensor, category: str, owner: Hashable = None) -> None:
        """Move ``tensor``'s storages to ``category`` (and ``owner``, when given), counting them if new."""
        for storage in tensor_storages(tensor):
            entry = self._entries.get(storage)
            if entry is None:
                self._add(storage, owner if owner is not None else self._owner, category)
                continue
            if entry.category == category and (owner is None or entry.owner == owner):
                continue
            self._change(entry, -entry.nbytes)
            entry.category = category
            entry.owner = owner if owner is not None else entry.owner
            self._change(entry, entry.nbytes)

    def owner_of(self, tensor: torch.Tensor) -> Hashable:
        for storage in tensor_storages(tensor):
            entry = self._entries.get(storage)
            if entry is not None:
                return entry.owner
        return None

    @contextmanager
    def acting(self, owner: Hashable, category: str) -> Iterator[None]:
        """Storages made inside belong to ``owner`` as ``category`` (nested: the innermost wins)."""
        before = self._owner, self._category
        self._owner, self._category = owner, category
        try:
            yield
        finally:
            self._owner, self._category = before

    def watch_grads(self, params: Iterable[torch.nn.Parameter], owner_of: Callable[[torch.Tensor], Hashable]) -> None:
        """Reclassify each parameter's ``.grad`` as ``grads`` of the parameter's owner when autograd accumulates it."""

        def accumulated(p: torch.Tensor) -> None:
            if p.grad is not None:
                self.classify(p.grad, "grads", owner_of(p))

        for p in params:
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(accumulated))

    def watch_optimizer(self, optimizer: torch.optim.Optimizer, owner_of: Callable[[torch.Tensor], Hashable]) -> None:
        """Count the optimizer's state as ``optimizer`` of each parameter's owner, now and after every step."""

        def classify_state(*_: Any) -> None:
            for p, state in optimizer.state.items():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self.classify(value, "optimizer", owner_of(p))

        classify_state()
        self._hooks.append(optimizer.register_step_post_hook(classify_state))

    def reset_peaks(self) -> None:
        """Start every peak again from what is live now."""
        for owner, bucket in self._live.items():
            self._peak_total[owner] = sum(bucket.values())
            self._peak_sample[owner] = dict(bucket)
        self._all_peak = sum(self._all_live.values())
        self._all_peak_sample = dict(self._all_live)

    # -- results ----------------------------------------------------------------------------------------

    def peak(self, owner: Hashable) -> MemorySample:
        """``owner``'s largest live total, by category at that moment."""
        return MemorySample.of(self._peak_sample.get(owner, {}))

    def peak_all(self) -> MemorySample:
        """The largest live total of all owners together (a rank), by category at that moment."""
        return MemorySample.of(self._all_peak_sample)

    def live(self, owner: Hashable) -> MemorySample:
        return MemorySample.of(self._live.get(owner, {}))

    @property
    def owners(self) -> tuple[Hashable, ...]:
        return tuple(self._live)

    # -- the mode ---------------------------------------------------------------------------------------

    def __enter__(self) -> LiveBytes:
        original = torch.UntypedStorage.resize_
        self._resize = original

        @functools.wraps(original)
        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            # FSDP frees and re-materialises its unsharded parameters by resizing their storages in place.
            out = original(storage, size)
            entry = self._entries.get(storage)
            if entry is not None and entry.nbytes != _allocated_bytes(storage):
                delta = _allocated_bytes(storage) - entry.nbytes
                entry.nbytes = _allocated_bytes(storage)
                self._change(entry, delta)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        if self._resize is not None:
            torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        super().__exit__(*args)

    def _input_owner(self, inputs: Any) -> Hashable:
        for a in tree_leaves(inputs):
            if isinstance(a, torch.Tensor):
                owner = self.owner_of(a)
                if owner is not None:
                    return owner
        return self.default_owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local ops, which this mode then sees
        out = func(*args, **(kwargs or {}))
        owner, category = self._owner, self._category
        if owner is None:
            owner = self._input_owner((args, kwargs))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                for storage in tensor_storages(t):
                    if self._expected and storage not in self._entries and self._adopt(storage, kwargs):
                        continue
                    self._add(storage, owner, category or "transient")
        return out
