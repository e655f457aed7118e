"""``pipeplan show FILE``: a profile, a plan, a verify report or a device model, whichever the file is (or a built-in
device model's name), as its table."""

from __future__ import annotations

import os

from planner.errors import UsageError, shorten
from planner.fileio import read_json
from planner.formatting import format_table, human_bytes, human_rate, human_seconds
from planner.plan import PLAN_FORMAT, load_plan
from planner.report import format_plan
from planner.runtime.verify_report import VERIFY_REPORT_FORMAT, format_report, report_from_dict
from profiles.device_model import DEVICE_MODEL_FORMAT, DEVICE_MODELS, DeviceModel, device_model_from_dict
from profiles.format import PROFILE_FORMAT, load_profile
from profiles.report import format_profile_table

__all__ = ["format_file", "format_device_model"]


def format_file(path: str, micro_batch_size: str | None = None) -> str:
    """A profile, a plan, a verify report or a device model file (or a built-in device model's name) as its table
    (``pipeplan show``); anything else is refused."""
    if not os.path.exists(path):  # False, not an error, for a name the system cannot hold
        if path in DEVICE_MODELS:
            return _device_model_table(DEVICE_MODELS[path], micro_batch_size, "built in")
        if not path.endswith(".json"):
            raise UsageError(
                f"JSON file not found: {shorten(path)}, nor is it a built-in device model ({', '.join(DEVICE_MODELS)})"
            )
    data = read_json(path, UsageError, "JSON")
    kind = data.get("format") if isinstance(data, dict) else None
    if kind == DEVICE_MODEL_FORMAT:
        return _device_model_table(device_model_from_dict(data, path), micro_batch_size, path)
    if kind == PLAN_FORMAT:
        if micro_batch_size is not None:
            raise UsageError("--micro-batch-size picks a profile's table; a plan has one micro-batch size")
        return format_plan(load_plan(path))
    if kind == PROFILE_FORMAT:
        profile = load_profile(path)
        if micro_batch_size == "all":
            return format_profile_table(profile, all_sizes=True)
        if micro_batch_size is not None and not micro_batch_size.isdigit():
            raise UsageError(f"--micro-batch-size {micro_batch_size!r}: give a profiled size or 'all'")
        size = int(micro_batch_size) if micro_batch_size is not None else None
        if size is not None and size not in profile.micro_batch_sizes:
            raise UsageError(
                f"micro-batch size {size} was not profiled (sizes: {', '.join(map(str, profile.micro_batch_sizes))})"
            )
        return format_profile_table(profile, size)
    # A report that does not name its format is known by its fields.
    if kind == VERIFY_REPORT_FORMAT or (kind is None and isinstance(data, dict) and {"mode", "stages"} <= set(data)):
        if micro_batch_size is not None:
            raise UsageError("--micro-batch-size picks a profile's table; a verify report has one micro-batch size")
        try:
            report = report_from_dict(data)
        except ValueError as exc:
            raise UsageError(f"{path}: {exc}") from exc
        return format_report(report)
    raise UsageError(
        f"{path} is neither a pipeplan profile, a plan, a verify report nor a device model (format {kind!r}); "
        f"built-in device models: {', '.join(DEVICE_MODELS)}"
    )


def _device_model_table(model: DeviceModel, micro_batch_size: str | None, origin: str) -> str:
    if micro_batch_size is not None:
        raise UsageError("--micro-batch-size picks a profile's table; a device model has none")
    return format_device_model(model, origin)


def format_device_model(model: DeviceModel, origin: str = "built in") -> str:
    """What ``pipeplan profile --device-model`` assumes of a GPU, one constant a line (docs/cost-model.md, "Device
    models", has their sources)."""
    peak = f"{model.matmul_flops_per_s / 1e12:,.4g} TFLOP/s dense 16-bit"
    if model.fp8_speedup != 1:
        peak += f", fp8 {model.fp8_speedup:g}x"
    attention = (
        f"flash kernels, forward at {model.attention_efficiency:.0%} of the peak, backward 2.5x its work"
        if model.flash_attention
        else "no flash kernels: the attention core as its products and softmax"
    )
    nvlink = f"{human_rate(model.intra_node_bytes_per_s)} each way"
    if model.nvlink_efficiency != 1:
        nvlink += f", {human_rate(model.intra_node_ring_bytes_per_s)} as NCCL's rings get it"
    rows = [
        ("peak", peak),
        (
            "matrix products",
            f"at most {model.matmul_efficiency:.1%} of the peak, times d / (d + {model.matmul_half_size}) for each "
            "output dimension d",
        ),
        ("attention", attention),
        (
            "memory",
            f"{human_bytes(model.memory_bytes)} at {human_rate(model.memory_bytes_per_s)}, element-wise "
            f"kernels at {model.memory_efficiency:.0%} of it",
        ),
        ("every kernel", f"{human_seconds(model.kernel_s)} more (launch and tail)"),
        ("node", f"{model.devices_per_node} GPUs"),
        ("NVLink a GPU", nvlink),
        *((f"  a ring of {size}", f"{share:.0%} of the NVLink (no switch)") for size, share in model.group_link_shares),
        (
            "network a GPU",
            f"{human_rate(model.inter_node_bytes_per_s)} each way, {human_seconds(model.link_latency_s)} latency",
        ),
    ]
    title = f"device model {model.name} ({origin}; sources: docs/cost-model.md, 'Device models')"
    return title + "\n" + format_table(["constant", "value"], rows)
