"""Tensor parallelism at scale, on paper: the (pp, tp, dp) pipeplan chooses beside the published configurations.

    python benchmarks/bench_tensor_parallel.py            # the table of docs/BENCHMARKS.md section 11
    python benchmarks/bench_tensor_parallel.py --quick    # the smallest case of each model only
    python benchmarks/bench_tensor_parallel.py --gemm     # a matrix product split T ways on this CPU

Two models, each on the kind of cluster its published configuration ran on, 8 GPUs of 80 GiB a node:

- **GPT-3 175B** (96 layers, hidden 12,288, 96 heads, vocabulary 51,200, sequence 2,048, tied head; Narayanan et
  al., SC 2021, Table 2: PTD-P with tensor 8 x pipeline 12, global batch 1,536, on 384 and 768 A100 GPUs of
  Selene), by the ``a100-80gb`` device model, without flash attention (SC21 predates it); plain data parallelism
  (``--shard none``: SC21 predates the distributed optimizer).
- **Llama 3 70B** (80 layers, hidden 8,192, 64 heads, 8 key-value heads, MLP 28,672, vocabulary 128,256,
  sequence 8,192, untied head), by the ``h100-80gb`` device model, with flash attention. torchtitan's benchmark
  (``benchmarks/llama3_h100_202412_torchtitan.md``, Table 4): FSDP 32 x TP 8 on 256 H100s, global batch 512;
  NVIDIA Megatron-Bridge's H100 recipe (``llama3_70b_pretrain_64gpu_h100_bf16_config``): TP 4 x PP 4 x CP 2 on 64
  H100s, global batch 256, read here as TP 4 x PP 4 x DP 4 (pipeplan has no context parallelism); ``--shard full``
  (FSDP), as torchtitan runs it, and the 64-GPU case again with ``--shard optimizer`` (ZeRO-1), as Megatron's
  distributed optimizer runs it.

The profiles are not measured: ``pipeplan profile --device-model`` builds them (profiles/modelled.py: each
operation through the GPU's roofline, memory by the trainers' accounting, bf16 weights and fp32 Adam state), and
the links are the device model's, NVLink at NCCL's rate (docs/cost-model.md, "Device models"). Every row is
pipeplan's search, costed with the collectives of the trainer that ran the published configuration (``plan --for
megatron|torchtitan``): "pipeplan" searches every pp, tp and dp; a published row fixes its pp and tp (dp is what the
devices leave) and lets pipeplan pick the micro-batch size, schedule and recomputation. Throughput is predicted
(the simulated step), never measured here: docs/BENCHMARKS.md section 16 holds the device models against what
such clusters published.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from planner.cluster import ClusterResult, MeshSearch, plan_cluster  # noqa: E402
from planner.cost import CostSettings  # noqa: E402
from planner.errors import PipeplanError  # noqa: E402
from planner.formatting import format_table  # noqa: E402
from planner.planning import cluster_devices, trainer_collectives  # noqa: E402
from planner.request import ClusterOptions, PlanRequest, calibration_settings  # noqa: E402
from profiles.device_model import DeviceModel, device_model  # noqa: E402
from profiles.format import Profile  # noqa: E402
from profiles.modelled import TransformerShape, modelled_profile  # noqa: E402

MEGATRON = {"sequence_parallel": True, "vocab_parallel": True}
"""The layout the published configurations ran (Megatron-LM, torchtitan): vocabulary-parallel embedding and head,
sequence parallelism; not pipeplan's runtime's, whose embeddings and head stay whole."""

__all__ = ["GPT3_175B", "LLAMA3_70B", "CASES", "run_case", "case_profile"]

SIZES = (2, 4, 8)
"""Micro-batch sizes profiled: from 2, so that 12 pipeline ranks x 1,536 / 4 / b micro-batches stay within the
search's limit of 4,096 (README, "Limits")."""

GPT3_175B = TransformerShape("GPT-3 175B", "gpt", 96, 12288, 96, 96, 4 * 12288, 51200, 2048, True)
LLAMA3_70B = TransformerShape("Llama 3 70B", "llama", 80, 8192, 64, 8, 28672, 128256, 8192, False)


@dataclass(frozen=True)
class Case:
    model: TransformerShape
    gpu: str
    """The device model's name."""
    devices: int
    global_batch: int
    shard: str
    published: tuple[int, int] | None
    """(pp, tp) of the published configuration, None where none was published at this size."""
    source: str
    trainer: str
    """Whose collectives both rows are costed with (``plan --for TRAINER``): the published configuration's."""


CASES = (  # smallest first, the two models in turn
    Case(GPT3_175B, "a100-80gb", 64, 512, "none", None, "-", "megatron"),
    # The recipe's layout with FSDP, as torchtitan runs it, and with Megatron's distributed optimizer (ZeRO-1).
    Case(LLAMA3_70B, "h100-80gb", 64, 256, "full", (4, 4), "Megatron-Bridge recipe (CP 2 as DP), FSDP", "torchtitan"),
    Case(
        LLAMA3_70B, "h100-80gb", 64, 256, "optimizer", (4, 4), "Megatron-Bridge recipe (CP 2 as DP), ZeRO-1", "megatron"
    ),
    Case(GPT3_175B, "a100-80gb", 384, 1536, "none", (12, 8), "Megatron SC21, Table 2", "megatron"),
    Case(LLAMA3_70B, "h100-80gb", 256, 512, "full", (1, 8), "torchtitan, Llama 3.1 70B Table 4", "torchtitan"),
    Case(GPT3_175B, "a100-80gb", 768, 1536, "none", (12, 8), "Megatron SC21, Table 2", "megatron"),
    Case(LLAMA3_70B, "h100-80gb", 1024, 2048, "full", None, "-", "torchtitan"),
)


def case_profile(case: Case) -> tuple[Profile, DeviceModel]:
    """The case's model profiled by its GPU's device model (flash attention on the H100, not under SC21)."""
    gpu = device_model(case.gpu)
    return modelled_profile(case.model, gpu, SIZES, flash_attention=case.model.arch == "llama"), gpu


def run_case(case: Case, jobs: int) -> list[list[object]]:
    """The case's rows: pipeplan's choice, and the published configuration under the same model."""
    profile, gpu = case_profile(case)
    # The profile's own runtime terms (a device model's: the shipped CUDA estimate's), as `plan` takes them.
    settings = CostSettings(
        link_bytes_per_s=gpu.inter_node_bytes_per_s,
        link_latency_s=gpu.link_latency_s,
        **calibration_settings("auto", "cuda", profile),  # type: ignore[arg-type]
    )
    request = PlanRequest(num_ranks=1, global_batch_size=case.global_batch, settings=settings)
    cluster = cluster_devices(profile, ClusterOptions(devices=case.devices, shard=case.shard), None)  # as `plan`
    layout = {**MEGATRON, **trainer_collectives(case.trainer)}
    runs: list[tuple[str, ClusterResult | str, float]] = []
    started = time.perf_counter()
    chosen = plan_cluster(
        profile, request, cluster, MeshSearch(tensor_parallel=None, **layout), sha256="0" * 64, jobs=jobs
    )
    runs.append(("pipeplan", chosen, time.perf_counter() - started))
    if case.published is not None:
        pp, tp = case.published
        started = time.perf_counter()
        try:
            fixed: ClusterResult | str = plan_cluster(
                profile,
                request,
                cluster,
                MeshSearch(pipeline_degree=pp, tensor_parallel=tp, **layout),
                sha256="0" * 64,
                jobs=jobs,
            )
        except PipeplanError as exc:
            fixed = str(exc)
        runs.append((case.source, fixed, time.perf_counter() - started))
    rows = []
    tokens = case.global_batch * case.model.seq_len
    for label, result, wall in runs:
        head = [case.model.name, case.devices, case.global_batch, label]
        if isinstance(result, str):
            rows.append([*head, "-", "-", "-", "-", "-", "-", result[:60], f"{wall:.1f} s"])
            continue
        plan, mesh = result.plan, result.plan.mesh
        assert mesh is not None
        peak = max(s.memory_bytes.peak for s in plan.stages)
        recomputed = sum(s.recompute for s in plan.stages)
        rows.append(
            [
                *head,
                f"{mesh.pp} x {mesh.tp} x {mesh.dp}",
                f"{plan.schedule.value} b={plan.micro_batch_size} M={plan.num_microbatches}"
                + (f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""),
                f"{recomputed}/{plan.num_stages}",
                f"{plan.predicted.iteration_s:.3g} s",
                f"{tokens / plan.predicted.iteration_s / mesh.used_devices:,.0f}",
                f"{plan.predicted.bubble_fraction:.0%}",
                f"{peak / 2**30:.1f} GiB, tail {max(plan.predicted.runtime.step_tail_s, default=0.0):.2g} s",
                f"{wall:.1f} s",
            ]
        )
    return rows


def gemm_efficiency(hidden: int = 768, rows: int = 1024, repeats: int = 10) -> list[list[object]]:
    """How much of its rate a matrix product keeps when split ``T`` ways, on this machine's CPU: by columns (a
    tensor-parallel device's ``rows x h @ h x 4h/T``) and by rows (``rows/T x h @ h x 4h``, a smaller micro-batch:
    what a profile's micro-batch sizes measure, from which the cost model takes its fixed part). Efficiency =
    ``t(1) / (T t(T))``, medians of ``repeats`` runs, float32, 1 intra-op thread."""
    import statistics

    import torch

    torch.set_num_threads(1)
    weight = torch.randn(hidden, 4 * hidden)
    inputs = torch.randn(rows, hidden)

    def median_s(a: torch.Tensor, b: torch.Tensor) -> float:
        times = []
        for _ in range(repeats + 2):
            started = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - started)
        return statistics.median(times[2:])

    base = median_s(inputs, weight)
    found = []
    for t in (1, 2, 4, 8):
        columns = median_s(inputs, weight[:, : 4 * hidden // t].contiguous())
        by_rows = median_s(inputs[: rows // t].contiguous(), weight)
        found.append([t, f"{columns * 1e3:.2f} ms", f"{base / (t * columns):.0%}", f"{base / (t * by_rows):.0%}"])
    return found


HEADERS = [
    "model",
    "GPUs",
    "batch",
    "configuration",
    "pp x tp x dp",
    "schedule",
    "recompute",
    "step",
    "tokens/s/GPU",
    "bubble",
    "peak memory, step tail",
    "search",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the smallest case of each model only")
    parser.add_argument("--jobs", type=int, default=1, help="layouts searched at once (the plan is the same)")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--gemm", action="store_true", help="only: a split matrix product's efficiency on this CPU")
    args = parser.parse_args(argv)
    if args.gemm:
        headers = ["T", "columns / T", "efficiency, split by columns", "split by rows (smaller micro-batch)"]
        print(format_table(headers, gemm_efficiency(), align=">>>>"))
        return
    started, printed = run_started(), tee_stdout()
    cases = [c for c in CASES if not args.quick or c.devices == 64]
    if args.markdown:  # row by row, as each case is planned
        print("| " + " | ".join(HEADERS) + " |")
        print("|" + "---|" * len(HEADERS), flush=True)
        for case in cases:
            for row in run_case(case, args.jobs):
                print("| " + " | ".join(map(str, row)) + " |", flush=True)
        tables = tables_in(printed.getvalue(), ("configurations",))
        write_record("tensor_parallel", {}, started=started, tables=tables, trial=args.quick)
        return
    rows = [row for case in cases for row in run_case(case, args.jobs)]
    print(format_table(HEADERS, rows, align="<>><<<>>>><>"))
    table = {"columns": list(HEADERS), "rows": [list(map(str, r)) for r in rows]}
    write_record("tensor_parallel", {}, started=started, tables={"configurations": table}, trial=args.quick)


if __name__ == "__main__":
    main()
