"""``pipeplan show FILE``: a profile or a plan, whichever the file is, as its table."""

from __future__ import annotations

from planner.errors import UsageError
from planner.fileio import read_json
from planner.plan import PLAN_FORMAT, load_plan
from planner.report import format_plan
from profiles.format import PROFILE_FORMAT, load_profile
from profiles.report import format_profile_table

__all__ = ["format_file"]


def format_file(path: str) -> str:
    """A profile or a plan file as its table (``pipeplan show``); anything else is refused."""
    data = read_json(path, UsageError, "JSON")
    kind = data.get("format") if isinstance(data, dict) else None
    if kind == PLAN_FORMAT:
        return format_plan(load_plan(path))
    if kind == PROFILE_FORMAT:
        return format_profile_table(load_profile(path))
    raise UsageError(f"{path} is neither a pipeplan profile nor a plan (format {kind!r})")
