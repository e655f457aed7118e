"""The runtime calibration (format ``pipeplan.calibration``, version 1): what the runtime adds to compute.

A profile measures compute unit by unit; a real iteration also pays torch's per-action overhead,
point-to-point transfers on the real backend, the tied-gradient sum, the optimizer step, and
the slowdown of ranks that share a machine. ``pipeplan calibrate`` measures these constants
(:mod:`planner.runtime.calibrate`), ``pipeplan tune`` refits them from real runs, and the planner
turns them into :class:`~planner.schedule.simulate.RuntimeTerms` for each candidate. Every formula is
in docs/cost-model.md ("Runtime terms"); the format is in docs/calibration-format.md.

Pure Python: no torch import.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import CalibrationError
from planner.fileio import check_document, load_document, write_json_atomic
from planner.schedule.orders import Schedule
from planner.schedule.simulate import RuntimeTerms

__all__ = [
    "ring_s",
    "CALIBRATION_FORMAT",
    "CALIBRATION_VERSION",
    "OptimizerCost",
    "Calibration",
    "load_calibration",
    "save_calibration",
    "calibration_from_dict",
    "shipped_calibration",
    "BACKEND_OF_DEVICE",
]

CALIBRATION_FORMAT = "pipeplan.calibration"
CALIBRATION_VERSION = 1
BACKEND_OF_DEVICE = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(frozen=True)
class OptimizerCost:
    """``optimizer.step()`` plus ``zero_grad()`` on one rank:
    ``per_step_s + per_param_s * parameters + per_tensor_s * parameter tensors``."""

    per_param_s: float
    per_step_s: float
    per_tensor_s: float = 0.0

    def seconds(self, num_params: int, num_tensors: int = 0) -> float:
        return self.per_step_s + self.per_param_s * num_params + self.per_tensor_s * num_tensors


def ring_s(steps: int, num_bytes: float, num_ranks: int, latency_s: float, bytes_per_s: float) -> float:
    """``steps`` ring steps of ``num_bytes / num_ranks`` each (Patarasuk & Yuan, JPDC 2009): an all-reduce
    is ``2 (k - 1)`` of them, a reduce-scatter or an all-gather ``k - 1``. Zero for one rank or no bytes."""
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    return steps * (latency_s + num_bytes / num_ranks / bytes_per_s)


@dataclass(frozen=True)
class Calibration:
    device_kind: str
    """``cpu`` or ``cuda``: a calibration is refused for a plan on another kind of device."""
    backend: str
    """``gloo`` or ``nccl``."""
    num_ranks: int
    """Ranks it was measured with (the co-location factor depends on it)."""
    threads_per_rank: int
    """CPU: torch intra-op threads of each rank (profile with ``--threads`` equal to this)."""
    p2p_latency_s: float
    """One-way latency of one point-to-point message (the intercept of the fitted line)."""
    p2p_bytes_per_s: float
    """One-way bandwidth (the inverse slope)."""
    action_overhead_s: dict[str, float]
    """Per schedule name: what each compute action costs beyond its compute."""
    optimizer: dict[str, OptimizerCost]
    """Per optimizer name (``adam``, ``sgd``)."""
    colocation_factor: float
    """Compute time of an action inside a running pipeline / its time profiled alone (>= about 1); the
    simulator applies it to every action of a pipeline of two or more ranks."""
    source: str = "measured"
    """``measured`` (``pipeplan calibrate``), ``refit`` (``pipeplan tune``) or ``estimate`` (first principles)."""
    multi_stage_overhead_s: dict[str, float] = field(default_factory=dict)
    """Per schedule that runs one stage per rank or several (``zero-bubble``): the overhead per action of its plans
    with several, where a run of such a plan measured it (planner/runtime/model_cost.py); else
    :attr:`action_overhead_s` holds for both. A rank with four stages runs four times the actions, each on a
    quarter of the layers, and each pays more than a single stage's, so one overhead cannot serve both."""
    action_overhead_by_microbatches_s: dict[str, dict[int, float]] = field(default_factory=dict)
    """Per schedule whose plans ran at several micro-batch counts (planner/runtime/model_cost.py): the overhead
    per action at each count. A plan at another count takes the line between the two nearest (the nearest's value
    beyond them); :attr:`action_overhead_s` holds the value at the count the 1F1B anchor ran. What an action pays
    beyond its compute moves with the micro-batch count, so an overhead learned at one count mispredicts another."""
    multi_stage_overhead_by_microbatches_s: dict[str, dict[int, float]] = field(default_factory=dict)
    """As :attr:`action_overhead_by_microbatches_s`, for :attr:`multi_stage_overhead_s`."""
    colocation_factor_by_micro_batch_size: dict[int, float] = field(default_factory=dict)
    """Per micro-batch size a run of the model measured (planner/runtime/model_cost.py): the co-location factor at
    that size. A size between two takes the line between them, one beyond them the nearest's; without entries
    :attr:`colocation_factor` holds for every size. How much slower compute runs beside the other rank depends on
    the size, so a factor learned at one size mispredicts the others."""
    transfer_compute_s_per_byte: float = 0.0
    """Compute a rank loses per byte it sends or receives across ranks: on CPU gloo copies each message on the
    ranks' own cores (``pipeplan calibrate`` times torch's 1F1B with stages that pass a 4 MiB tensor on against
    the same without it), so a plan that sends more bytes computes more slowly than its profile alone says.
    0: not modelled (CUDA: NCCL's copies run beside the compute stream)."""
    units_together_ratio: float | None = None
    """Learned from runs of a model (planner/runtime/model_cost.py): the model's units timed in the ranks with every
    rank at once, over the same units timed alone, between the steps of the run the co-location factor was learned
    from. The co-location factor holds for the ranks' contention at that moment; ``verify`` sets the same ratio,
    timed in its own run, against this one (docs/cost-model.md, "The machine's speed"). None: not measured."""
    notes: dict[str, Any] = field(default_factory=dict, hash=False)
    """Where and how it was measured (host, date, torch version, load) and the raw samples."""

    def __post_init__(self) -> None:
        numbers = [
            self.p2p_latency_s,
            self.transfer_compute_s_per_byte,
            *self.action_overhead_s.values(),
            *self.multi_stage_overhead_s.values(),
        ]
        for table in (self.action_overhead_by_microbatches_s, self.multi_stage_overhead_by_microbatches_s):
            numbers += [v for by_count in table.values() for v in by_count.values()]
            if any(m < 1 for by_count in table.values() for m in by_count):
                raise CalibrationError("invalid calibration: micro-batch counts must be >= 1")
        if any(b < 1 for b in self.colocation_factor_by_micro_batch_size):
            raise CalibrationError("invalid calibration: micro-batch sizes must be >= 1")
        numbers += [v for o in self.optimizer.values() for v in (o.per_param_s, o.per_step_s, o.per_tensor_s)]
        if not all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in numbers):
            raise CalibrationError(f"invalid calibration: times must be finite and >= 0, got {numbers}")
        positive = (self.p2p_bytes_per_s, self.colocation_factor, *self.colocation_factor_by_micro_batch_size.values())
        if self.units_together_ratio is not None:
            positive += (self.units_together_ratio,)
        if not all(math.isfinite(v) and v > 0 for v in positive):
            raise CalibrationError(
                f"invalid calibration: bandwidth and co-location factor must be positive, got {positive}"
            )
        if self.num_ranks < 1 or self.threads_per_rank < 1:
            raise CalibrationError("invalid calibration: num_ranks and threads_per_rank must be >= 1")

    def check_device(self, device_kind: str) -> None:
        """Refuse a calibration made on another kind of device or backend than the plan's."""
        backend = BACKEND_OF_DEVICE.get(device_kind)
        if self.device_kind != device_kind or self.backend != backend:
            raise CalibrationError(
                f"the calibration was measured on {self.device_kind}/{self.backend} but the profile is for "
                f"{device_kind}/{backend}: run `pipeplan calibrate --device {device_kind}` on that machine"
            )

    def overhead_for(self, schedule: Schedule, virtual_stages: int = 1, num_microbatches: int | None = None) -> float:
        """Per-action overhead of ``schedule`` with ``virtual_stages`` stages per rank and ``num_microbatches``
        micro-batches (None: at the count it was learned at); an unmeasured schedule takes the largest measured
        value."""
        if virtual_stages > 1 and schedule.value in self.multi_stage_overhead_s:
            values, by_counts = self.multi_stage_overhead_s, self.multi_stage_overhead_by_microbatches_s
        elif schedule.value in self.action_overhead_s:
            values, by_counts = self.action_overhead_s, self.action_overhead_by_microbatches_s
        else:
            return max(self.action_overhead_s.values(), default=0.0)
        by_count = by_counts.get(schedule.value)
        if by_count and num_microbatches is not None:
            return _along(by_count, num_microbatches)
        return values[schedule.value]

    def colocation_for(self, micro_batch_size: int | None = None) -> float:
        """The co-location factor at ``micro_batch_size`` (None: :attr:`colocation_factor`)."""
        if not self.colocation_factor_by_micro_batch_size or micro_batch_size is None:
            return self.colocation_factor
        return _along(self.colocation_factor_by_micro_batch_size, micro_batch_size)

    @property
    def lowest_colocation_factor(self) -> float:
        """The smallest co-location factor at any size: what a lower bound on a step may assume."""
        return min([self.colocation_factor, *self.colocation_factor_by_micro_batch_size.values()])

    @property
    def learned_model(self) -> dict[str, Any] | None:
        """``notes.model``: the model whose runs this calibration was refit from (``calibrate --model``,
        ``tune``), with its ``name`` and ``fingerprint``; None for the machine's constants alone."""
        note = self.notes.get("model")
        return note if isinstance(note, dict) else None

    def learned_from(self, name: str, fingerprint: str, **details: Any) -> Calibration:
        """This calibration, marked as refit from runs of the model ``name`` (its profile's fingerprint)."""
        return replace(self, notes={**self.notes, "model": {"name": name, "fingerprint": fingerprint, **details}})

    def allreduce_s(self, num_bytes: int, num_ranks: int) -> float:
        """Ring all-reduce of ``num_bytes`` over ``num_ranks`` on the calibrated link."""
        return ring_s(2 * (num_ranks - 1), num_bytes, num_ranks, self.p2p_latency_s, self.p2p_bytes_per_s)

    def swap_s(self, num_bytes: int) -> float:
        """Two ranks exchanging ``num_bytes`` each way at once (a tied weight's gradient: planner/runtime/apply.py's
        ``_sum_across``): one message's time on the calibrated link."""
        return self.p2p_latency_s + num_bytes / self.p2p_bytes_per_s

    def optimizer_s(self, optimizer: str, num_params: int, num_tensors: int = 0) -> float:
        cost = self.optimizer.get(optimizer)
        if cost is None:
            raise CalibrationError(
                f"the calibration has no optimizer {optimizer!r} (has: {', '.join(sorted(self.optimizer))})"
            )
        return cost.seconds(num_params, num_tensors)

    def runtime_terms(
        self,
        schedule: Schedule,
        step_tail_s: tuple[float, ...],
        tail_groups: tuple[tuple[int, ...], ...] = (),
        virtual_stages: int = 1,
        num_microbatches: int | None = None,
        micro_batch_size: int | None = None,
    ) -> RuntimeTerms:
        return RuntimeTerms(
            action_overhead_s=self.overhead_for(schedule, virtual_stages, num_microbatches),
            step_tail_s=step_tail_s,
            compute_scale=self.colocation_for(micro_batch_size),
            tail_groups=tail_groups,
            transfer_compute_s_per_byte=self.transfer_compute_s_per_byte,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CALIBRATION_FORMAT,
            "version": CALIBRATION_VERSION,
            "device_kind": self.device_kind,
            "backend": self.backend,
            "num_ranks": self.num_ranks,
            "threads_per_rank": self.threads_per_rank,
            "p2p_latency_s": self.p2p_latency_s,
            "p2p_bytes_per_s": self.p2p_bytes_per_s,
            "transfer_compute_s_per_byte": self.transfer_compute_s_per_byte,
            "action_overhead_s": dict(sorted(self.action_overhead_s.items())),
            "optimizer": {k: asdict(v) for k, v in sorted(self.optimizer.items())},
            "colocation_factor": self.colocation_factor,
            **(
                {"multi_stage_overhead_s": dict(sorted(self.multi_stage_overhead_s.items()))}
                if self.multi_stage_overhead_s
                else {}
            ),
            **{
                name: {k: {str(m): v for m, v in sorted(by.items())} for k, by in sorted(table.items())}
                for name, table in (
                    ("action_overhead_by_microbatches_s", self.action_overhead_by_microbatches_s),
                    ("multi_stage_overhead_by_microbatches_s", self.multi_stage_overhead_by_microbatches_s),
                )
                if table
            },
            **(
                {
                    "colocation_factor_by_micro_batch_size": {
                        str(b): v for b, v in sorted(self.colocation_factor_by_micro_batch_size.items())
                    }
                }
                if self.colocation_factor_by_micro_batch_size
                else {}
            ),
            **({"units_together_ratio": self.units_together_ratio} if self.units_together_ratio is not None else {}),
            "source": self.source,
            "notes": self.notes,
        }


@cache
def _schema() -> dict[str, Any]:
    return json.loads(resources.files("planner").joinpath("calibration.schema.json").read_text())


def calibration_from_dict(data: Any) -> Calibration:
    """Validate ``data`` (parsed JSON) and build a :class:`Calibration`; raise :class:`CalibrationError`."""
    check_document(
        data, _schema(), error=CalibrationError, kind="calibration", fmt=CALIBRATION_FORMAT, version=CALIBRATION_VERSION
    )
    return Calibration(
        device_kind=data["device_kind"],
        backend=data["backend"],
        num_ranks=data["num_ranks"],
        threads_per_rank=data["threads_per_rank"],
        p2p_latency_s=float(data["p2p_latency_s"]),
        p2p_bytes_per_s=float(data["p2p_bytes_per_s"]),
        transfer_compute_s_per_byte=float(data.get("transfer_compute_s_per_byte", 0.0)),
        action_overhead_s={k: float(v) for k, v in data["action_overhead_s"].items()},
        optimizer={
            k: OptimizerCost(float(v["per_param_s"]), float(v["per_step_s"]), float(v.get("per_tensor_s", 0.0)))
            for k, v in data["optimizer"].items()
        },
        colocation_factor=float(data["colocation_factor"]),
        multi_stage_overhead_s={k: float(v) for k, v in data.get("multi_stage_overhead_s", {}).items()},
        action_overhead_by_microbatches_s=_tables(data.get("action_overhead_by_microbatches_s", {})),
        multi_stage_overhead_by_microbatches_s=_tables(data.get("multi_stage_overhead_by_microbatches_s", {})),
        colocation_factor_by_micro_batch_size={
            int(b): float(v) for b, v in data.get("colocation_factor_by_micro_batch_size", {}).items()
        },
        units_together_ratio=float(data["units_together_ratio"]) if "units_together_ratio" in data else None,
        source=data.get("source", "measured"),
        notes=dict(data.get("notes", {})),
    )


def _tables(data: dict[str, dict[str, float]]) -> dict[str, dict[int, float]]:
    return {k: {int(m): float(v) for m, v in by.items()} for k, by in data.items()}


def _along(by_key: dict[int, float], key: int) -> float:
    """The value at ``key`` (a micro-batch count or size) on the line through the two nearest keys; the nearest's
    beyond them."""
    keys = sorted(by_key)
    if key <= keys[0]:
        return by_key[keys[0]]
    if key >= keys[-1]:
        return by_key[keys[-1]]
    hi = next(k for k in keys if k >= key)
    lo = max(k for k in keys if k < hi)
    share = (key - lo) / (hi - lo)
    return by_key[lo] + share * (by_key[hi] - by_key[lo])


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; every failure is a one-line :class:`CalibrationError`."""
    return load_document(path, CalibrationError, "calibration", calibration_from_dict)


def save_calibration(calibration: Calibration, path: str | Path) -> None:
    write_json_atomic(path, calibration.to_dict())


def shipped_calibration(device_kind: str) -> Calibration:
    """The calibration that ships with pipeplan for ``device_kind`` (docs/calibration-format.md says how
    each was obtained: cpu/gloo measured by ``pipeplan calibrate`` on a 2-core machine, cuda/nccl estimated)."""
    name = {"cpu": "cpu-gloo.json", "cuda": "cuda-nccl.json"}.get(device_kind)
    if name is None:
        raise CalibrationError(f"no shipped calibration for device {device_kind!r}: run `pipeplan calibrate`")
    text = resources.files("planner").joinpath("calibrations", name).read_text()
    return calibration_from_dict(json.loads(text))


def format_calibration(calibration: Calibration) -> str:
    """A calibration's terms, one per line (``pipeplan calibrate``)."""
    c = calibration
    lines = [
        f"calibration on {c.device_kind}/{c.backend}, {c.num_ranks} ranks x {c.threads_per_rank} threads",
        f"  point-to-point: {c.p2p_latency_s * 1e6:.0f} us + bytes / {c.p2p_bytes_per_s / 1e9:.2f} GB/s",
        f"  compute lost to transfers: {c.transfer_compute_s_per_byte * 1e9:.2f} ns per byte sent or received",
    ]
    for name, seconds in sorted(c.action_overhead_s.items()):
        by_count = _at_counts(c.action_overhead_by_microbatches_s.get(name, {}))
        lines.append(f"  overhead per action, {name:<17} {seconds * 1e3:.3f} ms{by_count}")
    for name, seconds in sorted(c.multi_stage_overhead_s.items()):
        by_count = _at_counts(c.multi_stage_overhead_by_microbatches_s.get(name, {}))
        lines.append(f"  overhead per action, {name + ', v > 1':<17} {seconds * 1e3:.3f} ms{by_count}")
    for name, cost in sorted(c.optimizer.items()):
        lines.append(f"  {name} step: {cost.per_step_s * 1e3:.3f} ms + {cost.per_param_s * 1e9:.2f} ns per parameter")
    by_size = ", ".join(f"{v:.3f} at b = {b}" for b, v in sorted(c.colocation_factor_by_micro_batch_size.items()))
    lines.append(
        f"  co-location factor: {c.colocation_factor:.3f} (compute inside the pipeline / profiled alone)"
        + (f"; {by_size}" if by_size else "")
    )
    if c.units_together_ratio is not None:
        lines.append(
            f"  units timed with every rank at once: {c.units_together_ratio:.3f}x alone, while it was learned"
        )
    return "\n".join(lines)


def _at_counts(by_count: dict[int, float]) -> str:
    """``  (1.000 at 2, 3.000 at 4)``: milliseconds per action at each micro-batch count; empty without counts."""
    if not by_count:
        return ""
    return "  (" + ", ".join(f"{v * 1e3:.3f} at {m}" for m, v in sorted(by_count.items())) + ")"
