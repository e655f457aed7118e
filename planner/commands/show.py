"""``pipeplan show FILE``: a profile, a plan or a verify report, whichever the file is, as its table."""

from __future__ import annotations

from planner.errors import UsageError
from planner.fileio import read_json
from planner.plan import PLAN_FORMAT, load_plan
from planner.report import format_plan
from planner.runtime.verify_report import VERIFY_REPORT_FORMAT, format_report, report_from_dict
from profiles.format import PROFILE_FORMAT, load_profile
from profiles.report import format_profile_table

__all__ = ["format_file"]


def format_file(path: str, micro_batch_size: str | None = None) -> str:
    """A profile, a plan or a verify report file as its table (``pipeplan show``); anything else is refused."""
    data = read_json(path, UsageError, "JSON")
    kind = data.get("format") if isinstance(data, dict) else None
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
    # Reports written before they named their format are known by their fields.
    if kind == VERIFY_REPORT_FORMAT or (kind is None and isinstance(data, dict) and {"mode", "stages"} <= set(data)):
        if micro_batch_size is not None:
            raise UsageError("--micro-batch-size picks a profile's table; a verify report has one micro-batch size")
        try:
            report = report_from_dict(data)
        except ValueError as exc:
            raise UsageError(f"{path}: {exc}") from exc
        return format_report(report)
    raise UsageError(f"{path} is neither a pipeplan profile, a plan nor a verify report (format {kind!r})")
