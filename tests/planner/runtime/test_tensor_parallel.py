"""Tensor parallelism inside pipeline stages: layouts on one process, pp x tp (x dp) on gloo processes against one
process (loss and every gradient, sharded ones gathered with ``full_tensor()``)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from conftest import make_plan
from export_plans import on_mesh
from torch import nn

from cli_checks import assert_fails
from planner.errors import PipeplanError, TensorParallelError, UsageError
from planner.plan import Plan, save_plan
from planner.runtime.apply import apply_plan, tied_parameter_groups
from planner.runtime.launch import run_ranks
from planner.runtime.run_options import VerifyOptions
from planner.runtime.tensor_parallel import (
    _whole_linear,
    builtin_tp_plan,
    local_shapes,
    original_gradient,
    tp_layout,
)
from planner.runtime.verify import reference_step, verify_plan
from profiles.fingerprint import model_fingerprint
from profiles.workload import Workload, as_tuple, load_workload

LLAMA = "tests/model_zoo.py:llama"  # 4 heads, 2 key/value heads, tied embeddings
GPT2 = "tests/model_zoo.py:gpt2"  # 2 heads, fused c_attn (Conv1D)
UNITS = {
    LLAMA: ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"),
    GPT2: ("transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1", "transformer.ln_f", "lm_head"),
}
SPLIT = {LLAMA: "model.layers.1", GPT2: "transformer.h.1"}


def _workload(spec: str) -> Workload:
    return replace(load_workload(spec), units=UNITS[spec])


def _tp_plan(spec: str, *, pp: int = 2, dp: int = 1, tp: int = 2, shard: str = "none") -> Plan:
    """A hand-built plan of ``pp`` stages on a pp x dp x tp mesh (replica r, pipeline rank p on ranks
    (r * pp + p) * tp ...)."""
    splits = [SPLIT[spec]] if pp == 2 else []
    base = make_plan(_workload(spec), splits, "1f1b", num_ranks=pp, num_microbatches=2, micro_batch_size=2)
    # The layout pipeplan's runtime runs (a plan without these keys was planned with Megatron's, and is refused).
    return on_mesh(base, dp, shard=shard, tp=tp, sequence_parallel=False, vocab_parallel=False)


# -- one process ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "sharded"),
    [
        (LLAMA, {"q_proj": False, "k_proj": False, "v_proj": False, "o_proj": True, "gate_proj": False}),
        (GPT2, {"attn.c_attn": False, "attn.c_proj": True, "mlp.c_fc": False, "mlp.c_proj": True}),
        ("tests/model_zoo.py:bert_mlm", {"query": False, "attention.output.dense": True, "intermediate.dense": False}),
        ("tests/model_zoo.py:vit", {"q_proj": False, "o_proj": True, "mlp.fc1": False, "mlp.fc2": True}),
    ],
)
def test_builtin_layouts_shard_attention_and_mlp(spec: str, sharded: dict[str, bool]) -> None:
    from torch.distributed.tensor.parallel import RowwiseParallel

    plan = builtin_tp_plan(load_workload(spec).model, 2)
    for suffix, rowwise in sharded.items():
        found = [style for fqn, style in plan.items() if fqn.endswith(suffix)]
        assert len(found) == 2, (suffix, sorted(plan))  # one per layer
        assert all(isinstance(style, RowwiseParallel) == rowwise for style in found)


def test_a_model_without_a_layout_is_refused_in_one_line() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    with pytest.raises(TensorParallelError) as error:
        tp_layout(model, 2)
    message = str(error.value)
    assert "\n" not in message and "no tensor-parallel layout" in message and "tp_plan" in message
    assert isinstance(error.value, PipeplanError)


def test_heads_that_the_degree_does_not_divide_are_refused() -> None:
    with pytest.raises(TensorParallelError, match="divisible by 4"):
        tp_layout(load_workload(LLAMA).model, 4)  # 2 key/value heads


def test_a_tp_plan_hook_is_taken_and_checked() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    layout = tp_layout(model, 2, lambda m: {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert [(s.fqn, s.rowwise) for s in layout.linears] == [("0", False), ("2", True)]
    with pytest.raises(TensorParallelError, match="nn.Linear"):
        tp_layout(model, 2, lambda m: {"1": ColwiseParallel()})
    with pytest.raises(TensorParallelError, match="other layouts"):
        tp_layout(model, 2, lambda m: {"0": ColwiseParallel(use_local_output=False)})


def test_local_shapes_is_one_ranks_model_and_restores_it() -> None:
    workload = load_workload(GPT2)
    model = workload.model
    before = model_fingerprint(model)
    layout = tp_layout(model, 2)
    inputs = as_tuple(workload.make_batch(2)[0])
    with local_shapes(model, layout, 1):
        attn = model.get_submodule("transformer.h.0.attn")
        assert attn.split_size == 16 and attn.c_attn.out_features == 48  # one of two heads of q, k and v
        model(*inputs)  # runs with its local shapes
    assert model_fingerprint(model) == before and type(attn.c_attn).__name__ == "Conv1D"


def test_a_fused_conv1d_goes_back_to_its_own_layout() -> None:
    model = load_workload(GPT2).model
    spec = tp_layout(model, 2).linear("transformer.h.0.attn.c_attn")
    assert spec is not None and spec.parts == 3 and spec.transposed
    conv = model.get_submodule(spec.fqn)
    whole = _whole_linear(conv, spec, 2)
    # Rank 0's block holds the first head of q, of k and of v (16 features each).
    q, k, v = conv.weight.detach().t().split(32)
    torch.testing.assert_close(whole.weight[:48], torch.cat([q[:16], k[:16], v[:16]]), rtol=0, atol=0)
    layout = tp_layout(model, 2)
    torch.testing.assert_close(original_gradient(layout, f"{spec.fqn}.weight", whole.weight), conv.weight)
    torch.testing.assert_close(original_gradient(layout, f"{spec.fqn}.bias", whole.bias), conv.bias)


# -- gloo processes ---------------------------------------------------------------------------------------------


def _step(rank: int, world_size: int, cases: list[tuple[str, Plan]]) -> list[tuple[float | None, dict]]:
    out = []
    for spec, plan in cases:
        workload = load_workload(spec)
        x, y = workload.make_batch(plan.mesh.global_batch_size)
        run = apply_plan(plan, workload.model, x, workload.loss_fn, device="cpu", tp_plan=workload.tp_plan)
        loss = run.step(x, y)
        out.append((None if loss is None else loss.item(), run.full_gradients()))
    return out


# Every case on 4 processes, all in one launch (a rank's start, mostly imports, costs seconds on 2 cores).
CASES = {
    "llama pp2 x tp2": (LLAMA, {"pp": 2}),
    "gpt2 pp2 x tp2": (GPT2, {"pp": 2}),
    "gpt2 dp2 x tp2 fsdp2": (GPT2, {"pp": 1, "dp": 2, "shard": "full"}),
    "llama dp2 x tp2 ddp": (LLAMA, {"pp": 1, "dp": 2, "shard": "none"}),
}


@pytest.fixture(scope="module")
def stepped() -> tuple[list[tuple[str, Plan]], list]:
    cases = [(spec, _tp_plan(spec, **options)) for spec, options in CASES.values()]
    return cases, run_ranks(_step, (cases,), 4, timeout_s=300)


@pytest.mark.parametrize("case", range(len(CASES)), ids=list(CASES))
def test_tensor_parallel_step_equals_one_process(stepped, case: int) -> None:
    cases, per_rank = stepped
    spec, plan = cases[case]
    mesh = plan.mesh
    ref_loss, ref_grads = reference_step(load_workload(spec), plan)
    # Every tensor-parallel rank of a last stage returns its replica's loss; the step's is the replicas' mean.
    last = {row[-1] + t: replica for replica, row in enumerate(mesh.devices) for t in range(mesh.tp)}
    assert [per_rank[r][case][0] is None for r in range(4)] == [r not in last for r in range(4)]
    replica_loss = [per_rank[row[-1]][case][0] for row in mesh.devices]
    for r, replica in last.items():
        assert per_rank[r][case][0] == replica_loss[replica]
    torch.testing.assert_close(sum(replica_loss) / mesh.dp, ref_loss, atol=1e-6, rtol=1e-5)
    seen: set[str] = set()
    for rank in range(4):
        for name, grad in per_rank[rank][case][1].items():
            torch.testing.assert_close(grad, ref_grads[name], atol=1e-6, rtol=1e-5, msg=f"rank {rank} {name}")
            seen.add(name)
    ties = {n: g for g in tied_parameter_groups(load_workload(spec).model) for n in g}
    assert all(n in seen or any(t in seen for t in ties.get(n, ())) for n in ref_grads)


def test_verify_runs_pp2_x_tp2_on_four_processes() -> None:
    plan = _tp_plan(LLAMA)
    report = verify_plan(
        plan,
        LLAMA,
        VerifyOptions(
            mode="auto",
            steps=1,
            warmup=0,
            check_numerics=True,
            timeout_s=240,
            min_warmup_s=0,
            min_time_s=0,
            tolerance=0.25,
        ),
    )
    assert report.mode == "processes" and [r.rank for r in report.ranks] == [0, 1]
    assert report.numerics is not None and report.numerics.ok, report.numerics
    assert report.numerics.max_grad_abs_diff < 1e-6


@pytest.mark.parametrize(
    ("switches", "named"),
    [
        ({"sequence_parallel": True, "vocab_parallel": True}, "(sequence parallelism and a vocabulary-parallel"),
        ({"sequence_parallel": False, "vocab_parallel": True}, "(a vocabulary-parallel embedding and head)"),
        ({}, "(sequence parallelism and a vocabulary-parallel"),  # a plan file from before the layout was recorded
    ],
)
def test_a_megatron_layout_plan_is_refused_in_one_line(tmp_path, capsys, switches: dict, named: str) -> None:
    """Its memory and times are a trainer's (vocabulary split, sequence split), not what this runtime runs."""
    plan = _tp_plan(LLAMA)
    constraints = {k: v for k, v in plan.constraints.items() if k not in ("sequence_parallel", "vocab_parallel")}
    megatron = replace(plan, constraints={**constraints, **switches})
    workload = load_workload(LLAMA)
    x, _ = workload.make_batch(megatron.mesh.global_batch_size)
    with pytest.raises(UsageError, match="re-plan with --tp-layout blocks"):
        apply_plan(megatron, workload.model, x, workload.loss_fn, device="cpu")
    with pytest.raises(UsageError, match=re.escape(named)):
        verify_plan(megatron, LLAMA)  # before any process starts
    save_plan(megatron, tmp_path / "plan.json")
    assert_fails(capsys, ["verify", tmp_path / "plan.json", "--model", LLAMA], "pipeplan's runtime does not run")


def test_replay_refuses_a_tensor_parallel_plan() -> None:
    with pytest.raises(TensorParallelError, match="replay runs one process"):
        verify_plan(_tp_plan(LLAMA), LLAMA, VerifyOptions(mode="replay"))  # refused before it runs
