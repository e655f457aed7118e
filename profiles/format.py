"""The profile data model (format ``pipeplan.profile``, version 1) and its JSON round-trip.

A profile is what pipeplan measured of one model on one device, unit by unit and for several
micro-batch sizes. Every per-size array is aligned with ``micro_batch_sizes``. Field names carry
their units: ``_s`` seconds, ``_bytes`` bytes, ``flops`` multiply-adds (fvcore's convention).
See docs/profile-format.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import ProfileError, shorten
from planner.fileio import check_document, load_document, write_json_atomic
from planner.limits import MAX_GLOBAL_BATCH, MAX_PROFILED_SIZES, MAX_SECONDS, MAX_TENSORS, MAX_UNITS

__all__ = [
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "ModelInfo",
    "DeviceInfo",
    "UnitProfile",
    "TensorFlow",
    "WholeModel",
    "PieceOverhead",
    "LossMemory",
    "Resume",
    "ThreadScaling",
    "Profile",
    "load_profile",
    "save_profile",
    "profile_from_dict",
]

PROFILE_FORMAT = "pipeplan.profile"
PROFILE_VERSION = 1


@dataclass(frozen=True)
class ModelInfo:
    name: str
    fingerprint: str
    """sha256 of the module structure and parameter names/shapes/dtypes (see profiles.fingerprint)."""
    param_count: int
    """Distinct parameters: a tied weight is counted once."""
    param_bytes: int = 0


@dataclass(frozen=True)
class DeviceInfo:
    kind: str
    """``cpu`` or ``cuda``."""
    name: str
    memory_bytes: int
    """Total memory of the device (CPU: the machine's RAM)."""
    dtype: str
    torch_version: str


@dataclass(frozen=True)
class UnitProfile:
    name: str
    """Fully qualified module name (or a synthetic name such as ``lm_head+loss``)."""
    type: str
    param_count: int
    param_bytes: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    flops: tuple[int, ...]
    """Forward multiply-adds counted by fvcore (one per MAC)."""
    output_bytes: tuple[int, ...]
    saved_bytes: tuple[int, ...]
    """Bytes autograd saves for backward, deduplicated by storage, parameters excluded."""
    peak_bytes: tuple[int, ...] | None = None
    """CUDA only: allocator peak of forward+backward above the memory held before it."""
    tied_params: tuple[str, ...] = ()
    """Names of parameters this unit shares with another unit (counted at their first user)."""
    tied_param_count: int = 0
    param_tensor_count: int = 0
    """Parameter tensors the unit's stage holds (tied copies included): the optimizer pays per tensor.
    Optional: 0 where a profile does not record it."""
    """Parameters this unit uses that an earlier unit already counts; a pipeline stage holds a copy."""
    backward_input_s: tuple[float, ...] | None = None
    """The backward split as zero-bubble schedules run it: I, torch's ``stage_backward_input`` (input
    gradients; 0 for a unit whose inputs need none). Optional: None in profiles made before it."""
    backward_weight_s: tuple[float, ...] | None = None
    """W, torch's ``stage_backward_weight`` after I (weight gradients). Optional, as above."""
    weight_grad_bytes: tuple[int, ...] | None = None
    """Gradients I keeps alive for W beyond the saved activations (which the kept graph also holds)."""
    held_bytes: tuple[int, ...] | None = None
    """Live tensor bytes a forward leaves alive until its backward: saved tensors and outputs, each storage once,
    inputs and parameters excluded (with the loss for the last unit). Optional: None in profiles made before."""
    transient_bytes: tuple[int, ...] | None = None
    """The backward's peak of live tensor bytes above what was live when it began (gradients in flight, weight
    gradients before they are accumulated, temporaries), in the steady state of a training step. Optional."""
    input_transient_bytes: tuple[int, ...] | None = None
    """As ``transient_bytes`` for the input-gradient action I of a split backward (``stage_backward_input``)."""
    weight_transient_bytes: tuple[int, ...] | None = None
    """As ``transient_bytes`` for the weight-gradient action W after it (``stage_backward_weight``)."""
    largest_param_bytes: int = 0
    """Bytes of the unit's largest parameter tensor (optional, 0 when absent): a CPU optimizer step's temporaries
    are made one parameter at a time."""

    @property
    def has_split(self) -> bool:
        """True when the profile measured the I/W split of this unit's backward."""
        return self.backward_input_s is not None and self.backward_weight_s is not None

    def weight_share(self, size_index: int) -> float:
        """W / (I + W) at one size: the part of ``backward_s`` a split schedule runs as W (0 unmeasured)."""
        if not self.has_split:
            return 0.0
        i, w = self.backward_input_s[size_index], self.backward_weight_s[size_index]  # type: ignore[index]
        return w / (i + w) if i + w > 0 else 0.0


@dataclass(frozen=True)
class TensorFlow:
    producer: int
    """Index of the producing unit, -1 for the model input."""
    consumers: tuple[int, ...]
    """Indices of the later units that read it, ascending."""
    bytes: tuple[int, ...]
    dtype: str = "float32"
    needs_grad: bool = True
    """False for integer/bool tensors and for tensors that do not require grad: no gradient goes back."""
    name: str = ""

    @property
    def last_consumer(self) -> int:
        return self.consumers[-1]


@dataclass(frozen=True)
class WholeModel:
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]


@dataclass(frozen=True)
class PieceOverhead:
    """The fixed cost of timing one piece: a trivial piece (one multiply) through the same harness.

    Every unit's time includes it once, and so does the whole model: a stage of k units measured
    unit by unit counts it k times where the stage, run as one piece, pays it once.
    """

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]


@dataclass(frozen=True)
class LossMemory:
    """What the loss holds, per micro-batch size: its target (one micro-batch's ``target`` bytes) and the storage
    of the loss's output (``kept_bytes``), which torch's schedules keep for every micro-batch until the step ends
    (``_internal_losses``): 4 bytes for a cross-entropy, the whole output's size for a CPU ``mse_loss``, whose 0-d
    result keeps the storage of the elementwise loss it was reduced from."""

    target_bytes: tuple[int, ...]
    kept_bytes: tuple[int, ...]


@dataclass(frozen=True)
class Resume:
    """What the whole model's forward and backward cost more after an idle gap than back to back
    (profiles/resume.py): per micro-batch size, one value per gap in ``gaps_s``."""

    gaps_s: tuple[float, ...]
    forward_s: tuple[tuple[float, ...], ...]
    backward_s: tuple[tuple[float, ...], ...]

    def curve(self, size_index: int) -> tuple[tuple[float, float, float], ...]:
        """``(gap, forward extra, backward extra)`` points at one size, the simulator's input."""
        return tuple(
            zip(self.gaps_s, self.forward_s[size_index], self.backward_s[size_index], strict=True)  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class ThreadScaling:
    """A CPU profile's times at other intra-op thread counts (profiles/threads.py): per count in ``threads``,
    the whole model's forward + backward there / as profiled (``factor[i][j]``, size j), and the speed
    reference's time there (``reference_s[i]``)."""

    threads: tuple[int, ...]
    factor: tuple[tuple[float, ...], ...]
    reference_s: tuple[float, ...]
    cores: int | None = None
    """The machine's cores, the threads a single rank gets (profiles/threads.py times a pipeline's ranks' counts
    and the profiled one); None in profiles made before it, whose ``threads`` begin with it."""


def _interpolated(scaling: ThreadScaling, threads: int) -> tuple[tuple[float, ...], float]:
    """The factors per size and the reference time at ``threads``: measured, or linear between the two
    measured counts around it (the nearest one outside them)."""
    points = sorted(zip(scaling.threads, scaling.factor, scaling.reference_s, strict=True))
    below = [p for p in points if p[0] <= threads] or points[:1]
    above = [p for p in points if p[0] >= threads] or points[-1:]
    (t0, f0, r0), (t1, f1, r1) = below[-1], above[0]
    w = 0.0 if t1 == t0 else (threads - t0) / (t1 - t0)
    w = min(1.0, max(0.0, w))
    return tuple(a + w * (b - a) for a, b in zip(f0, f1, strict=True)), r0 + w * (r1 - r0)


@dataclass(frozen=True)
class Profile:
    model: ModelInfo
    device: DeviceInfo
    micro_batch_sizes: tuple[int, ...]
    units: tuple[UnitProfile, ...]
    tensors: tuple[TensorFlow, ...]
    whole_model: WholeModel
    settings: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    piece_overhead: PieceOverhead | None = None
    """Optional (profiles made before it lack it)."""
    resume: Resume | None = None
    """Optional: absent in meta profiles and in profiles made before it (the simulator then adds nothing)."""
    thread_scaling: ThreadScaling | None = None
    """Optional: CPU profiles made with it; :meth:`at_threads` reads it."""
    loss: LossMemory | None = None
    """Optional: profiles made before it lack it (the memory model then leaves the target and the kept losses out)."""
    pipeline_calibration: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    """Optional: the calibration learned from a short run of this model as a 2-rank 1F1B pipeline right after
    it was profiled (``pipeplan profile`` on a CPU; planner/runtime/model_cost.py), or the device model's
    (``--device-model``: profiles/modelled.py); ``plan`` uses it by default. A calibration document
    (docs/calibration-format.md), read by the planner."""

    @property
    def num_units(self) -> int:
        return len(self.units)

    def size_index(self, micro_batch_size: int) -> int:
        try:
            return self.micro_batch_sizes.index(micro_batch_size)
        except ValueError:
            raise ProfileError(
                f"micro-batch size {micro_batch_size} was not profiled (profiled: "
                f"{', '.join(map(str, self.micro_batch_sizes))}): profile it, e.g. pipeplan profile "
                f"{self.model.name} --micro-batch-sizes "
                f"{','.join(map(str, sorted({*self.micro_batch_sizes, micro_batch_size})))} --out PROFILE.json"
            ) from None

    def unit_sum_s(self, size_index: int) -> float:
        return sum(u.forward_s[size_index] + u.backward_s[size_index] for u in self.units)

    def whole_s(self, size_index: int) -> float:
        return self.whole_model.forward_s[size_index] + self.whole_model.backward_s[size_index]

    def paired_unit_sum_ratio(self, size_index: int) -> float | None:
        """The median over the profiling rounds of the unit sum over the whole model timed in the same round
        (``settings.unit_sum_ratio``); None where not recorded."""
        paired = self.settings.get("unit_sum_ratio")
        if isinstance(paired, list) and len(paired) == len(self.micro_batch_sizes):
            return float(paired[size_index])
        return None

    def unit_sum_error(self, size_index: int) -> float:
        """How far the unit sum is from the whole model, as a fraction of it: the paired ratio less 1, where
        recorded (:meth:`paired_unit_sum_ratio`: a ratio of times taken together holds while the machine's speed
        moves); else the medians' ratio, less 1."""
        paired = self.paired_unit_sum_ratio(size_index)
        if paired is not None:
            return paired - 1.0
        whole = self.whole_s(size_index)
        return self.unit_sum_s(size_index) / whole - 1.0 if whole > 0 else 0.0

    def overhead_s(self, size_index: int) -> float:
        """Forward + backward harness overhead of one piece; 0 when the profile did not measure it."""
        o = self.piece_overhead
        return 0.0 if o is None else o.forward_s[size_index] + o.backward_s[size_index]

    @property
    def threads(self) -> int | None:
        """The intra-op threads the units were timed with (CPU profiles), None where not recorded."""
        threads = self.settings.get("threads")
        return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None

    def for_ranks(self, num_ranks: int) -> Profile:
        """This profile as each of ``num_ranks`` ranks on the profiled machine computes: a CPU rank gets
        ``cores // num_ranks`` intra-op threads (planner/runtime/launch.py), and :meth:`at_threads` times them (as
        profiled where the profile did not time that count: :meth:`timed_for_ranks`)."""
        threads = self.rank_threads(num_ranks)
        return self if threads is None else self.at_threads(threads)

    def rank_threads(self, num_ranks: int) -> int | None:
        """The intra-op threads each of ``num_ranks`` ranks on the profiled machine gets; None where the profile
        records no thread scaling (a GPU profile)."""
        scaling = self.thread_scaling
        if scaling is None:
            return None
        return max(1, (scaling.cores or max(scaling.threads)) // num_ranks)

    def timed_for_ranks(self, num_ranks: int) -> bool:
        """Whether this profile timed (or lies between counts that timed) the threads each of ``num_ranks`` ranks
        on its machine gets; always where it records no thread scaling (a GPU profile)."""
        scaling, threads = self.thread_scaling, self.rank_threads(num_ranks)
        return scaling is None or threads is None or threads <= max(scaling.threads)

    def at_threads(self, threads: int) -> Profile:
        """This profile as if timed with ``threads`` intra-op threads: every unit's and the whole model's times
        scaled by the measured ratio at each size (between two measured counts, interpolated), and the speed
        reference as timed there. Unchanged where the profile was timed so or measured no ratios (a GPU
        profile, one made before them)."""
        scaling = self.thread_scaling
        if scaling is None or threads == self.threads:
            return self
        factor, reference = _interpolated(scaling, threads)

        def scaled(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
            return None if values is None else tuple(v * f for v, f in zip(values, factor, strict=True))

        units = tuple(
            replace(
                u,
                forward_s=scaled(u.forward_s),
                backward_s=scaled(u.backward_s),
                backward_input_s=scaled(u.backward_input_s),
                backward_weight_s=scaled(u.backward_weight_s),
            )
            for u in self.units
        )
        whole = WholeModel(scaled(self.whole_model.forward_s), scaled(self.whole_model.backward_s))  # type: ignore[arg-type]
        settings = {**self.settings, "threads": threads, "timed_threads": self.threads}
        if reference > 0:
            settings["reference_s"] = reference
        return replace(self, units=units, whole_model=whole, settings=settings)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        settings = data.pop("settings")
        for key in ("piece_overhead", "resume", "thread_scaling", "loss", "pipeline_calibration"):
            if data[key] is None:  # an optional field: absent, as in profiles made before it
                del data[key]
        if "thread_scaling" in data and data["thread_scaling"]["cores"] is None:
            del data["thread_scaling"]["cores"]
        for unit in data["units"]:
            for key in _OPTIONAL_PER_SIZE:
                if unit[key] is None:
                    del unit[key]
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **data, "settings": settings}


_OPTIONAL_PER_SIZE = (
    "backward_input_s",
    "backward_weight_s",
    "weight_grad_bytes",
    "held_bytes",
    "transient_bytes",
    "input_transient_bytes",
    "weight_transient_bytes",
)
"""Per-size unit fields that version 1 gained later: absent in older profiles, ignored by older readers."""


@cache
def _schema() -> dict[str, Any]:
    return json.loads(resources.files("profiles").joinpath("profile.schema.json").read_text())


def _fail(message: str) -> ProfileError:
    return ProfileError(f"invalid profile: {message}")


def _check_sizes(data: dict[str, Any]) -> None:
    """Bounds checked before the JSON Schema, so that an oversized profile is refused at once."""
    for key, limit in (("units", MAX_UNITS), ("tensors", MAX_TENSORS), ("micro_batch_sizes", MAX_PROFILED_SIZES)):
        value = data.get(key)
        if isinstance(value, list) and len(value) > limit:
            raise _fail(f"{len(value):,} {key}, over pipeplan's limit of {limit:,}")


def _check_meaning(data: dict[str, Any]) -> None:
    """What the planner relies on beyond the schema: names unique, arrays aligned, data flowing forward."""
    sizes = data["micro_batch_sizes"]
    n_sizes = len(sizes)
    if len(set(sizes)) != n_sizes:
        raise _fail(f"micro_batch_sizes has duplicates: {shorten(str(sizes))}")
    if max(sizes) > MAX_GLOBAL_BATCH:
        raise _fail(f"micro-batch size {max(sizes)} is over pipeplan's limit of {MAX_GLOBAL_BATCH:,}")
    n_units = len(data["units"])
    seen: dict[str, int] = {}
    per_size = ("forward_s", "backward_s", "flops", "output_bytes", "saved_bytes")
    for i, unit in enumerate(data["units"]):
        name = unit["name"]
        if not name.strip():
            raise _fail(f"units[{i}] has an empty name")
        if name in seen:
            raise _fail(f"units[{seen[name]}] and units[{i}] are both named {shorten(name)}: unit names must be unique")
        seen[name] = i
        optional = tuple(k for k in ("peak_bytes", *_OPTIONAL_PER_SIZE) if unit.get(k) is not None)
        for key in per_size + optional:
            if len(unit[key]) != n_sizes:
                raise _fail(f"units[{i}].{key} has {len(unit[key])} values, micro_batch_sizes has {n_sizes}")
        if ("backward_input_s" in unit) != ("backward_weight_s" in unit):
            raise _fail(f"units[{i}] has only one of backward_input_s and backward_weight_s: give both or neither")
        for key in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s"):
            if any(t > MAX_SECONDS for t in unit.get(key, ())):
                raise _fail(
                    f"units[{i}].{key} holds {max(unit[key]):.3g} s, over pipeplan's limit of {MAX_SECONDS:.0e} s"
                )
    for i, tensor in enumerate(data["tensors"]):
        if len(tensor["bytes"]) != n_sizes:
            raise _fail(f"tensors[{i}].bytes has {len(tensor['bytes'])} values, expected {n_sizes}")
        producer, consumers = tensor["producer"], tensor["consumers"]
        if producer >= n_units or any(c >= n_units for c in consumers):
            raise _fail(f"tensors[{i}] names a unit index >= {n_units}")
        if any(c <= producer for c in consumers):
            raise _fail(
                f"tensors[{i}] is produced by unit {producer} but consumed by unit "
                f"{min(consumers)}: a producer must come strictly before its consumers"
            )
        if len(set(consumers)) != len(consumers):
            raise _fail(f"tensors[{i}] lists a consumer twice: {shorten(str(consumers))}")
    for block in ("whole_model", "piece_overhead"):
        for key in ("forward_s", "backward_s") if block in data else ():
            values = data[block][key]
            if len(values) != n_sizes:
                raise _fail(f"{block}.{key} is not aligned with micro_batch_sizes")
            if any(t > MAX_SECONDS for t in values):
                raise _fail(f"{block}.{key} holds {max(values):.3g} s, over pipeplan's limit of {MAX_SECONDS:.0e} s")
    for key in ("target_bytes", "kept_bytes") if "loss" in data else ():
        if len(data["loss"][key]) != n_sizes:
            raise _fail(f"loss.{key} is not aligned with micro_batch_sizes")
    if "resume" in data:
        gaps = data["resume"]["gaps_s"]
        if list(gaps) != sorted(set(gaps)):
            raise _fail("resume.gaps_s must be increasing")
        for key in ("forward_s", "backward_s"):
            rows = data["resume"][key]
            if len(rows) != n_sizes or any(len(row) != len(gaps) for row in rows):
                raise _fail(f"resume.{key} must hold one value per gap for each micro-batch size")
            if any(t > MAX_SECONDS for row in rows for t in row):
                raise _fail(f"resume.{key} holds a time over pipeplan's limit of {MAX_SECONDS:.0e} s")
    if "thread_scaling" in data:
        scaling = data["thread_scaling"]
        counts = scaling["threads"]
        if len(set(counts)) != len(counts) or len(scaling["reference_s"]) != len(counts):
            raise _fail("thread_scaling.threads must be distinct, with one reference_s each")
        if len(scaling["factor"]) != len(counts) or any(len(row) != n_sizes for row in scaling["factor"]):
            raise _fail("thread_scaling.factor must hold one value per micro-batch size for each thread count")
        if any(f > 1e6 for row in scaling["factor"] for f in row):
            raise _fail("thread_scaling.factor holds a ratio over 1e6")
        if scaling.get("cores", max(counts)) < max(counts):
            raise _fail("thread_scaling.cores must be at least every count in thread_scaling.threads")


def _validate(data: Any) -> None:
    if isinstance(data, dict):
        _check_sizes(data)
    check_document(data, _schema(), error=ProfileError, kind="profile", fmt=PROFILE_FORMAT, version=PROFILE_VERSION)
    _check_meaning(data)


def _ints(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(int(x) for x in values)


def _floats(values: list[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(float(x) for x in values)


def profile_from_dict(data: Any) -> Profile:
    """Validate ``data`` (parsed JSON) and build a :class:`Profile`; raise :class:`ProfileError`."""
    _validate(data)
    units = tuple(
        UnitProfile(
            name=u["name"],
            type=u["type"],
            param_count=u["param_count"],
            param_bytes=u["param_bytes"],
            forward_s=tuple(float(x) for x in u["forward_s"]),
            backward_s=tuple(float(x) for x in u["backward_s"]),
            flops=tuple(u["flops"]),
            output_bytes=tuple(u["output_bytes"]),
            saved_bytes=tuple(u["saved_bytes"]),
            peak_bytes=None if u.get("peak_bytes") is None else tuple(u["peak_bytes"]),
            tied_params=tuple(u.get("tied_params", ())),
            tied_param_count=u.get("tied_param_count", 0),
            param_tensor_count=u.get("param_tensor_count", 0),
            backward_input_s=_floats(u.get("backward_input_s")),
            backward_weight_s=_floats(u.get("backward_weight_s")),
            weight_grad_bytes=None if u.get("weight_grad_bytes") is None else tuple(u["weight_grad_bytes"]),
            held_bytes=None if u.get("held_bytes") is None else tuple(u["held_bytes"]),
            transient_bytes=None if u.get("transient_bytes") is None else tuple(u["transient_bytes"]),
            input_transient_bytes=_ints(u.get("input_transient_bytes")),
            weight_transient_bytes=_ints(u.get("weight_transient_bytes")),
            largest_param_bytes=u.get("largest_param_bytes", 0),
        )
        for u in data["units"]
    )
    tensors = tuple(
        TensorFlow(
            producer=t["producer"],
            consumers=tuple(sorted(t["consumers"])),
            bytes=tuple(t["bytes"]),
            dtype=t.get("dtype", "float32"),
            needs_grad=t.get("needs_grad", True),
            name=t.get("name", ""),
        )
        for t in data["tensors"]
    )
    m, d, w, o = data["model"], data["device"], data["whole_model"], data.get("piece_overhead")
    r, ts, lo = data.get("resume"), data.get("thread_scaling"), data.get("loss")
    return Profile(
        model=ModelInfo(m["name"], m["fingerprint"], m["param_count"], m.get("param_bytes", 0)),
        device=DeviceInfo(d["kind"], d["name"], d["memory_bytes"], d["dtype"], d["torch_version"]),
        micro_batch_sizes=tuple(data["micro_batch_sizes"]),
        units=units,
        tensors=tensors,
        whole_model=WholeModel(tuple(map(float, w["forward_s"])), tuple(map(float, w["backward_s"]))),
        settings=dict(data.get("settings", {})),
        piece_overhead=None
        if o is None
        else PieceOverhead(tuple(map(float, o["forward_s"])), tuple(map(float, o["backward_s"]))),
        resume=None
        if r is None
        else Resume(
            tuple(map(float, r["gaps_s"])),
            tuple(tuple(map(float, row)) for row in r["forward_s"]),
            tuple(tuple(map(float, row)) for row in r["backward_s"]),
        ),
        pipeline_calibration=data.get("pipeline_calibration"),
        thread_scaling=None
        if ts is None
        else ThreadScaling(
            tuple(ts["threads"]),
            tuple(tuple(map(float, row)) for row in ts["factor"]),
            tuple(map(float, ts["reference_s"])),
            ts.get("cores"),
        ),
        loss=None if lo is None else LossMemory(tuple(map(int, lo["target_bytes"])), tuple(map(int, lo["kept_bytes"]))),
    )


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; every failure is a one-line :class:`ProfileError`."""
    return load_document(path, ProfileError, "profile", profile_from_dict)


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` atomically (temp file + rename)."""
    write_json_atomic(path, profile.to_dict())
