"""``pipeplan check``: a trainer's configuration, as the trainer would run it, predicted before anything runs.

:func:`check_config` reads a Megatron-Core, torchtitan or DeepSpeed configuration (planner/trainer_configs/),
builds exactly that layout as a plan (:mod:`planner.given_plan`), holds each rank's predicted memory against
its device, and searches pipeplan's best plan under the same trainer's rules (``plan --for TRAINER``) on the
same devices and batch, so that the two can be compared and the better one exported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from planner.check_options import CheckOptions
from planner.cluster import Layout, MeshSearch
from planner.errors import PipeplanError, UsageError, shorten
from planner.export import export_plan
from planner.formatting import format_table, human_bytes, human_seconds
from planner.given_plan import GivenLayout, RankMemory, given_mesh_plan, given_plan
from planner.plan import Plan
from planner.planning import cluster_devices, plan_profile, trainer_collectives
from planner.request import ClusterOptions, PlanOptions, plan_request, profile_sha256
from planner.tensor_parallel import TpLayout, layout_switches
from planner.trainer_configs import read_config
from planner.trainer_configs.layout import TrainerLayout
from profiles.format import Profile, load_profile

__all__ = ["CheckOptions", "CheckResult", "RankMemory", "check_config", "format_check"]


@dataclass(frozen=True)
class CheckResult:
    """The configuration as read, as a plan, each rank's memory, and pipeplan's best plan beside it."""

    layout: TrainerLayout
    plan: Plan
    ranks: tuple[RankMemory, ...]
    best: Plan | None = None
    best_error: str | None = None
    """Why no plan was found under the trainer's rules (None: found, or not searched)."""
    renames: tuple[tuple[str, str], ...] = ()
    """The profile's names mapped onto the trainer's: the best plan's export uses them."""

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def speedup(self) -> float | None:
        """The configuration's predicted step over the best plan's (above 1: the best plan is faster)."""
        if self.best is None:
            return None
        return self.plan.predicted.iteration_s / self.best.predicted.iteration_s


def _search_options(layout: TrainerLayout, options: CheckOptions, **changes: object) -> PlanOptions:
    return PlanOptions(
        ranks=layout.num_ranks,
        global_batch=layout.global_batch_size,
        memory_bytes=options.memory_bytes,
        link_bytes_per_s=options.link_bytes_per_s,
        link_latency_s=options.link_latency_s,
        optimizer=options.optimizer,
        calibration=options.calibration,
        **changes,  # type: ignore[arg-type]
    )


def _cluster_options(layout: TrainerLayout, options: CheckOptions) -> ClusterOptions:
    return ClusterOptions(
        devices=layout.world_size,
        devices_per_node=options.devices_per_node,
        intra_node_bytes_per_s=options.intra_node_bytes_per_s,
        inter_node_bytes_per_s=options.inter_node_bytes_per_s,
        shard=layout.shard,
        tensor_parallel=layout.tensor_parallel,
        sequence_parallel="on" if layout.sequence_parallel else "off",
        jobs=1,
    )


def layout_as_plan(
    profile: Profile, layout: TrainerLayout, options: CheckOptions, *, sha256: str | None
) -> tuple[Plan, tuple[RankMemory, ...]]:
    """The trainer's layout as a plan on its devices, and each pipeline rank's memory."""
    given = GivenLayout(
        layout.stages,
        layout.schedule,
        layout.micro_batch_size,
        layout.num_microbatches,
        layout.recompute,
        receive_buffers=layout.trainer != "megatron",
    )
    search = _search_options(layout, options)
    if not layout.is_mesh:
        request = plan_request(profile, search)
        plan, memory = given_plan(profile, request, given, sha256=sha256)
        return plan, memory
    request = plan_request(profile, search, cluster=True)
    cluster = cluster_devices(profile, _cluster_options(layout, options), options.link_latency_s)
    mesh_layout = Layout(layout.num_ranks, layout.data_parallel, layout.placement, layout.tensor_parallel, layout.shard)
    megatron_like = layout.trainer in ("megatron", "torchtitan")
    sequence, vocab = layout_switches(TpLayout.MEGATRON if megatron_like else TpLayout.BLOCKS, layout.sequence_parallel)
    mesh = MeshSearch(
        sequence_parallel=sequence and layout.tensor_parallel > 1,
        vocab_parallel=vocab and layout.tensor_parallel > 1,
        **trainer_collectives(layout.trainer),
    )
    plan, memory = given_mesh_plan(profile, request, cluster, mesh_layout, given, mesh, sha256=sha256)
    return plan, memory


def check_config(
    profile: Profile | str | Path,
    trainer: str,
    config: str,
    options: CheckOptions = CheckOptions(),  # noqa: B008 - frozen, so one shared default is safe
    *,
    sha256: str | None = None,
) -> CheckResult:
    """Read ``config`` (the text of a ``trainer`` configuration: ``megatron``, ``torchtitan`` or ``deepspeed``)
    for ``profile`` (a :class:`Profile` or its file), predict it, and search pipeplan's best plan under the
    trainer's rules on the same devices and batch (unless ``options.no_best``).

    Raises ConfigError where the configuration cannot be read or the trainer would refuse it or drop units;
    UsageError where the profile cannot plan it (a micro-batch size it did not measure, ...)."""
    if not isinstance(profile, Profile):
        path = profile
        profile = load_profile(path)
        sha256 = sha256 or profile_sha256(path)
    layout = read_config(trainer, config, profile, renames=options.renames, devices=options.devices)
    if options.placement is not None:
        layout = replace(layout, placement=options.placement)
    plan, ranks = layout_as_plan(profile, layout, options, sha256=sha256)
    if options.no_best:
        return CheckResult(layout, plan, ranks)
    search = _search_options(layout, options, trainer=layout.trainer)
    cluster = _cluster_options(layout, options) if layout.is_mesh else None
    try:
        best = plan_profile(profile, search, cluster, sha256=sha256, renames=options.renames).plan
    except PipeplanError as exc:
        return CheckResult(layout, plan, ranks, best_error=str(exc), renames=options.renames)
    return CheckResult(layout, plan, ranks, best=best, renames=options.renames)


# --- report -----------------------------------------------------------------------------------------------

_TITLES = {"megatron": "Megatron-Core", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}


def _plan_line(plan: Plan) -> str:
    mesh = plan.mesh
    degrees = (
        (f"pp {mesh.pp} x dp {mesh.dp}" if mesh and mesh.tp == 1 else f"pp {mesh.pp} x tp {mesh.tp} x dp {mesh.dp}")
        if mesh
        else f"{plan.num_ranks} ranks"
    )
    return (
        f"{degrees}, {plan.num_stages} stages, {plan.schedule.value}, micro-batch {plan.micro_batch_size} x "
        f"{plan.num_microbatches}: predicted iteration {human_seconds(plan.predicted.iteration_s)}"
    )


def _stage_rows(plan: Plan) -> list[list[object]]:
    rows: list[list[object]] = []
    for s in plan.stages:
        units = s.units[0] if len(s.units) == 1 else f"{s.units[0]} .. {s.units[-1]} ({len(s.units)})"
        rows.append(
            [
                s.index,
                s.rank,
                shorten(units, 48),
                human_seconds(s.forward_s + s.backward_s),
                "yes" if s.recompute else "",
                human_bytes(s.memory_bytes.peak),
            ]
        )
    return rows


def format_check(result: CheckResult) -> str:
    """The report ``pipeplan check`` prints: what was read, the layout as a plan with each rank's memory and
    verdict, and the best plan under the trainer's rules beside it."""
    layout, plan = result.layout, result.plan
    title = _TITLES.get(layout.trainer, layout.trainer)
    lines = [f"{title} configuration, as {title} would build it:"]
    lines += [f"  {line}" for line in layout.read]
    lines += ["", f"as a plan: {_plan_line(plan)}"]
    lines.append(
        format_table(["stage", "rank", "units", "compute", "recompute", "memory"], _stage_rows(plan), align=">><><>")
    )
    lines.append("")
    over = [r for r in result.ranks if not r.fits]
    for r in result.ranks:
        verdict = "fits" if r.fits else f"OVER by {human_bytes(r.over_bytes)}"
        lines.append(
            f"  rank {r.rank}: predicted peak {human_bytes(r.peak_bytes)} of {human_bytes(r.capacity_bytes)} usable: "
            f"{verdict}"
        )
    if over:
        names = ", ".join(str(r.rank) for r in over)
        lines.append(f"verdict: does not fit: rank{'s' if len(over) > 1 else ''} {names} would run out of memory")
    else:
        lines.append("verdict: fits every rank")
    for note in layout.notes:
        lines.append(f"note: {note}")
    if result.best is not None:
        best = result.best
        lines += ["", f"pipeplan's best plan under {title}'s rules, same devices and batch: {_plan_line(best)}"]
        lines.append(
            format_table(
                ["stage", "rank", "units", "compute", "recompute", "memory"], _stage_rows(best), align=">><><>"
            )
        )
        peaks: dict[int, float] = {}
        for stage in best.stages:
            peaks[stage.rank] = peaks.get(stage.rank, 0.0) + stage.memory_bytes.peak
        usable = min(r.capacity_bytes for r in result.ranks)
        rank, peak = max(peaks.items(), key=lambda item: item[1])
        lines.append(
            f"  its largest rank peak: rank {rank}, {human_bytes(peak)} of {human_bytes(usable)} usable: "
            + ("fits every rank" if peak <= usable else "OVER")
        )
        speedup = result.speedup or 1.0
        if speedup > 1.0005:
            lines.append(f"predicted {speedup:.3g}x faster than the configuration; its {title} configuration:")
            try:
                text = export_plan(best, layout.trainer, result.renames).text()
            except PipeplanError as exc:
                text = f"(not exported: {exc})\n"
            lines += ["  " + line for line in text.rstrip("\n").split("\n")]
        else:
            lines.append("the configuration is as fast as pipeplan's best plan under these rules (predicted)")
    elif result.best_error is not None:
        lines += ["", f"no plan under {title}'s rules to compare with: {result.best_error}"]
    return "\n".join(lines)


def read_config_file(path: str) -> str:
    """The configuration file's text (``-``: standard input)."""
    if path == "-":
        import sys

        return sys.stdin.read()
    if not os.path.isfile(path):
        raise UsageError(f"no configuration file {shorten(path)}")
    return Path(path).read_text()
