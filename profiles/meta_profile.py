"""Profiling a model larger than the device: one unit materialised at a time.

The model is on the meta device (:mod:`profiles.meta`). At each micro-batch size it is split by
``torch.distributed.pipelining.pipeline()`` on meta inputs, exactly as a loaded model is
(:func:`profiles.dataflow.capture_export`): the same units, the same pieces, the same tensors between
them, at no memory cost. The pieces are then run in order, each materialised on the device, fed the real
outputs of the pieces before it (so integer ids, masks and rotary tables hold real values), measured by
the same harness as a loaded model's units (:func:`profiles.measure.measure_piece`, round after round
until its median is stable), counted by fvcore, and returned to meta. What is held at once is one piece's
weights and gradients, its activations, and the tensors still waiting for a later consumer.

With ``sample_blocks``, each run of consecutive units that are structurally identical (same module type,
same parameter names relative to the unit, shapes and dtypes, same input and output shapes and dtypes,
same sequence of operators in the split graph) is measured once, at its first unit; the others get its
numbers, and stand in its outputs for the units after them. The profile says which
(``settings.sampled_from``: copy -> measured unit).

The whole model is never held, so it is not measured: ``whole_model`` is the unit sum and
``settings.whole_model_path`` says so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from planner.errors import PipeplanError, ProfilingError, UsageError, shorten
from profiles.dataflow import Capture, Piece, Source, capture_export, param_ownership
from profiles.measure import PieceMeasurement, count_flops, measure_piece, peak_rss_bytes
from profiles.meta import META, materialise, release, retarget_devices
from profiles.rounds import Measurements, Timing, measure_rounds, overhead_piece

__all__ = ["MetaSetup", "measure_on_meta", "identical_runs", "check_sample_blocks"]


def _signature(model: nn.Module, capture: Capture, i: int) -> tuple[Any, ...]:
    """What must be equal for two units to be measured once: type, parameters, inputs, outputs, operators."""
    piece = capture.pieces[i]
    prefix = piece.name + "."
    params = tuple(
        (name.removeprefix(prefix), tuple(p.shape), p.dtype)
        for name, p in piece.module.named_parameters(remove_duplicate=False)
    )
    inputs = tuple(
        (tuple(a.shape), a.dtype, grad) if isinstance(a, torch.Tensor) else repr(a)
        for a, grad in zip(piece.args, piece.arg_needs_grad, strict=True)
    )
    ops = tuple(
        str(node.target)
        for sub in piece.module.modules()
        if isinstance(getattr(sub, "graph", None), torch.fx.Graph)
        for node in sub.graph.nodes
        if node.op == "call_function"
    )
    return (type(model.get_submodule(piece.name)).__name__, params, inputs, capture.outputs[i], ops)


def _no_identical(count: int) -> UsageError:
    return UsageError(
        f"--sample-blocks: no two consecutive units of the {count} are identical (same type, parameter shapes, "
        "input and output shapes); profile every unit: leave it out"
    )


def check_sample_blocks(model: nn.Module, units: Sequence[str]) -> None:
    """Refuse ``sample_blocks`` at once when no two consecutive units share type and parameter shapes.

    The full comparison (:func:`identical_runs`) needs the split graph; this one, on the modules, runs before
    any output so that the refusal is the one line a bad input gets.
    """

    def key(unit: str) -> tuple[Any, ...]:
        module = model.get_submodule(unit)
        return (type(module), tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()))

    keys = [key(u) for u in units[:-1]]  # the last unit is never a copy
    if not any(a == b for a, b in zip(keys[:-1], keys[1:], strict=True)):
        raise _no_identical(len(units))


def identical_runs(model: nn.Module, capture: Capture) -> dict[int, int]:
    """Copy -> measured unit index, for every run of consecutive identical units (:func:`_signature`).

    The last unit is never a copy: it is timed with the loss, as the last pipeline stage computes it.
    """
    copies: dict[int, int] = {}
    n = len(capture.pieces)
    signatures = [_signature(model, capture, i) for i in range(n)]
    first = 0
    for i in range(1, n - 1):
        if signatures[i] == signatures[first]:
            copies[i] = first
        else:
            first = i
    return copies


class _Stream:
    """The real values passed between pieces, each kept until its last consumer has run."""

    def __init__(self, inputs: tuple[Any, ...], sources: Sequence[Sequence[Source | None]]) -> None:
        self.inputs = inputs
        self.outputs: dict[int, Any] = {}
        self.last_use: dict[int, int] = {}
        for i, srcs in enumerate(sources):
            for src in srcs:
                if src is not None and src[0] >= 0:
                    self.last_use[src[0]] = max(self.last_use.get(src[0], i), i)

    def value(self, src: Source) -> Any:
        producer, j = src
        if producer == -1:
            return self.inputs[j]
        out = self.outputs[producer]
        return out if j == -1 else out[j]

    def done(self, i: int, out: Any) -> None:
        """Piece ``i`` ran: keep its output for later consumers, drop values nothing reads any more."""
        if self.last_use.get(i, -1) > i:
            self.outputs[i] = out
        for producer in [p for p in self.outputs if self.last_use.get(p, -1) <= i]:
            del self.outputs[producer]


def _args(piece: Piece, sources: Sequence[Source | None], stream: _Stream) -> tuple[Any, ...]:
    args = []
    for src, captured in zip(sources, piece.args, strict=True):
        if src is not None:
            args.append(stream.value(src))
        elif isinstance(captured, torch.Tensor) and captured.is_meta:
            raise ProfilingError(f"unit {piece.name} takes a tensor constant that only exists on meta")
        else:
            args.append(captured)
    return tuple(args)


def _split_on_meta(model: nn.Module, inputs: tuple[Any, ...], units: list[str], dev: torch.device) -> Capture:
    try:
        capture = capture_export(model, inputs, units)
    except ProfilingError:
        raise
    except Exception as exc:
        raise ProfilingError(
            "a meta profile needs a model torch.export can split, and this one cannot be: "
            f"{shorten(f'{type(exc).__name__}: {exc}', 160)}; profile it without --meta"
        ) from None
    for piece in capture.pieces:
        retarget_devices(piece.module, dev)
    return capture


def _measure_piece(
    piece: Piece,
    dev: torch.device,
    timing: Timing,
    loss: tuple[Callable[[Any, Any], torch.Tensor], Any] | None,
    tick: Callable[[], None],
) -> tuple[PieceMeasurement, int]:
    """One materialised piece, round after round until its median is stable; its measurement and rounds."""

    def measure(_: int, r: int) -> PieceMeasurement:
        result = measure_piece(
            piece,
            device=dev,
            repeats=1,
            warmup=timing.warmup if r == 0 else 0,
            loss_fn=loss[0] if loss else None,
            target=loss[1] if loss else None,
            track_memory=r == 0,  # bytes do not vary: the first round's stand (rounds.py)
        )
        tick()
        return result

    done = measure_rounds(
        1,
        measure,
        watch=[[0]],
        min_rounds=timing.repeats,
        max_rounds=timing.max_repeats,
        stable_within=timing.stable_within,
    )
    return done.medians[0], done.rounds


@dataclass(frozen=True)
class MetaSetup:
    """What :func:`measure_on_meta` measures, and how."""

    model: nn.Module
    """The model, built on the meta device."""
    buffers: Mapping[str, torch.Tensor]
    """The real values of its buffers by FQN (``Workload.meta_buffers``), put in as each piece is materialised."""
    batch: Callable[[int], tuple[tuple[Any, ...], Any]]
    """``batch(b)``: real inputs and target of ``b`` samples on ``device``."""
    units: tuple[str, ...]
    """The units' FQNs in execution order."""
    sizes: tuple[int, ...]
    """The micro-batch sizes, ascending."""
    device: torch.device
    """Where each piece is materialised and measured."""
    timing: Timing
    loss_fn: Callable[[Any, Any], torch.Tensor]
    """``loss_fn(output, target)``: timed with the last unit, as the last pipeline stage computes it."""
    sample_blocks: bool = False
    """Measure one unit of each run of identical consecutive units (module docstring)."""
    progress: bool = True
    """Show a progress bar on stderr."""


def _copies(setup: MetaSetup, capture: Capture) -> dict[int, int]:
    """The units measured by another's numbers (:func:`identical_runs`); none without ``sample_blocks``."""
    if not setup.sample_blocks:
        return {}
    copies = identical_runs(setup.model, capture)
    if not copies:
        raise _no_identical(len(setup.units))
    return copies


def _measure_unit(
    setup: MetaSetup, capture: Capture, i: int, stream: _Stream, target: Any, b: int, tick: Callable[[], None]
) -> tuple[PieceMeasurement, int, Any, int]:
    """Materialise piece ``i``, measure it on the real values before it and return it to meta; its
    measurement, rounds, output and forward multiply-adds."""
    meta_piece = capture.pieces[i]
    module = meta_piece.module
    materialise(module, setup.buffers, setup.device)
    try:
        piece = Piece(meta_piece.name, module, _args(meta_piece, capture.sources[i], stream), meta_piece.arg_needs_grad)
        loss = (setup.loss_fn, target) if i == len(capture.pieces) - 1 else None
        measured, rounds = _measure_piece(piece, setup.device, setup.timing, loss, tick)
        with torch.no_grad():
            out = module(*piece.args)
        count = count_flops(module, piece.args)
    except PipeplanError:
        raise
    except Exception as exc:
        raise ProfilingError(
            f"measuring unit {meta_piece.name} at micro-batch size {b} failed: "
            f"{shorten(f'{type(exc).__name__}: {exc}', 200)}"
        ) from None
    finally:
        release(module)
    return measured, rounds, out, count


def _measure_units(
    setup: MetaSetup,
    capture: Capture,
    copies: dict[int, int],
    inputs: tuple[Any, ...],
    target: Any,
    b: int,
    bar: Any,
) -> tuple[tuple[PieceMeasurement, ...], tuple[int, ...], int]:
    """Every unit at size ``b``, in order, each fed the real outputs of those before it (a copy in ``copies``
    takes its measured unit's numbers and outputs); their measurements, multiply-adds, and the most rounds any
    needed."""
    stream = _Stream(inputs, capture.sources)
    results: list[PieceMeasurement] = []
    counted: list[int] = []
    sample_out: dict[int, Any] = {}
    most_rounds = 0

    def tick() -> None:
        bar.update()

    for i, meta_piece in enumerate(capture.pieces):
        if i in copies:
            s = copies[i]
            results.append(results[s])
            counted.append(counted[s])
            stream.done(i, sample_out[s])  # its outputs stand in for the copy's
            continue
        bar.set_description(f"b={b} {meta_piece.name}")
        measured, rounds, out, count = _measure_unit(setup, capture, i, stream, target, b, tick)
        results.append(measured)
        counted.append(count)
        most_rounds = max(most_rounds, rounds)
        if i + 1 in copies:
            sample_out[i] = out
        stream.done(i, out)
        del out
    return tuple(results), tuple(counted), most_rounds


def measure_on_meta(setup: MetaSetup) -> tuple[Measurements, dict[str, Any]]:
    """Measure every unit of the meta model one at a time (module docstring); and the settings to record.

    Raises :class:`UsageError` for ``sample_blocks`` with no two consecutive identical units,
    :class:`ProfilingError` when the model cannot be split on meta or a unit fails.
    """
    from tqdm import tqdm

    dev, timing = setup.device, setup.timing
    bar = tqdm(total=0, disable=not setup.progress, file=sys.stderr, unit="round", leave=False)
    per_size: list[tuple[PieceMeasurement, ...]] = []
    flops: list[tuple[int, ...]] = []
    overhead: list[PieceMeasurement] = []
    rounds_used: list[int] = []
    edges = []
    ownership: list[tuple[int, int, tuple[str, ...], int, int]] | None = None
    sampled: dict[int, int] | None = None
    try:
        for b in setup.sizes:
            inputs, target = setup.batch(b)
            meta_inputs = tree_map(lambda t: t.to(META) if isinstance(t, torch.Tensor) else t, inputs)
            bar.set_description(f"split b={b} (meta)")
            capture = _split_on_meta(setup.model, meta_inputs, list(setup.units), dev)
            if ownership is None:
                ownership = param_ownership(setup.model, capture)
            copies = _copies(setup, capture)
            if sampled is None:
                sampled = copies
            elif copies != sampled:
                raise ProfilingError(f"the identical units differ at micro-batch size {b} from size {setup.sizes[0]}")
            bar.total += (len(capture.pieces) - len(copies)) * timing.repeats + timing.repeats
            bar.refresh()
            results, counted, most_rounds = _measure_units(setup, capture, copies, inputs, target, b, bar)
            bar.set_description(f"b={b} overhead")
            trivial = overhead_piece("export", dev)
            overhead.append(_measure_piece(trivial, dev, timing, None, bar.update)[0])
            per_size.append(results)
            flops.append(counted)
            rounds_used.append(most_rounds)
            edges.append(capture.edges)
            del capture
    finally:
        bar.close()
    assert ownership is not None and sampled is not None
    settings: dict[str, Any] = {"meta": True}
    if setup.sample_blocks:
        settings["sampled_from"] = {setup.units[c]: setup.units[s] for c, s in sampled.items()}
    settings["peak_rss_bytes"] = peak_rss_bytes()
    measurements = Measurements(
        units=tuple(per_size),
        flops=tuple(flops),
        whole=None,
        overhead=tuple(overhead),
        rounds=tuple(rounds_used),
        edges=tuple(edges),
        ownership=tuple(ownership),
        mode="export",
    )
    return measurements, settings
