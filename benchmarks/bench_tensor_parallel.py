"""Tensor parallelism at scale, on paper: the (pp, tp, dp) pipeplan chooses beside the published configurations.

    python benchmarks/bench_tensor_parallel.py            # the table of docs/BENCHMARKS.md section 11
    python benchmarks/bench_tensor_parallel.py --quick    # the smallest case of each model only
    python benchmarks/bench_tensor_parallel.py --gemm     # a matrix product split T ways on this CPU

Two models, each on the kind of cluster its published configuration ran on, 8 GPUs of 80 GiB a node:

- **GPT-3 175B** (96 layers, hidden 12,288, 96 heads, vocabulary 51,200, sequence 2,048, tied head; Narayanan et
  al., SC 2021, Table 2: PTD-P with tensor 8 x pipeline 12, global batch 1,536, on 384 and 768 A100 GPUs of
  Selene). A100s: NVLink 300 GB/s each way in a node, 8 x 200 Gb/s InfiniBand a node (25 GB/s a GPU) between;
  plain data parallelism (``--shard none``: SC21 predates the distributed optimizer).
- **Llama 3 70B** (80 layers, hidden 8,192, 64 heads, 8 key-value heads, MLP 28,672, vocabulary 128,256,
  sequence 8,192, untied head). torchtitan's benchmark (``benchmarks/llama3_h100_202412_torchtitan.md``, Table
  4): FSDP 32 x TP 8 on 256 H100s, global batch 512; NVIDIA Megatron-Bridge's H100 recipe
  (``llama3_70b_pretrain_64gpu_h100_bf16_config``): TP 4 x PP 4 x CP 2 on 64 H100s, global batch 256, read here
  as TP 4 x PP 4 x DP 4 (pipeplan has no context parallelism). H100s: NVLink 450 GB/s, 400 Gb/s (50 GB/s) a GPU
  between nodes; ``--shard full`` (FSDP), as torchtitan runs it, and the 64-GPU case again with ``--shard
  optimizer`` (ZeRO-1), as Megatron's distributed optimizer runs it.

The profiles are not measured: each unit's time is its FLOPs (forward ``24 b s h^2 + 4 b s^2 h`` for a GPT block,
the projections, scores and SwiGLU MLP for a Llama block, backward twice the forward) at an assumed sustained
rate, 60 % of the A100's 312 TFLOP/s and 50 % of the H100's 989 TFLOP/s in bf16; activations as Korthikanti et
al. count them (``s b h (34 + 5 a s / h)`` bytes a block, GPT-3 without flash attention; ``34 s b h`` for Llama
with it); bf16 weights with fp32 Adam state (16 bytes a parameter). Times are proportional to the work, so
tensor parallelism here costs only its collectives: a measured profile adds the fixed part of each unit's time
(docs/cost-model.md, "Tensor parallelism"). Every row is pipeplan's search: "chosen" searches every pp, tp and dp;
"published" fixes the published pp and tp (dp is what the devices leave) and lets pipeplan pick the micro-batch
size, schedule and recomputation. Throughput is predicted (the simulated step), never measured here.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from planner.cluster import Cluster, ClusterResult, MeshSearch, plan_cluster  # noqa: E402
from planner.cost import CostSettings  # noqa: E402
from planner.errors import PipeplanError  # noqa: E402
from planner.formatting import format_table  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from profiles.format import DeviceInfo, ModelInfo, Profile, TensorFlow, UnitProfile, WholeModel  # noqa: E402

MEGATRON = {"sequence_parallel": True, "vocab_parallel": True}
"""The layout the published configurations ran (Megatron-LM, torchtitan): vocabulary-parallel embedding and head,
sequence parallelism; not pipeplan's runtime's, whose embeddings and head stay whole."""

__all__ = ["ModelShape", "Hardware", "analytic_profile", "GPT3_175B", "LLAMA3_70B", "CASES", "run_case"]

SIZES = (2, 4, 8)
"""Micro-batch sizes profiled: from 2, so that 12 pipeline ranks x 1,536 / 4 / b micro-batches stay within the
search's limit of 4,096 (README, "Limits")."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    style: str
    """``gpt`` (learned positions, GELU MLP, tied head) or ``llama`` (RoPE, SwiGLU, untied head)."""
    flash: bool
    """Attention without the ``5 a s^2 b`` bytes of scores saved (flash attention)."""


@dataclass(frozen=True)
class Hardware:
    name: str
    flops_per_s: float
    """Sustained bf16 rate of the units' matrices (assumed)."""
    memory_bytes: int
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    latency_s: float = 1e-5


GPT3_175B = ModelShape("GPT-3 175B", 96, 12288, 96, 96, 4 * 12288, 51200, 2048, "gpt", flash=False)
LLAMA3_70B = ModelShape("Llama 3 70B", 80, 8192, 64, 8, 28672, 128256, 8192, "llama", flash=True)
A100 = Hardware("A100 80GB", 0.6 * 312e12, 80 * 2**30, 300e9, 25e9)
H100 = Hardware("H100 80GB", 0.5 * 989e12, 80 * 2**30, 450e9, 50e9)


def _block(m: ModelShape) -> tuple[int, float, float]:
    """(parameters, forward FLOPs per sample, activation bytes saved per sample) of one block."""
    h, s, f = m.hidden, m.seq, m.ffn
    if m.style == "gpt":
        params = 12 * h * h + 13 * h
        flops = 2 * (12 * s * h * h + 2 * s * s * h)  # 24 b s h^2 + 4 b s^2 h, FLOPs = 2 multiply-adds
    else:
        kv = h * m.kv_heads // m.heads
        params = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
        flops = 2 * (s * h * (2 * h + 2 * kv) + 2 * s * s * h + 3 * s * h * f)
    saved = s * h * (34 + (0 if m.flash else 5 * m.heads * s / h))
    return params, flops, saved


def analytic_profile(m: ModelShape, hw: Hardware) -> Profile:
    """A profile of ``m`` whose times are FLOPs at ``hw``'s rate (module docstring), named as transformers names
    GPT-2 (``transformer.h.N``) or Llama (``model.layers.N``)."""
    h, s, v = m.hidden, m.seq, m.vocab
    params, flops, saved = _block(m)
    hidden_bytes = 2 * s * h  # bf16 b x s x h per sample

    def unit(
        name: str, kind: str, count: int, forward_flops: float, saved_bytes: float, **extra: object
    ) -> UnitProfile:
        return UnitProfile(
            name=name,
            type=kind,
            param_count=count,
            param_bytes=2 * count,
            forward_s=tuple(b * forward_flops / hw.flops_per_s for b in SIZES),
            backward_s=tuple(2 * b * forward_flops / hw.flops_per_s for b in SIZES),
            flops=tuple(int(b * forward_flops / 2) for b in SIZES),
            output_bytes=tuple(b * hidden_bytes for b in SIZES),
            saved_bytes=tuple(int(b * saved_bytes) for b in SIZES),
            transient_bytes=tuple(int(b * (2 * hidden_bytes + 2 * s * m.ffn)) for b in SIZES),
            **extra,  # type: ignore[arg-type]
        )

    # An embedding gathers rows: its time is its output's bytes at the same rate (it is nothing beside a block).
    lookup = 2 * s * h
    if m.style == "gpt":
        units = [
            unit("transformer.wte", "Embedding", v * h, lookup, 0),
            unit("transformer.wpe", "Embedding", s * h, lookup, 0),
        ]
        prefix, block_type, norm, head_params = "transformer.h", "GPT2Block", "transformer.ln_f", 0
        tied = {"tied_params": ("transformer.wte.weight",), "tied_param_count": v * h}
    else:
        units = [unit("model.embed_tokens", "Embedding", v * h, lookup, 0)]
        prefix, block_type, norm, head_params = "model.layers", "LlamaDecoderLayer", "model.norm", v * h
        tied = {}
    units += [unit(f"{prefix}.{k}", block_type, params, flops, saved) for k in range(m.layers)]
    units.append(unit(norm, "LayerNorm", 2 * h, 4 * s * h, hidden_bytes))
    # The head saves its input and the fp32 logits of the loss.
    units.append(unit("lm_head", "Linear", head_params, 2 * s * h * v, hidden_bytes + 4 * s * v, **tied))
    n = len(units)
    tensors = [
        TensorFlow(
            -1, (0,) if m.style == "llama" else (0, 1), tuple(8 * s * b for b in SIZES), "int64", False, "input_ids"
        )
    ]
    tensors += [
        TensorFlow(k, (k + 1,), tuple(b * hidden_bytes for b in SIZES), "bfloat16", True, f"hidden{k}")
        for k in range(1 if m.style == "gpt" else 0, n - 1)
    ]
    if m.style == "gpt":  # the token and position embeddings both feed the first block
        tensors.insert(1, TensorFlow(0, (2,), tuple(b * hidden_bytes for b in SIZES), "bfloat16", True, "tokens"))
    forward = tuple(sum(u.forward_s[i] for u in units) for i in range(len(SIZES)))
    backward = tuple(sum(u.backward_s[i] for u in units) for i in range(len(SIZES)))
    return Profile(
        model=ModelInfo(m.name, "ab" * 32, sum(u.param_count for u in units), 2 * sum(u.param_count for u in units)),
        device=DeviceInfo("cuda", hw.name, hw.memory_bytes, "bfloat16", "2.13.0"),
        micro_batch_sizes=SIZES,
        units=tuple(units),
        tensors=tuple(tensors),
        whole_model=WholeModel(forward, backward),
        settings={"attention_heads": m.heads, "kv_heads": m.kv_heads, "seq_len": s},
    )


@dataclass(frozen=True)
class Case:
    model: ModelShape
    hardware: Hardware
    devices: int
    global_batch: int
    shard: str
    published: tuple[int, int] | None
    """(pp, tp) of the published configuration, None where none was published at this size."""
    source: str


CASES = (  # smallest first, the two models in turn
    Case(GPT3_175B, A100, 64, 512, "none", None, "-"),
    Case(LLAMA3_70B, H100, 64, 256, "full", (4, 4), "Megatron-Bridge recipe (CP 2 as DP)"),
    # Megatron's data parallelism is a distributed optimizer (ZeRO-1), not FSDP: the same case planned so.
    Case(LLAMA3_70B, H100, 64, 256, "optimizer", (4, 4), "Megatron-Bridge recipe, --shard optimizer (ZeRO-1)"),
    Case(GPT3_175B, A100, 384, 1536, "none", (12, 8), "Megatron SC21, Table 2"),
    Case(LLAMA3_70B, H100, 256, 512, "full", (1, 8), "torchtitan, Llama 3.1 70B Table 4"),
    Case(GPT3_175B, A100, 768, 1536, "none", (12, 8), "Megatron SC21, Table 2"),
    Case(LLAMA3_70B, H100, 1024, 2048, "full", None, "-"),
)


def run_case(case: Case, jobs: int) -> list[list[object]]:
    """The case's rows: pipeplan's choice, and the published configuration under the same model."""
    profile = analytic_profile(case.model, case.hardware)
    hw = case.hardware
    request = PlanRequest(
        num_ranks=1,
        global_batch_size=case.global_batch,
        settings=CostSettings(link_bytes_per_s=hw.inter_node_bytes_per_s, link_latency_s=hw.latency_s),
    )
    cluster = Cluster(case.devices, 8, hw.intra_node_bytes_per_s, hw.inter_node_bytes_per_s, hw.latency_s, case.shard)
    runs: list[tuple[str, ClusterResult | str, float]] = []
    started = time.perf_counter()
    chosen = plan_cluster(
        profile, request, cluster, MeshSearch(tensor_parallel=None, **MEGATRON), sha256="0" * 64, jobs=jobs
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
                MeshSearch(pipeline_degree=pp, tensor_parallel=tp, **MEGATRON),
                sha256="0" * 64,
                jobs=jobs,
            )
        except PipeplanError as exc:
            fixed = str(exc)
        runs.append((case.source, fixed, time.perf_counter() - started))
    rows = []
    tokens = case.global_batch * case.model.seq
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
