"""pipeplan's predictions held against what large clusters published: every row of a table of measured training
runs, as published, through a device-model profile (docs/cost-model.md, "Device models").

    python benchmarks/bench_published.py ../shared/published/tables.normalized.json
    python benchmarks/bench_published.py TABLES.json --out DIR     # also DIR/result.json
    python benchmarks/bench_published.py TABLES.json --best        # and pipeplan's own plan per model (minutes)

The tables are in one schema (``../shared/published/README.md``): each row's model shape, GPU, mesh (dp, tp, pp,
vp, cp), micro and global batch, schedule, recomputation and ZeRO stage, and what was measured. Each row becomes a
``pp x tp x dp`` plan of exactly that configuration (:func:`planner.given_plan.given_mesh_plan`, the layers split
evenly over ``pp x vp`` stages, the embedding on the first and the head on the last) on a profile modelled for the
row's GPU at the row's micro-batch, precision and recomputation, with the links the table gives. Nothing is fitted
per table: the GPU's constants are the device model's (a GPU not built in is read from
``benchmarks/device_models/GPU.json``), and the rules for what a table leaves out are these, the same for all:

- micro-batch unstated: torchtitan's default at the row's date (a replica's batch in as many micro-batches as
  pipeline ranks before 2025, as stages from January 2025, micro-batches of 1 from April 2025:
  ``published_facts.torchtitan_microbatch_size``), others run micro-batches of 1; virtual stages unstated with an
  interleaved schedule: 2 a rank;
- ZeRO unstated: the framework's default, the distributed optimizer (ZeRO-1) under NeMo's and Megatron-Bridge's
  recipes, none elsewhere (Megatron-LM's ``--use-distributed-optimizer`` is off by default); sequence parallelism
  unstated: on with tensor parallelism;
- ``selective`` recomputation is the runtime's: torch's op-level checkpointing under torchtitan, the attention core
  (Korthikanti et al.) elsewhere; flash attention from 2023 on (the row's or the framework's year), not before;
- Megatron, NeMo and Megatron-Bridge run Transformer Engine's layers (SwiGLU fused; in fp8, the products' inputs
  kept in fp8) under Megatron's schedules, which keep no receive buffers; torchtitan runs torch's layers under
  ``torch.distributed.pipelining``;
- the gradients' reduction runs behind the backward (torch's DDP and FSDP, OneFlow, NeMo's and Megatron-Bridge's
  recipes), all but its last bucket, except under Megatron-LM, whose ``--overlap-grad-reduce`` is off by default;
- a row fits when each rank's predicted peak is within the device's memory (a published run shows what ran: the
  planner's 10 % headroom is for choosing, not for judging);
- context parallelism is not modelled: such rows are reported, not predicted;
- a GPU is read by its name as the device models spell it (``NVIDIA A100 SXM4 80GB`` is ``a100-80gb``); one with no
  device model of its own but of its family's (``h100-94gb``) takes the family's constants with the memory and peak
  the table states, and the row's note says so; MFU is over the table's stated peak, else the device model's,
  and counts the FLOPs the publication counts where it gives both an MFU and a time (the two imply its count);
- a fact that cannot be read, or that names what pipeplan does not model (a GPU of no modelled family, layers other
  than gpt- or llama-like, tf32, recomputation other than none, selective or full), leaves its row reported with a
  note that names it (``published_facts.py``), and the other rows and tables go on.

Per table: Spearman's rank correlation of predicted and measured iteration time within each comparable group (the
rows of one model), the median error of the predicted ratio of every pair of timed rows in a group, the agreement
on which rows fit in memory, and each row's predicted MFU (or TFLOP/s) beside the published one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tee_stdout, write_record  # noqa: E402
from published_facts import (  # noqa: E402
    device_for,
    measured_iteration_s,
    precision_for,
    recompute_for,
    schedule_for,
    shape_for,
    stated_number,
    stated_whole,
    torchtitan_microbatch_size,
    year_of,
)

from planner.cluster import Cluster, Layout, MeshSearch, plan_cluster  # noqa: E402
from planner.cost import CostSettings  # noqa: E402
from planner.errors import PipeplanError, shorten  # noqa: E402
from planner.export import Trainer  # noqa: E402
from planner.fileio import write_json_atomic  # noqa: E402
from planner.given_plan import GivenLayout, given_mesh_plan  # noqa: E402
from planner.request import PlanRequest, calibration_settings  # noqa: E402
from planner.trainer_rules import TRAINER_SHARDING  # noqa: E402
from profiles.device_model import DeviceModel  # noqa: E402
from profiles.modelled import TransformerShape, model_flops, modelled_profile  # noqa: E402

__all__ = ["RowResult", "predict_row", "table_result", "spearman", "pair_errors", "device_for"]

FLASH_FROM_YEAR = 2023


@dataclass(frozen=True)
class RowResult:
    index: int
    model: str
    config: str
    iteration_s: float | None
    """Predicted; None where the row is not modelled."""
    memory_gib: float | None
    fits: bool | None
    measured_iteration_s: float | None
    """The published iteration time, or the one its throughput implies (None where none was published)."""
    measured_memory_gib: float | None
    measured_oom: bool | None
    mfu_predicted: float | None
    mfu_published: float | None
    """Published MFU, or published TFLOP/s over the GPU's 16-bit peak."""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "model": self.model,
            "config": self.config,
            "iteration_s": self.iteration_s,
            "memory_gib": self.memory_gib,
            "fits": self.fits,
            "measured": {
                "iteration_s": self.measured_iteration_s,
                "memory_gib": self.measured_memory_gib,
                "oom": self.measured_oom,
                "mfu": self.mfu_published,
            },
            "mfu": self.mfu_predicted,
            "note": self.note,
        }


def _stages(shape: TransformerShape, profile_names: list[str], num_stages: int) -> tuple[tuple[str, ...], ...]:
    """The layers split evenly over the stages, the extra ones to the middle stages; the embedding(s) on the
    first stage, the final norm and head on the last."""
    layers = [n for n in profile_names if re.search(r"\.(h|layers)\.\d+$", n)]
    first = profile_names[: profile_names.index(layers[0])]
    last = profile_names[profile_names.index(layers[-1]) + 1 :]
    base, extra = divmod(len(layers), num_stages)
    counts = [base] * num_stages
    middle = list(range(1, num_stages - 1)) or list(range(num_stages))
    for k in range(extra):
        counts[middle[k % len(middle)]] += 1
    stages, start = [], 0
    for s, count in enumerate(counts):
        units = layers[start : start + count]
        start += count
        stages.append(tuple((first if s == 0 else []) + units + (last if s == num_stages - 1 else [])))
    return tuple(stages)


@dataclass(frozen=True)
class _Workload:
    """What a row runs, by the rules of the module docstring: the model on its GPU, in its precision, with its
    recomputation within a layer, in its framework's layers."""

    shape: TransformerShape
    device: DeviceModel
    precision: str
    within: str
    flash: bool
    megatron: bool
    torchtitan: bool
    shard: str
    overlap_grad_reduce: bool
    device_note: str = ""
    """Where the GPU is taken as another of its family (:func:`published_facts.device_for`)."""

    def profile(self, micro_batch_sizes: tuple[int, ...]) -> Any:
        return modelled_profile(
            self.shape,
            self.device,
            micro_batch_sizes,
            precision=self.precision,
            recompute=self.within,
            flash_attention=self.flash,
            transformer_engine=self.megatron,
        )

    def cluster(self, num_devices: int) -> Cluster:
        """``num_devices`` of the row's GPU in its nodes, NVLink at NCCL's rate (``intra_node_ring_bytes_per_s``)."""
        device = self.device
        return Cluster(
            num_devices,
            device.devices_per_node,
            device.intra_node_ring_bytes_per_s,
            device.inter_node_bytes_per_s,
            device.link_latency_s,
            self.shard,
            device.group_link_shares,
        )

    def settings(self, profile: Any) -> CostSettings:
        return CostSettings(
            link_bytes_per_s=self.device.inter_node_bytes_per_s,
            link_latency_s=self.device.link_latency_s,
            headroom_fraction=0.0,
            **calibration_settings("auto", "cuda", profile),  # type: ignore[arg-type]
        )


def _shards_optimizer_by_default(framework: str) -> bool:
    """Whether ``framework`` shards the optimizer over data-parallel replicas unless told otherwise: the recipes of
    NeMo and Megatron-Bridge (on Megatron-Core) turn on its distributed optimizer; Megatron-LM keeps
    ``--use-distributed-optimizer`` off by default, and frameworks that predate it (OneFlow's GPT of 2021) have none."""
    return bool(re.search(r"nemo|megatron-bridge|megatron-core", framework, re.IGNORECASE))


ZERO_SHARDS = {0: "none", 1: "optimizer", 2: "optimizer", 3: "full"}
"""A published ZeRO stage as pipeplan shards (FSDP is 3; ZeRO-2's sharded gradients are costed as ZeRO-1)."""


def _workload(table: dict[str, Any], row: dict[str, Any], shape: TransformerShape) -> _Workload:
    device, device_note = device_for(table.get("hardware") or {})
    framework = str(table.get("framework") or "")
    torchtitan = framework.lower().startswith("torchtitan")
    megatron = bool(re.search(r"megatron|nemo", framework, re.IGNORECASE))
    within = (
        "none"
        if recompute_for(row) in ("none", "full")
        else ("op" if torchtitan and shape.arch == "llama" else "selective")
    )
    year = year_of(row, table)
    zero = row.get("zero")
    if zero is not None and (not isinstance(zero, int) or zero not in ZERO_SHARDS):
        raise PipeplanError(f"ZeRO stage {zero!r} is not one of 0-3")
    default = "optimizer" if _shards_optimizer_by_default(framework) else "none"
    shard = ZERO_SHARDS[zero] if zero is not None else default
    flash = year is None or year >= FLASH_FROM_YEAR
    # Megatron-LM reduces gradients after the backward unless told to overlap (--overlap-grad-reduce, off by
    # default); torch's DDP and FSDP, OneFlow and NeMo's / Megatron-Bridge's recipes overlap them.
    overlap = not framework.lower().startswith("megatron-lm")
    precision = precision_for(table, device)
    return _Workload(shape, device, precision, within, flash, megatron, torchtitan, shard, overlap, device_note)


def _gpus(row: dict[str, Any]) -> int:
    """The row's GPUs, as published or as its mesh multiplies out (context parallelism included)."""
    return stated_whole(row, "gpus", None) or math.prod(stated_whole(row, k) or 1 for k in ("dp", "tp", "pp", "cp"))


def _data_parallel(row: dict[str, Any], model_parallel: int) -> int:
    """An unstated data-parallel degree: the GPUs over the model-parallel ones, else 1."""
    gpus = stated_whole(row, "gpus", None)
    if gpus is None:
        return 1
    if gpus % model_parallel:
        raise PipeplanError(f"{gpus} GPUs are not a whole number of tp x pp x cp = {model_parallel}")
    return gpus // model_parallel


def _config_text(row: dict[str, Any], vp: int | None = None, mbs: int | None = None, dp: int | None = None) -> str:
    """``pp x tp x dp``, the virtual stages, the micro-batch and recomputation, as far as they are known."""
    mesh = "x".join(str(row.get(k) or 1) for k in ("pp", "tp")) + f"x{dp or row.get('dp') or 1}"
    vp = vp if vp is not None else row.get("vp")
    mbs = mbs if mbs is not None else row.get("mbs")
    virtual = "" if vp in (None, 1, "1") else f" v{vp}"
    return f"{mesh}{virtual} b{mbs or '?'} {row.get('recompute') or 'none'}"


def predict_row(table: dict[str, Any], index: int) -> RowResult:
    """One published row, configured as published, predicted. A row whose facts cannot be read, or that names what
    pipeplan does not model, is reported with a note saying which (:mod:`published_facts`), not predicted."""
    row = table["rows"][index]
    row = row if isinstance(row, dict) else {}
    measured = row.get("measured") if isinstance(row.get("measured"), dict) else {}
    oom = measured.get("oom")
    base = RowResult(
        index,
        str(row.get("model")),
        _config_text(row),
        None,
        None,
        None,
        None,
        _readable(measured, "memory_gib"),
        oom if isinstance(oom, bool) else None,
        None,
        _readable(measured, "mfu"),
    )
    try:
        shape, notes = shape_for(base.model, (table.get("models") or {}).get(base.model))
        work = _workload(table, row, shape)
        # MFU over the table's stated 16-bit peak, else the device model's (the datasheet's).
        stated_peak = stated_number(table.get("hardware") or {}, "peak_tflops_16bit")
        peak = stated_peak * 1e12 if stated_peak else work.device.matmul_flops_per_s
        published_mfu, tflops = stated_number(measured, "mfu"), stated_number(measured, "tflops_per_gpu")
        if published_mfu is None and tflops:
            published_mfu = tflops * 1e12 / peak
        base = replace(
            base,
            measured_iteration_s=measured_iteration_s(row, shape, peak, _gpus(row), stated_whole(row, "gbs", None)),
            mfu_published=published_mfu,
            note="; ".join(filter(None, [work.device_note, *notes])),
        )
        return _predicted(table, row, base, shape, work, peak)
    except PipeplanError as exc:
        return _noted(base, shorten(str(exc), 120))


def _readable(measured: dict[str, Any], key: str) -> float | None:
    """A published number as a number; None where it is not stated or is not a number."""
    try:
        return stated_number(measured, key)
    except PipeplanError:
        return None


def _noted(row: RowResult, note: str) -> RowResult:
    """``row`` with ``note`` first among its notes."""
    return replace(row, note="; ".join(filter(None, [note, row.note])))


def _predicted(
    table: dict[str, Any], row: dict[str, Any], base: RowResult, shape: TransformerShape, work: _Workload, peak: float
) -> RowResult:
    """``base`` with the row's plan's predicted time, memory and MFU (:func:`predict_row`)."""
    torchtitan, megatron = work.torchtitan, work.megatron
    tp, pp, cp = (stated_whole(row, k) or 1 for k in ("tp", "pp", "cp"))
    dp = stated_whole(row, "dp", None) or _data_parallel(row, tp * pp * cp)
    schedule, vp = schedule_for(row)
    recompute = recompute_for(row)
    gbs = stated_whole(row, "gbs", None)
    if gbs is None:
        raise PipeplanError("global batch not published")
    per_replica = gbs // dp
    unstated = torchtitan_microbatch_size(row, table, per_replica, pp, vp) if torchtitan else 1
    mbs = stated_whole(row, "mbs", unstated) or 1
    base = replace(base, config=_config_text(row, vp, mbs, dp))
    if cp > 1:
        return _noted(base, "context parallelism is not modelled")
    sequence_parallel = row.get("sequence_parallel")
    sequence_parallel = tp > 1 if sequence_parallel is None else bool(sequence_parallel)
    num_stages = pp * vp
    if gbs % dp or per_replica % mbs:
        return _noted(base, f"{gbs} samples over {dp} replicas in micro-batches of {mbs}: not a whole number")
    if shape.layers < num_stages:
        return _noted(base, f"{shape.layers} layers cannot fill {num_stages} stages")
    profile = work.profile((mbs,))
    given = GivenLayout(
        stages=_stages(shape, [u.name for u in profile.units], num_stages),
        schedule=schedule,
        micro_batch_size=mbs,
        num_microbatches=per_replica // mbs,
        recompute=(recompute == "full",) * num_stages,
        recompute_unit_wise=True,
        receive_buffers=not megatron,
    )
    cluster = work.cluster(pp * tp * dp)
    request = PlanRequest(num_ranks=pp, global_batch_size=gbs, settings=work.settings(profile))
    layout = Layout(pp=pp, dp=dp, placement="replicas-in-node", tp=tp, shard=work.shard)
    try:
        mesh = MeshSearch(
            sequence_parallel=sequence_parallel,
            vocab_parallel=True,
            trainer_collectives=True,
            overlap_grad_reduce=work.overlap_grad_reduce,
        )
        plan, memory = given_mesh_plan(profile, request, cluster, layout, given, mesh, sha256=None)
    except PipeplanError as exc:
        return _noted(base, str(exc)[:120])
    iteration = plan.predicted.iteration_s
    peak_bytes = max(r.peak_bytes for r in memory)
    return replace(
        base,
        iteration_s=iteration,
        memory_gib=peak_bytes / 2**30,
        fits=all(r.fits for r in memory),
        mfu_predicted=_predicted_mfu(base, model_flops(shape) * gbs / (iteration * pp * tp * dp * peak), iteration),
    )


def _predicted_mfu(base: RowResult, own_count: float, iteration_s: float) -> float:
    """The row's MFU at the predicted time in the FLOPs the publication counts: where it gives both its MFU and
    its time, their product is its count (publications differ on attention's causal half and the head), and the
    predicted MFU is its MFU scaled by measured over predicted time; else pipeplan's count (``own_count``)."""
    if base.mfu_published and base.measured_iteration_s:
        return base.mfu_published * base.measured_iteration_s / iteration_s
    return own_count


PER_TABLE_COLUMNS = ["table", "Spearman", "pair error %", "pairs", "fits agree", "MFU error %", "MFU within 15 %"]
"""The summary's columns: MFU error is the median over the rows that publish one of |predicted / published - 1|."""

BEST_MAX_DEVICES = 1024
"""``--best`` searches clusters up to this size (a search of thousands of devices takes minutes on a laptop)."""


def _layout_text(plan: Any) -> str:
    mesh = plan.mesh
    pp, tp, dp = (mesh.pp, mesh.tp, mesh.dp) if mesh else (plan.num_ranks, 1, 1)
    v = f" v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    again = sum(s.recompute for s in plan.stages)
    return f"{pp}x{tp}x{dp}{v} b{plan.micro_batch_size} {plan.schedule.value}, {again} of {len(plan.stages)} recompute"


def _framework_shardings(work: _Workload) -> tuple[str, ...]:
    """What the row's framework shards replicas by: torchtitan FSDP or nothing, the rest ZeRO-1 or nothing
    (:data:`planner.trainer_rules.TRAINER_SHARDING`)."""
    trainer = Trainer.TORCHTITAN if work.torchtitan else Trainer.MEGATRON
    return TRAINER_SHARDING[trainer]


def best_plans(table: dict[str, Any], rows: list[RowResult]) -> list[dict[str, Any]]:
    """Per model: pipeplan's own plan for the cluster and batch of the best published row (the most samples a
    GPU-second, as measured), searched over pp x tp x dp, schedules, micro-batches and recomputation on the same
    modelled profile, against that row as predicted. ``speedup`` above 1: pipeplan's plan is predicted faster."""
    found = []
    for model in dict.fromkeys(r.model for r in rows):
        timed = [r for r in rows if r.model == model and r.iteration_s and r.measured_iteration_s]
        if not timed:
            continue

        def per_gpu_s(r: RowResult) -> float:
            row = table["rows"][r.index]
            return r.measured_iteration_s * _gpus(row) / row["gbs"]  # type: ignore[operator]

        best = min(timed, key=per_gpu_s)
        row = table["rows"][best.index]
        entry: dict[str, Any] = {"model": model, "published": best.as_dict(), "pipeplan": None, "speedup": None}
        found.append(entry)
        if _gpus(row) > BEST_MAX_DEVICES:
            entry["note"] = f"not searched: {_gpus(row)} devices (--best searches up to {BEST_MAX_DEVICES:,})"
            continue
        shape, _ = shape_for(model, table["models"][model])
        work = _workload(table, row, shape)
        profile = work.profile((1, 2, 4))
        cluster = work.cluster(_gpus(row))
        # Costed as the row is (its framework's collectives and shardings, Megatron's tensor-parallel layout), but
        # chosen with the planner's headroom.
        settings = replace(work.settings(profile), headroom_fraction=CostSettings().headroom_fraction)
        mesh = MeshSearch(
            tensor_parallel=None,
            sequence_parallel=True,
            vocab_parallel=True,
            shards=tuple(dict.fromkeys((*_framework_shardings(work), work.shard))),
            trainer_collectives=True,
            overlap_grad_reduce=work.overlap_grad_reduce,
        )
        request = PlanRequest(num_ranks=1, global_batch_size=int(row["gbs"]), settings=settings)
        try:
            plan = plan_cluster(profile, request, cluster, mesh, sha256="0" * 64, jobs=os.cpu_count() or 1).plan
        except PipeplanError as exc:
            entry["note"] = str(exc)[:160]
            continue
        entry["pipeplan"] = {"layout": _layout_text(plan), "iteration_s": plan.predicted.iteration_s}
        entry["speedup"] = best.iteration_s / plan.predicted.iteration_s  # type: ignore[operator]
    return found


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under 3 values or without variation. Exact in
    rationals where neither side ties (then both rank spreads are equal and it is their covariance over one), so
    that a bar of 0.9 reads 0.9 and not 0.8999999999999998."""
    if len(xs) < 3:
        return None

    def ranks(values: list[float]) -> list[Fraction]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        found = [Fraction(0)] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                found[order[k]] = Fraction(i + j, 2)
            i = j + 1
        return found

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return float(sxy / sxx) if sxx == syy else float(sxy) / math.sqrt(float(sxx * syy))


def pair_errors(pairs: list[tuple[float, float]]) -> list[float]:
    """For every two (predicted, measured) rows: ``|predicted ratio / measured ratio - 1|``, in per cent."""
    return [abs((p1 / p2) / (m1 / m2) - 1) * 100 for (p1, m1), (p2, m2) in itertools.combinations(pairs, 2)]


def table_result(table: dict[str, Any], *, best: bool = False) -> dict[str, Any]:
    rows = [predict_row(table, i) for i in range(len(table.get("rows") or ()))]
    groups: dict[str, list[RowResult]] = {}
    for r in rows:
        if r.iteration_s is not None and r.measured_iteration_s is not None:
            groups.setdefault(r.model, []).append(r)
    correlations = {
        name: spearman([r.iteration_s for r in g], [r.measured_iteration_s for r in g])  # type: ignore[misc]
        for name, g in groups.items()
    }
    errors = [
        e
        for g in groups.values()
        for e in pair_errors([(r.iteration_s, r.measured_iteration_s) for r in g])  # type: ignore[misc]
    ]
    # Predicted MFU against published, where a row publishes one (or its TFLOP/s): the bar is 15 %.
    mfu_errors = [abs(r.mfu_predicted / r.mfu_published - 1) * 100 for r in rows if r.mfu_predicted and r.mfu_published]
    judged = [r for r in rows if r.fits is not None]
    agree = [r.fits == (not r.measured_oom) for r in judged if r.measured_oom is not None]
    timed = [c for c in correlations.values() if c is not None]
    return {
        "id": str(table.get("id")),
        "spearman": statistics.median(timed) if timed else None,
        "spearman_by_model": correlations,
        "pair_ratio_median_error_pct": statistics.median(errors) if errors else None,
        "pairs": len(errors),
        "oom_agreement": sum(agree) / len(agree) if agree else None,
        "mfu_median_error_pct": statistics.median(mfu_errors) if mfu_errors else None,
        "mfu_within_15_pct": f"{sum(e <= 15 for e in mfu_errors)} of {len(mfu_errors)}" if mfu_errors else None,
        "rows": [r.as_dict() for r in rows],
        **({"best": best_plans(table, rows)} if best else {}),
    }


def _markdown(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def _fmt(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _best_table(headers: list[str], rows: list[list[object]]) -> dict[str, Any]:
    return {"best": {"columns": headers, "rows": [list(map(str, r)) for r in rows]}} if rows else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", help="a tables.normalized.json file")
    parser.add_argument("--out", metavar="DIR", help="also write DIR/result.json")
    parser.add_argument("--trial", action="store_true", help="write the record as a trial (the page skips it)")
    parser.add_argument(
        "--best",
        action="store_true",
        help="also search pipeplan's own plan for each model's best published cluster and batch (minutes)",
    )
    args = parser.parse_args(argv)
    started, _ = run_started(), tee_stdout()
    tables = json.loads(Path(args.tables).read_text())
    results, summary, detail = [], [], []
    began = time.perf_counter()
    for table in tables:
        result = table_result(table, best=args.best)
        results.append(result)
        summary.append(
            [
                result["id"],
                _fmt(result["spearman"], ".2f"),
                _fmt(result["pair_ratio_median_error_pct"], ".1f"),
                result["pairs"],
                _fmt(result["oom_agreement"], ".0%"),
                _fmt(result["mfu_median_error_pct"], ".0f"),
                result["mfu_within_15_pct"] or "-",
            ]
        )
        for r in result["rows"]:
            m = r["measured"]
            detail.append(
                [
                    result["id"][:28],
                    r["model"][:22],
                    r["config"],
                    _fmt(r["iteration_s"], ".3g"),
                    _fmt(m["iteration_s"], ".3g"),
                    _fmt(
                        r["iteration_s"] / m["iteration_s"] - 1 if r["iteration_s"] and m["iteration_s"] else None,
                        "+.0%",
                    ),
                    _fmt(r["memory_gib"], ".1f") + ("" if r["fits"] in (None, True) else " (over)"),
                    _fmt(m["memory_gib"], ".1f"),
                    _fmt(r["mfu"], ".2f"),
                    _fmt(m["mfu"], ".2f"),
                    r["note"][:50],
                ]
            )
    print("## Per table\n")
    print(_markdown(PER_TABLE_COLUMNS, summary))
    print("\n## Per row\n")
    headers = [
        "table",
        "model",
        "pp x tp x dp",
        "pred s",
        "meas s",
        "error",
        "pred GiB",
        "meas GiB",
        "MFU",
        "pub MFU",
        "note",
    ]
    print(_markdown(headers, detail))
    best_headers = ["table", "model", "best published", "pred s", "pipeplan's plan", "pred s", "speed-up", "note"]
    best_rows = [
        [
            result["id"][:28],
            b["model"][:22],
            b["published"]["config"],
            _fmt(b["published"]["iteration_s"], ".3g"),
            b["pipeplan"]["layout"] if b["pipeplan"] else "-",
            _fmt(b["pipeplan"]["iteration_s"] if b["pipeplan"] else None, ".3g"),
            _fmt(b["speedup"], ".2f"),
            b.get("note", "")[:60],
        ]
        for result in results
        for b in result.get("best", ())
    ]
    if best_rows:
        print("\n## pipeplan's own plan for the best published row's cluster and batch (predicted)\n")
        print(_markdown(best_headers, best_rows))
    print(f"\n{len(detail)} rows in {time.perf_counter() - began:.1f} s")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            out / "result.json", [{k: v for k, v in r.items() if k != "spearman_by_model"} for r in results]
        )
    write_record(
        "published",
        {"tables": results, "source": args.tables},
        started=started,
        tables={
            "per_table": {
                "columns": PER_TABLE_COLUMNS,
                "rows": [list(map(str, r)) for r in summary],
            },
            "per_row": {"columns": headers, "rows": [list(map(str, r)) for r in detail]},
            **_best_table(best_headers, best_rows),
        },
        trial=args.trial,
    )


if __name__ == "__main__":
    main()
