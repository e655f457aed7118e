"""A GPU described by its published figures, for profiling a model on a device one does not have
(``pipeplan profile --device-model NAME|FILE.json``; :mod:`profiles.modelled`).

Each built-in is one set of constants per GPU, with its sources (docs/cost-model.md, "Device models"); a file of
the same fields (``pipeplan.device_model``, version 1) describes any other. Units are in the field names.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from planner.errors import UsageError, shorten
from planner.fileio import read_json

__all__ = [
    "DeviceModel",
    "DEVICE_MODELS",
    "device_model",
    "device_model_from_dict",
    "recorded_device_model",
    "DEVICE_MODEL_FORMAT",
]

DEVICE_MODEL_FORMAT = "pipeplan.device_model"

GIB = 2**30

WHOLE_FIELDS = ("memory_bytes", "matmul_half_size", "devices_per_node")
"""The fields that count things (bytes, a tile's width, GPUs): whole numbers."""


@dataclass(frozen=True)
class DeviceModel:
    """What the roofline of :mod:`profiles.modelled` needs of a GPU, and the links of its usual node."""

    name: str
    matmul_flops_per_s: float
    """Dense 16-bit (bf16/fp16) tensor-core peak, FLOP/s (datasheet)."""
    fp8_speedup: float
    """Dense fp8 peak over the 16-bit peak (1 where the GPU has no fp8 tensor cores)."""
    memory_bytes: int
    """HBM capacity."""
    memory_bytes_per_s: float
    """HBM bandwidth (datasheet)."""
    matmul_efficiency: float
    """The fraction of the peak the largest well-shaped matrix products reach (maximum achievable matmul
    FLOPS over the datasheet peak)."""
    matmul_half_size: int
    """A matrix dimension at which a product runs at half of ``matmul_efficiency`` along that dimension: a
    product of ``m x k`` by ``k x n`` runs at ``matmul_efficiency * prod(d / (d + matmul_half_size))``, so that
    small micro-batches and tensor-parallel slices fill fewer of the GPU's tiles."""
    memory_efficiency: float
    """The fraction of the HBM bandwidth element-wise kernels reach."""
    attention_efficiency: float
    """A flash-style attention kernel's forward rate as a fraction of the 16-bit peak (its backward does 2.5x
    the forward's work at the same rate)."""
    flash_attention: bool
    """Whether flash-style attention kernels run on this GPU (FlashAttention needs Ampere or later)."""
    kernel_s: float
    """The least time of one kernel (launch and tail), added to every modelled operation."""
    intra_node_bytes_per_s: float
    """NVLink per GPU, one direction (datasheet)."""
    inter_node_bytes_per_s: float
    """The network per GPU, one direction."""
    devices_per_node: int = 8
    link_latency_s: float = 1e-5
    group_link_shares: tuple[tuple[int, float], ...] = ()
    """Where a node's GPUs are not all joined through a switch: per size of a group of consecutive GPUs, the share
    of ``intra_node_bytes_per_s`` a ring of them gets (the links its worst-joined member has to the others, over
    all its links); a size not listed gets all of it (every NVSwitch node)."""
    nvlink_efficiency: float = 1.0
    """The share of ``intra_node_bytes_per_s`` NCCL's collectives get: NCCL's own topology model credits each
    NVLink with less than its datasheet rate (src/graph/topo.h, ``SMxx_NVLINK_BW``), and plans its rings by it."""

    @property
    def intra_node_ring_bytes_per_s(self) -> float:
        """NVLink per GPU, one direction, as a collective's ring gets it."""
        return self.intra_node_bytes_per_s * self.nvlink_efficiency

    def __post_init__(self) -> None:
        wrong = f"device model {self.name!r}: group_link_shares are [group size >= 2, share in (0, 1]] pairs"
        try:
            shares = tuple((int(g), float(s), g) for g, s in self.group_link_shares)
        except (TypeError, ValueError):  # not a list of pairs of numbers, as a file may give
            raise UsageError(wrong) from None
        if any(g != given or g < 2 or not 0 < s <= 1 for g, s, given in shares):
            raise UsageError(wrong)
        object.__setattr__(self, "group_link_shares", tuple((g, s) for g, s, _ in shares))
        if not isinstance(self.name, str) or not self.name:
            raise UsageError(f"a device model's name is a string, got {shorten(repr(self.name), 40)}")
        if not isinstance(self.flash_attention, bool):
            raise UsageError(f"device model {self.name!r}: flash_attention is true or false")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "flash_attention", "group_link_shares"):
                continue
            where = f"device model {self.name!r}: {f.name}"
            # A file's field of the wrong kind (a string, a list, null) is refused here, not met mid-roofline.
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise UsageError(f"{where} must be a number, got {shorten(repr(value), 40)}")
            if f.name in WHOLE_FIELDS:
                if value != int(value):
                    raise UsageError(f"{where} must be a whole number, got {value}")
                object.__setattr__(self, f.name, int(value))
            if value < 0 or (value == 0 and f.name != "kernel_s"):  # a kernel may cost nothing beyond its work
                raise UsageError(f"{where} must be positive, got {value}")
        if not 0 < self.matmul_efficiency <= 1 or not 0 < self.memory_efficiency <= 1:
            raise UsageError(f"device model {self.name!r}: efficiencies are fractions in (0, 1]")
        for name in ("attention_efficiency", "nvlink_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise UsageError(f"device model {self.name!r}: {name} is a fraction in (0, 1]")

    def as_dict(self) -> dict[str, Any]:
        fields_ = asdict(self)
        # A switched node's, or links taken at their datasheet rate: the field is left out of the file and profile.
        if not self.group_link_shares:
            del fields_["group_link_shares"]
        if self.nvlink_efficiency == 1.0:
            del fields_["nvlink_efficiency"]
        return {"format": DEVICE_MODEL_FORMAT, "version": 1, **fields_}


# One set of constants per GPU. Peaks, capacities and bandwidths are the datasheets'; matmul_efficiency is the
# measured maximum achievable matmul FLOPS over peak (stas00/ml-engineering, compute/accelerator, "Maximum
# Achievable Matmul FLOPS comparison table": A100 SXM 85.9 %, H100 SXM 80.1 %, GH200 83.0 %; GPUs it does not
# list take their architecture's neighbour, said in docs/cost-model.md); nvlink_efficiency is NCCL's per-link
# bandwidth over the link's datasheet 25 GB/s each way (50 for NVLink5): SM70 and SM80 20.0, SM90 20.6, SM100 40.1
# (NCCL, src/graph/topo.h); the rest is shared by all.
_SHARED = {
    "matmul_half_size": 128,  # one 128-wide tile of the tensor-core GEMMs cuBLAS picks for large products
    "memory_efficiency": 0.9,  # a copy reaches ~90 % of HBM bandwidth (STREAM-like measurements)
    "kernel_s": 5e-6,  # a kernel's launch and tail on a busy stream
}
_CHIPS: dict[str, DeviceModel] = {
    m.name: m
    for m in (
        DeviceModel(
            "v100-16gb",
            125e12,
            1.0,
            16 * GIB,
            900e9,
            0.85,
            attention_efficiency=0.4,
            flash_attention=False,
            intra_node_bytes_per_s=150e9,
            inter_node_bytes_per_s=12.5e9,
            # DGX-1's hybrid cube-mesh: six NVLinks a GPU, no switch; GPUs 0 and 1 share one link, and a GPU of the
            # first four has four links to the other three (docs/cost-model.md, "Device models").
            group_link_shares=((2, 1 / 6), (4, 4 / 6)),
            nvlink_efficiency=0.8,
            **_SHARED,
        ),
        DeviceModel(
            "a100-40gb",
            312e12,
            1.0,
            40 * GIB,
            1555e9,
            0.859,
            attention_efficiency=0.6,
            flash_attention=True,
            intra_node_bytes_per_s=300e9,
            inter_node_bytes_per_s=25e9,
            nvlink_efficiency=0.8,
            **_SHARED,
        ),
        DeviceModel(
            "a100-80gb",
            312e12,
            1.0,
            80 * GIB,
            2039e9,
            0.859,
            attention_efficiency=0.6,
            flash_attention=True,
            intra_node_bytes_per_s=300e9,
            inter_node_bytes_per_s=25e9,
            nvlink_efficiency=0.8,
            **_SHARED,
        ),
        DeviceModel(
            "h100-80gb",
            989.4e12,
            2.0,
            80 * GIB,
            3350e9,
            0.801,
            attention_efficiency=0.5,
            flash_attention=True,
            intra_node_bytes_per_s=450e9,
            inter_node_bytes_per_s=50e9,
            nvlink_efficiency=0.824,
            **_SHARED,
        ),
        DeviceModel(
            "h200",
            989.4e12,
            2.0,
            141 * 10**9,
            4800e9,
            0.83,
            attention_efficiency=0.5,
            flash_attention=True,
            intra_node_bytes_per_s=450e9,
            inter_node_bytes_per_s=50e9,
            nvlink_efficiency=0.824,
            **_SHARED,
        ),
        DeviceModel(
            "b200",
            2250e12,
            2.0,
            180 * 10**9,
            8000e9,
            0.801,
            attention_efficiency=0.5,
            flash_attention=True,
            intra_node_bytes_per_s=900e9,
            inter_node_bytes_per_s=50e9,
            nvlink_efficiency=0.802,
            **_SHARED,
        ),
    )
}

# Variants of those chips, as their datasheets describe them: the A800 and H800 are the A100's and H100's with NVLink
# cut to 400 GB/s (both ways together); the 32 GB V100 is modelled in the node its large runs were measured in,
# DGX-2: sixteen GPUs on NVSwitch (no cube-mesh), eight 100 Gb/s InfiniBand ports a node.
_VARIANTS = {
    "v100-32gb": replace(
        _CHIPS["v100-16gb"],
        name="v100-32gb",
        memory_bytes=32 * GIB,
        inter_node_bytes_per_s=6.25e9,
        devices_per_node=16,
        group_link_shares=(),
    ),
    "a800-80gb": replace(_CHIPS["a100-80gb"], name="a800-80gb", intra_node_bytes_per_s=200e9),
    "h800": replace(_CHIPS["h100-80gb"], name="h800", intra_node_bytes_per_s=200e9),
}
_ORDER = ("v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb", "a800-80gb", "h100-80gb", "h800", "h200", "b200")
DEVICE_MODELS: dict[str, DeviceModel] = {name: {**_CHIPS, **_VARIANTS}[name] for name in _ORDER}


def device_model_from_dict(data: dict[str, Any], origin: str) -> DeviceModel:
    """A device model from a ``pipeplan.device_model`` document (every field of :class:`DeviceModel`)."""
    if data.get("format") != DEVICE_MODEL_FORMAT or data.get("version") != 1:
        raise UsageError(f"{origin}: not a device model (format {DEVICE_MODEL_FORMAT!r}, version 1)")
    names = {f.name for f in fields(DeviceModel)}
    given = {k: v for k, v in data.items() if k not in ("format", "version")}
    unknown = sorted(set(given) - names)
    if unknown:
        raise UsageError(f"{origin}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(names))})")
    try:
        return DeviceModel(**given)
    except TypeError as exc:
        raise UsageError(f"{origin}: {shorten(str(exc), 160)}") from None


def recorded_device_model(settings: dict[str, Any]) -> DeviceModel | None:
    """The device model a modelled profile was made for (its ``settings["modelled"]["device_model"]``), read and
    checked as a device file is; None for a measured profile."""
    modelled = settings.get("modelled")
    if not isinstance(modelled, dict):
        return None
    data = modelled.get("device_model")
    if not isinstance(data, dict):
        raise UsageError("the profile's device model (settings.modelled.device_model) is not a JSON object")
    return device_model_from_dict(data, "the profile's device model")


def device_model(name_or_path: str) -> DeviceModel:
    """A built-in device model by name, or one read from a JSON file."""
    if name_or_path in DEVICE_MODELS:
        return DEVICE_MODELS[name_or_path]
    if not name_or_path.endswith(".json") or not Path(name_or_path).is_file():
        raise UsageError(
            f"unknown device model {name_or_path!r}: built-ins are {', '.join(DEVICE_MODELS)}, or give a "
            "FILE.json (docs/cost-model.md, 'Device models')"
        )
    data = read_json(name_or_path, UsageError, "device model")
    if not isinstance(data, dict):
        raise UsageError(f"{name_or_path}: not a device model (a JSON object)")
    return device_model_from_dict(data, name_or_path)
