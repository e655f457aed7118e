"""Pictures of a simulated iteration: an ASCII timeline for terminals and matplotlib Gantt charts."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

from planner.errors import UsageError, shorten
from planner.fileio import check_output_path, write_atomic
from planner.formatting import format_table, human_seconds
from planner.schedule.simulate import SimulationResult, TimedAction

__all__ = [
    "ascii_timeline",
    "render_png",
    "render_comparison_png",
    "time_breakdown",
    "format_comparison",
    "picture_format",
]

IDLE = "."
_KIND_NAMES = {
    "F": "forward",
    "B": "backward",
    "I": "input-grad backward",
    "W": "weight-grad backward",
    "S": "step tail (gradient all-reduces + optimizer)",
}
_KIND_ORDER = "FBIWS"
# Forward blue, full backward red, input-grad orange, weight-grad green (seaborn's "deep" palette, told
# apart in the common colour blindnesses by lightness too): dualpipev runs B, I and W side by side.
# The step tail is purple and runtime overhead dark grey: neither is the model's compute.
_COLOURS = {"F": "#4C72B0", "B": "#C44E52", "I": "#DD8452", "W": "#55A868", "S": "#8172B3"}
_OVERHEAD_COLOUR = "#555555"


def _summary(result: SimulationResult) -> str:
    stages = f", {result.num_stages} stages" if result.num_stages != result.num_ranks else ""
    return (
        f"{result.schedule.value}: P={result.num_ranks}{stages}, M={result.num_microbatches}, "
        f"iteration {human_seconds(result.iteration_s)}, bubble {result.bubble_fraction:.1%}"
    )


def time_breakdown(result: SimulationResult) -> str:
    """Where each rank's iteration goes: compute, runtime overhead, link wait, step tail, bubble."""
    lines = [f"{'rank':>4} {'compute':>10} {'overhead':>10} {'link wait':>10} {'step tail':>10} {'idle':>10}"]
    for r in range(result.num_ranks):
        overhead = result.overhead_s[r] if result.overhead_s else 0.0
        wait = result.comm_wait_s[r] if result.comm_wait_s else 0.0
        tail = result.step_tail_s[r] if result.step_tail_s else 0.0
        idle = result.iteration_s - result.busy_s[r] - overhead - tail - wait
        cells = (result.busy_s[r], overhead, wait, tail, max(0.0, idle))
        lines.append(f"{r:>4} " + " ".join(f"{human_seconds(c):>10}" for c in cells))
    return "\n".join(lines)


def format_comparison(results: Sequence[SimulationResult]) -> str:
    """One row per schedule: iteration, bubble, and the most micro-batches of activations any stage holds."""
    rows = [
        [r.schedule.value, human_seconds(r.iteration_s), f"{r.bubble_fraction:.1%}", str(max(r.peak_in_flight))]
        for r in results
    ]
    return format_table(["schedule", "iteration", "bubble", "peak in-flight"], rows, align="<>>>")


def ascii_timeline(result: SimulationResult, width: int = 100) -> str:
    """One row per rank, ``width`` cells across the iteration.

    Each action is a box of its kind letter (F forward, B backward, I input-grad, W weight-grad)
    starting with ``kind + micro-batch`` (``F3BB``) where the box is wide enough; idle cells are ``.``.
    An action shorter than a cell still takes one cell (a later action may overwrite it).
    """
    if width < 10:
        raise ValueError(f"width must be at least 10 cells (got {width})")
    cell_s = result.iteration_s / width
    rows = []
    for rank in range(result.num_ranks):
        cells = [IDLE] * width
        for action in (a for a in result.actions if a.rank == rank):
            first, last = _cell_span(action, cell_s, width)
            label = action.kind if action.kind == "S" else f"{action.kind}{action.microbatch}"
            span = last - first
            text = label if span >= len(label) else action.kind
            text = text + action.kind * (span - len(text))
            cells[first:last] = list(text[:span])
        rows.append(f"rank {rank:>2} |{''.join(cells)}|")
    kinds = sorted({a.kind for a in result.actions}, key=_KIND_ORDER.index)
    legend = ", ".join(f"{k} = {_KIND_NAMES[k]}" for k in kinds)
    footer = f"{legend}, digits = micro-batch, {IDLE} = idle; 1 cell = {human_seconds(cell_s)}"
    return "\n".join([_summary(result), *rows, footer])


def _cell_span(action: TimedAction, cell_s: float, width: int) -> tuple[int, int]:
    first = min(width - 1, int(round(action.start_s / cell_s)))
    last = min(width, max(first + 1, int(round(action.end_s / cell_s))))
    return first, last


def _draw(ax: object, result: SimulationResult) -> None:

    v = result.virtual_stages
    total = result.iteration_s
    for a in result.actions:
        # Later chunks of the same rank (interleaved) are drawn lighter so the chunk is visible.
        chunk = a.stage // result.num_ranks
        alpha = 1.0 - 0.45 * chunk / max(1, v - 1) if v > 1 and a.kind != "S" else 1.0
        ax.barh(  # type: ignore[attr-defined]
            a.rank,
            a.duration_s,
            left=a.start_s,
            height=0.8,
            color=_COLOURS[a.kind],
            alpha=alpha,
            edgecolor="black",
            linewidth=0.6,
        )
        if a.overhead_s > 0:  # the runtime's share of the action, drawn at its end
            ax.barh(  # type: ignore[attr-defined]
                a.rank, a.overhead_s, left=a.end_s - a.overhead_s, height=0.8, color=_OVERHEAD_COLOUR, linewidth=0
            )
        # Label only where the digits fit inside the box (roughly 1.2 % of the axis per character).
        label = "opt" if a.kind == "S" else str(a.microbatch)
        if a.duration_s / total >= 0.012 * len(label) + 0.004:
            ax.text(  # type: ignore[attr-defined]
                a.start_s + a.duration_s / 2, a.rank, label, ha="center", va="center", fontsize=8, color="white"
            )
    ax.set_ylim(result.num_ranks - 0.5, -0.5)  # type: ignore[attr-defined]
    ax.set_yticks(range(result.num_ranks))  # type: ignore[attr-defined]
    ax.set_yticklabels([f"rank {r}" for r in range(result.num_ranks)])  # type: ignore[attr-defined]
    ax.set_xlim(0, total)  # type: ignore[attr-defined]
    ax.set_facecolor("#f2f2f2")  # type: ignore[attr-defined]  # idle time shows as grey background
    ax.grid(axis="x", color="white", linewidth=0.8)  # type: ignore[attr-defined]
    ax.set_axisbelow(True)  # type: ignore[attr-defined]


def _legend(ax: object, results: Sequence[SimulationResult]) -> None:
    from matplotlib.patches import Patch

    kinds = {a.kind for r in results for a in r.actions}
    entries = [("F", "forward")]
    if "B" in kinds:
        entries.append(("B", "backward" if "I" not in kinds else "full backward (B)"))
    if "I" in kinds:
        entries.append(("I", "input-grad (I)"))
    if "W" in kinds:
        entries.append(("W", "weight-grad (W)"))
    if "S" in kinds:
        entries.append(("S", "step tail: gradient all-reduces + optimizer"))
    handles = [Patch(facecolor=_COLOURS[k], edgecolor="black", label=text) for k, text in entries]
    if any(a.overhead_s > 0 for r in results for a in r.actions):
        handles.append(Patch(facecolor=_OVERHEAD_COLOUR, edgecolor="black", label="runtime overhead"))
    if any(r.virtual_stages > 1 for r in results):
        handles.append(Patch(facecolor=_COLOURS["F"], alpha=0.55, edgecolor="black", label="lighter: later chunk"))
    handles.append(Patch(facecolor="#f2f2f2", edgecolor="black", label="idle"))
    ax.legend(  # type: ignore[attr-defined]
        handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False
    )


PICTURE_FORMATS = ("png", "svg", "pdf")
"""What a chart may be written as, chosen by the file's suffix."""


def picture_format(path: str | os.PathLike[str]) -> str:
    """The format a chart file's suffix names; anything else is refused before any work is done."""
    suffix = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if suffix not in PICTURE_FORMATS:
        raise UsageError(
            f"{shorten(os.fspath(path))}: a chart is written as {', '.join('.' + f for f in PICTURE_FORMATS)} "
            "(by the file's suffix)"
        )
    return suffix


def _save(fig: object, path: str | os.PathLike[str]) -> None:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format=picture_format(path), dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    write_atomic(path, buf.getvalue())


def _figure(rows: Sequence[int]) -> tuple[object, list[object]]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    heights = [max(1.4, 0.45 * r + 0.9) for r in rows]
    fig, axes = plt.subplots(
        len(rows),
        1,
        figsize=(12, sum(heights) + 0.4),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
        layout="constrained",
    )
    return fig, [ax for row in axes for ax in row]


def render_png(result: SimulationResult, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Gantt chart of ``result``: one row per rank, F/B(/W) in distinct colours, micro-batch labels.

    Boxes are labelled with their micro-batch where it fits; with several stages per rank, later
    chunks are drawn lighter.
    Written atomically (temp file in the same folder, then renamed).
    """
    check_output_path(path)
    picture_format(path)
    fig, (ax,) = _figure([result.num_ranks])
    _draw(ax, result)
    _legend(ax, [result])
    ax.set_xlabel("time (s)")  # type: ignore[attr-defined]
    ax.set_title(title if title is not None else _summary(result), fontsize=10)  # type: ignore[attr-defined]
    _save(fig, path)


def render_comparison_png(results: Sequence[SimulationResult], path: str | os.PathLike[str]) -> None:
    """Stacked Gantt charts of several schedules on one time axis: the bubble vs memory trade-off.

    Each subplot title gives the schedule, iteration time, bubble % and the peak number of micro-batches
    of activations held (the most on any stage, and per stage).
    """
    if not results:
        raise ValueError("render_comparison_png needs at least one result")
    check_output_path(path)
    picture_format(path)
    fig, axes = _figure([r.num_ranks for r in results])
    longest = max(r.iteration_s for r in results)
    for i, (ax, result) in enumerate(zip(axes, results, strict=True)):
        _draw(ax, result)
        if i == 0:
            _legend(ax, results)
        ax.set_xlim(0, longest)  # type: ignore[attr-defined]
        peak = ", ".join(str(p) for p in result.peak_in_flight)
        ax.set_title(  # type: ignore[attr-defined]
            f"{_summary(result)}; peak in-flight micro-batches {max(result.peak_in_flight)} (per stage: {peak})",
            fontsize=9,
            loc="left",
        )
    axes[-1].set_xlabel("time (s)")  # type: ignore[attr-defined]
    _save(fig, path)
