"""apply_plan on 2 gloo processes equals one process: same loss, same gradient for every parameter."""

from __future__ import annotations

import pytest
import torch
from conftest import make_plan

from planner.errors import ModelMismatchError, ScheduleError
from planner.runtime.apply import apply_plan, check_fingerprint, tied_parameter_groups
from planner.runtime.launch import run_ranks
from planner.runtime.stages import split_stages
from profiles.models import BUILTIN_MODELS

torch.set_num_threads(1)

# (schedule, split points, recompute per stage) for each model; interleaved runs 4 stages, 2 per rank.
CASES = {
    "gpt2-tiny": [
        ("gpipe", ["transformer.h.2"], ()),
        ("1f1b", ["transformer.h.2"], (True, False)),
        ("interleaved-1f1b", ["transformer.h.1", "transformer.h.2", "transformer.h.3"], ()),
        # A cut between wte and wpe sends integer position ids: torch must not infer shapes on empty tensors.
        ("1f1b", ["transformer.wpe"], ()),
    ],
    "unet-small": [
        ("gpipe", ["mid"], ()),
        ("1f1b", ["mid"], (False, True)),
        ("interleaved-1f1b", ["enc.2", "dec.0", "dec.2"], ()),
    ],
}


def _plans(model: str):
    workload = BUILTIN_MODELS[model]()
    return [make_plan(workload, splits, sched, recompute=rec) for sched, splits, rec in CASES[model]]


def _step_all(rank: int, world_size: int, model: str, plans) -> list[dict]:
    """On each rank: for each plan, one step from the same fresh weights; loss and grads by FQN."""
    out = []
    for plan in plans:
        workload = BUILTIN_MODELS[model]()
        x, y = workload.make_batch(plan.global_batch_size)
        run = apply_plan(plan, workload.model, x, workload.loss_fn, device="cpu")
        loss = run.step(x, y)
        grads = {name: p.grad.clone() for name, p in run.named_parameters()}
        out.append({"loss": loss, "grads": grads, "stages": run.stage_indices})
    return out


def _reference(model: str, plan) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One process: the mean of the micro-batch losses, as torch's schedules compute it."""
    workload = BUILTIN_MODELS[model]()
    x, y = workload.make_batch(plan.global_batch_size)
    m = plan.num_microbatches
    losses = [workload.loss_fn(workload.model(xm), ym) for xm, ym in zip(x.chunk(m), y.chunk(m), strict=True)]
    loss = torch.stack(losses).mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in workload.model.named_parameters(remove_duplicate=False)}


@pytest.fixture(scope="module", params=sorted(CASES))
def stepped(request):
    model = request.param
    plans = _plans(model)
    return model, plans, run_ranks(_step_all, (model, plans), 2, timeout_s=240)


def test_pipeline_equals_single_process(stepped) -> None:
    model, plans, per_rank = stepped
    for i, plan in enumerate(plans):
        ref_loss, ref_grads = _reference(model, plan)
        last_rank = plan.stages[-1].rank
        assert per_rank[1 - last_rank][i]["loss"] is None
        torch.testing.assert_close(per_rank[last_rank][i]["loss"], ref_loss, atol=1e-5, rtol=1e-4)
        seen = set()
        for rank in range(2):
            assert per_rank[rank][i]["stages"] == tuple(s.index for s in plan.stages if s.rank == rank)
            for name, grad in per_rank[rank][i]["grads"].items():
                torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=f"{plan.schedule} {name}")
                seen.add(name)
        # Every parameter of the model got a gradient on some rank (tied ones under either name).
        ties = {n: g for g in tied_parameter_groups(BUILTIN_MODELS[model]().model) for n in g}
        assert all(n in seen or any(t in seen for t in ties.get(n, ())) for n in ref_grads)


def test_gpt2_tied_embedding_is_detected() -> None:
    model = BUILTIN_MODELS["gpt2-tiny"]().model
    assert tied_parameter_groups(model) == [("transformer.wte.weight", "lm_head.weight")]


def test_skip_connections_are_relayed_through_middle_stages() -> None:
    workload = BUILTIN_MODELS["unet-small"]()
    x, y = workload.make_batch(2)
    stages = split_stages(workload.model, (x,), ["enc.2", "dec.0", "dec.2"], [False] * 4)
    # Run the stages in sequence as the schedule would: each reads only its predecessor's outputs.
    value = (x,)
    for stage in stages:
        out = stage(*value)
        value = out if isinstance(out, tuple) else (out,)
    torch.testing.assert_close(value[0], workload.model(x), atol=1e-6, rtol=1e-5)
    # Stage 1 (enc.2, mid) hands on its own output plus the skips of enc.0 and enc.1.
    assert [kind for kind, _ in stages[1].out_sources].count("in") == 2


def test_wrong_fingerprint_is_refused_with_details() -> None:
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"])
    other = BUILTIN_MODELS["gpt2-tiny"]().model
    with pytest.raises(ModelMismatchError, match=r"fingerprint .* differs from the plan's .*'mlp'.*layers.0"):
        check_fingerprint(plan, other)


def test_same_units_other_shape_is_refused() -> None:
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"])
    workload.model.head = torch.nn.Linear(64, 8)
    with pytest.raises(ModelMismatchError, match="has the plan's 5 units, so a parameter shape or module type"):
        apply_plan(
            plan, workload.model, workload.make_batch(8)[0], workload.loss_fn, device="cpu", rank=0, world_size=2
        )


def test_non_looped_placement_is_refused() -> None:
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"])
    swapped = plan.__class__(
        **{**plan.__dict__, "stages": tuple(s.__class__(**{**s.__dict__, "rank": 1 - s.rank}) for s in plan.stages)}
    )
    with pytest.raises(ScheduleError, match=r"stage s on rank s % 2: \[0, 1\]"):
        apply_plan(
            swapped, workload.model, workload.make_batch(8)[0], workload.loss_fn, device="cpu", rank=0, world_size=2
        )


def test_split_stages_run_as_generated_code() -> None:
    # torch.fx.Interpreter runs a piece node by node (2-4x slower on small models): every piece must run
    # its generated code instead, as the profiler measured it.
    workload = BUILTIN_MODELS["gpt2-tiny"]()
    inputs, _ = workload.make_batch(2)
    stages = split_stages(workload.model, (inputs,), ["transformer.h.2"], [False, False])
    flags = [m._run_with_interpreter for s in stages for m in s.modules() if hasattr(m, "_run_with_interpreter")]
    assert flags and not any(flags)


def test_a_cpu_rank_allocates_as_the_profiler_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    # The profile was taken with freed memory kept (profiles/allocator.py); a user's training rank that
    # calls apply_plan must run the same way, or GPT-2's large blocks page-fault on every step.
    import planner.runtime.apply as apply

    calls: list[bool] = []
    monkeypatch.setattr(apply, "keep_freed_memory", lambda: calls.append(True) or True)
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"])
    with pytest.raises(ScheduleError, match="the plan needs 2 ranks"):  # stops before any process group is needed
        apply_plan(
            plan, workload.model, workload.make_batch(8)[0], workload.loss_fn, device="cpu", rank=0, world_size=3
        )
    assert calls == [True]


def _tied_sum(rank: int, world_size: int) -> list[float]:
    import torch.distributed as dist

    from planner.runtime.apply import _sum_across

    torch.manual_seed(rank)
    mine = torch.randn(1000) * 10 ** torch.randint(-3, 4, (1000,))
    total = mine.clone()
    pair = dist.new_group([0, world_size - 1])
    if rank in (0, world_size - 1):
        _sum_across(total, pair)  # a pair swaps its tensors
    _sum_across(everyone := mine.clone(), None)  # more than two: all_reduce
    return [total.tolist(), mine.tolist(), everyone.tolist()]


def test_tied_gradients_are_summed_the_same_on_both_ranks() -> None:
    # The pair's two sums (a + b on one rank, b + a on the other) are bitwise equal and are the pair's sum.
    first, middle, last = run_ranks(_tied_sum, (), 3, timeout_s=120)
    a, b = torch.tensor(first[1]), torch.tensor(last[1])
    assert first[0] == last[0] == (a + b).tolist()
    assert middle[0] == middle[1]  # not in the pair: untouched
    assert torch.allclose(torch.tensor(first[2]), a + b + torch.tensor(middle[1]))


def _pair_sum(rank: int, world_size: int) -> list[float]:
    from planner.runtime.apply import _sum_across

    torch.manual_seed(rank)
    total = torch.randn(100)
    mine = total.clone()
    _sum_across(total, None)  # the default group of two ranks: a swap
    return [total.tolist(), mine.tolist()]


def test_a_default_group_of_two_swaps() -> None:
    (sum0, a), (sum1, b) = run_ranks(_pair_sum, (), 2, timeout_s=120)
    assert sum0 == sum1 == (torch.tensor(a) + torch.tensor(b)).tolist()


def _whole_backward_calls(rank: int, world_size: int) -> list[object]:
    """``backward_whole`` for a zero-bubble plan's second stage, as a plain module and under DDP (one gloo rank)."""
    from torch.nn.parallel import DistributedDataParallel

    from planner.runtime.apply import backward_whole

    plan = make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "zero-bubble")
    plain = torch.nn.Linear(4, 4)
    out: list[object] = [backward_whole(plan, s, plain, alone) for s in (0, 1) for alone in (False, True)]
    ddp = DistributedDataParallel(torch.nn.Linear(4, 4))
    out.append(backward_whole(plan, 1, ddp, False))
    try:
        backward_whole(plan, 1, ddp, True)
    except ScheduleError as exc:
        out.append(str(exc))
    return out


def test_a_stage_with_an_output_from_its_weights_alone_runs_whole_or_is_refused_under_ddp() -> None:
    """Past the first stage, such a stage runs its whole backward in I (torch's split misses that output's
    gradient: profiles/weight_groups.py); under DDP, which keeps torch's split, apply_plan refuses it."""
    (out,) = run_ranks(_whole_backward_calls, (), 1, timeout_s=60)
    assert out[:5] == [False, False, False, True, False]
    assert "stage 1 passes on an output made from its weights alone" in out[5] and "--shard full" in out[5]
