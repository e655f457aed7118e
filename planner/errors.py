"""The one exception hierarchy of pipeplan.

Every error a user can cause derives from :class:`PipeplanError`. The CLI catches it once,
prints its message as one line and exits with code 2. Messages state the offending values
and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "PipeplanError",
    "UsageError",
    "ModelSpecError",
    "ProfileError",
    "ProfilingError",
    "PlanFormatError",
    "PlanInfeasibleError",
    "SearchPrunedError",
    "SolverError",
    "ScheduleError",
    "ModelMismatchError",
    "ExecutionError",
    "CalibrationError",
    "ExportError",
    "ConfigError",
    "TensorParallelError",
    "PipeplanWarning",
    "shorten",
    "MAX_MESSAGE_CHARS",
]

MAX_MESSAGE_CHARS = 300
"""The CLI prints an error as one line of at most this many characters."""


def shorten(text: str, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters: a message echoes a value, never megabytes of it."""
    flat = str(text)
    if "\n" in flat or "\r" in flat:
        flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: max(0, limit - 3)] + "..."


class PipeplanError(Exception):
    """Base class: an error caused by the user's input or environment, not a bug."""


class UsageError(PipeplanError):
    """Raised when a command-line value or API argument is out of range or malformed."""


class ModelSpecError(PipeplanError):
    """Raised when a MODEL spec cannot be resolved into a workload."""


class ProfileError(PipeplanError):
    """Raised when a profile file is missing, truncated, of another format/version, or invalid."""


class ProfilingError(PipeplanError):
    """Raised when a model cannot be measured (device missing, forward fails, ...)."""


class PlanFormatError(PipeplanError):
    """Raised when a plan file is missing, truncated, of another format/version, or invalid."""


class PlanInfeasibleError(PipeplanError):
    """Raised when no plan satisfies the constraints (memory, stages, batch divisibility)."""


class SearchPrunedError(PlanInfeasibleError):
    """Raised when a search told to beat a step finds that none of its candidates can (planner/bounds.py)."""


class UnexplainedInfeasibleError(PlanInfeasibleError):
    """Raised when a search told not to explain finds no plan that fits: the caller explains the one it reports
    (a cluster search tries many layouts and reports at most one: :func:`planner.search.explain_infeasible`)."""


class SolverError(PipeplanError):
    """Raised when a solver fails to return a feasible answer (e.g. an ILP time-out)."""


class ScheduleError(PipeplanError):
    """Raised when a schedule is unknown or its requirements are not met (e.g. too few micro-batches)."""


class ModelMismatchError(PipeplanError):
    """Raised when a model does not match the fingerprint recorded in a profile or plan."""


class ExecutionError(PipeplanError):
    """Raised when a pipelined run fails: a rank raised, hung past the timeout, or was killed."""


class CalibrationError(PipeplanError):
    """Raised when a calibration file is invalid, or was measured on another device kind or backend."""


class ExportError(PipeplanError):
    """Raised when a trainer cannot express a plan's layout (a cut inside what it counts as one layer, a unit
    it has no notion of, a placement or stage count it does not run); the message says which and why."""


class ConfigError(PipeplanError):
    """Raised when a trainer's configuration cannot be read, the trainer itself would refuse it (its rule
    quoted), or it would leave units of the profiled model out of training or run them twice."""


class TensorParallelError(PipeplanError):
    """Raised when a plan's tensor parallelism cannot be applied to the model: no built-in layout and no
    Workload ``tp_plan``, a head or feature count the degree does not divide, or a run mode that cannot hold
    a tensor-parallel group (replay)."""


class PipeplanWarning(UserWarning):
    """Something the user should know that does not stop the command (the CLI prints it as one
    ``pipeplan: warning:`` line)."""
