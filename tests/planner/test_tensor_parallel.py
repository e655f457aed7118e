"""Tensor parallelism (planner/tensor_parallel.py and its place in the cluster search, planner/cluster.py): the cost
terms on hand-built inputs, which units split, which degrees a model and a node take, and what the search chooses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cli import main
from cli_checks import assert_fails
from planner.cluster import Cluster, MeshSearch, layouts, plan_cluster
from planner.cost import CostSettings
from planner.errors import PipeplanWarning, UsageError
from planner.plan import load_plan
from planner.request import PlanRequest
from planner.tensor_parallel import (
    Role,
    TensorParallel,
    TpLayout,
    attention_heads,
    check_degree,
    fixed_part_s,
    layout_switches,
    planned_switches,
    shardable_degrees,
    sharded_profile,
    unit_roles,
)
from profiles.device_model import DEVICE_MODELS
from profiles.format import Profile, save_profile
from profiles.modelled import TransformerShape, modelled_profile, tensor_parallel_times
from synthetic import make_profile, transformer_profile

SHA = "0" * 64
MEGATRON = {"sequence_parallel": True, "vocab_parallel": True}
"""Megatron's layout, as plans for Megatron-Core and torchtitan model it (the default is pipeplan's runtime's)."""


def _request(batch: int) -> PlanRequest:
    return PlanRequest(num_ranks=1, global_batch_size=batch, settings=CostSettings())


# --- the cost terms -----------------------------------------------------------------------------------------


def test_collectives_are_rings_on_the_node_link() -> None:
    tp = TensorParallel(4, bytes_per_s=1000.0, latency_s=0.5, **MEGATRON)
    # all-reduce: 2 (T - 1) = 6 steps of n / T; all-gather or reduce-scatter: T - 1 = 3 steps.
    assert tp.allreduce_s(4000) == pytest.approx(6 * (0.5 + 1.0))
    assert tp.gather_s(4000) == pytest.approx(3 * (0.5 + 1.0))
    # A block: 2 all-reduces each way, or 2 all-gathers + 2 reduce-scatters (the same time without latency).
    assert tp.block_comm_s(4000) == pytest.approx((4 * 4.5, 4 * 4.5))
    plain = replace(tp, sequence_parallel=False)
    assert plain.block_comm_s(4000) == pytest.approx((2 * 9.0, 2 * 9.0))
    assert plain.embedding_comm_s(4000) == pytest.approx((9.0, 0.0))
    assert plain.head_comm_s(4000) == pytest.approx((0.0, 9.0))
    assert tp.embedding_comm_s(4000) == tp.head_comm_s(4000) == pytest.approx((4.5, 4.5))
    assert TensorParallel(1, 1.0, 1.0).allreduce_s(4000) == 0.0
    with pytest.raises(UsageError, match="--tensor-parallel must be >= 1"):
        TensorParallel(0, 1.0, 0.0)


def test_the_fixed_part_is_the_intercept_of_the_profiled_times() -> None:
    assert fixed_part_s((1, 2, 4), (3.0, 5.0, 9.0)) == pytest.approx(1.0)  # 1 + 2 b
    assert fixed_part_s((1, 2), (2.0, 4.0)) == pytest.approx(0.0)  # proportional: nothing fixed
    assert fixed_part_s((1, 2), (5.0, 4.0)) == pytest.approx(5.0)  # shrinking with b: clamped to t(smallest)
    assert fixed_part_s((1, 2), (1.0, 4.0)) == 0.0  # a negative intercept: clamped to 0
    assert fixed_part_s((4,), (9.0,)) == 0.0


def test_a_block_splits_its_work_weights_and_activations() -> None:
    # Two blocks at b = 1, 2: forward 1 + 2 b s (fixed 1 s), backward 4 b s; 1000 parameters; 8192 bytes saved
    # per sample, 1024-byte hidden states per sample between them.
    profile = make_profile([0.0, 0.0], sizes=(1, 2), activation_bytes=1024, saved_bytes=[8192, 8192])
    profile = replace(
        profile,
        units=tuple(replace(u, forward_s=(3.0, 5.0), backward_s=(4.0, 8.0)) for u in profile.units),
        settings={"attention_heads": 4},
    )
    tp = TensorParallel(2, bytes_per_s=1024.0, latency_s=0.0, **MEGATRON)
    sharded = sharded_profile(profile, tp)
    block = sharded.units[0]
    # SP: 4 ring steps of 1024 b / 2 bytes at 1024 B/s = 2 b s each way.
    assert block.forward_s == pytest.approx((1 + 2 / 2 + 2.0, 1 + 4 / 2 + 4.0))
    assert block.backward_s == pytest.approx((4 / 2 + 2.0, 8 / 2 + 4.0))
    assert (block.param_count, block.param_bytes) == (500, 2000)
    assert block.saved_bytes == (4096, 8192)  # Korthikanti et al. eq. 3: everything / t
    # The hidden state between the blocks travels as half from each device; the token ids whole.
    assert [t.bytes for t in sharded.tensors] == [(1024, 2048), (512, 1024)]
    assert sharded.settings["tensor_parallel"] == 2
    # Without sequence parallelism, 5 hidden states stay whole (eq. 2's 10 sbh), the rest splits.
    plain = sharded_profile(profile, replace(tp, sequence_parallel=False))
    assert plain.units[0].saved_bytes == (5120 + (8192 - 5120) // 2, 10240 + (16384 - 10240) // 2)
    assert plain.units[0].forward_s == pytest.approx((1 + 1 + 2 * 1.0, 1 + 2 + 2 * 2.0))
    # pipeplan's runtime (the default layout): the same block, but every device sends its whole hidden state.
    blocks = sharded_profile(profile, TensorParallel(2, bytes_per_s=1024.0, latency_s=0.0))
    assert blocks.units[0].saved_bytes == plain.units[0].saved_bytes
    assert [t.bytes for t in blocks.tensors] == [t.bytes for t in profile.tensors]
    assert blocks.units[0].output_bytes == profile.units[0].output_bytes
    assert sharded_profile(profile, TensorParallel(1, 1.0, 0.0)) is profile


def test_embedding_and_head_split_by_vocabulary_and_the_norm_stays_whole() -> None:
    profile = transformer_profile("gpt2", layers=2, block_params=1000, block_forward_s=1.0, hidden_bytes=512)
    assert unit_roles(profile) == (
        Role.EMBEDDING,
        Role.EMBEDDING,
        Role.BLOCK,
        Role.BLOCK,
        Role.REPLICATED,
        Role.HEAD,
    )
    tp = TensorParallel(2, bytes_per_s=512.0, latency_s=0.0, **MEGATRON)
    sharded = sharded_profile(profile, tp)
    wte, _, _, _, norm, head = sharded.units
    assert wte.param_count == 1000  # 2 x 1000 vocabulary parameters / 2
    assert wte.forward_s == pytest.approx((0.1 / 2 + 0.5,))  # one reduce-scatter of 512 B: 1 step of 256 B
    assert head.tied_param_count == 1000 and head.param_count == 0  # the tied copy splits like the table
    assert head.forward_s == pytest.approx((1.0 / 2 + 0.5,)) and head.backward_s == pytest.approx((2.0 / 2 + 0.5,))
    assert head.saved_bytes == (1024,)  # the split logits
    assert norm == profile.units[4]
    assert sharded.settings["vocab_parallel"] is True


def test_the_runtime_layout_keeps_embedding_and_head_whole() -> None:
    """pipeplan's runtime splits the blocks only: the embeddings and the head keep their whole weights, work,
    logits and bytes on every device, with no collective of their own."""
    profile = transformer_profile("gpt2", layers=2, block_params=1000, block_forward_s=1.0, hidden_bytes=512)
    sharded = sharded_profile(profile, TensorParallel(2, bytes_per_s=512.0, latency_s=0.0))
    wte, wpe, block, _, norm, head = sharded.units
    assert (wte, wpe, norm, head) == (profile.units[0], profile.units[1], profile.units[4], profile.units[5])
    assert head.tied_param_count == 2000 and head.saved_bytes == profile.units[5].saved_bytes  # whole logits
    assert block.param_count == profile.units[2].param_count // 2
    assert sharded.settings["sequence_parallel"] is False and sharded.settings["vocab_parallel"] is False
    # Megatron's layout of the same profile halves them.
    megatron = sharded_profile(profile, TensorParallel(2, bytes_per_s=512.0, latency_s=0.0, **MEGATRON))
    assert megatron.units[0].param_bytes == -(-profile.units[0].param_bytes // 2)
    assert megatron.units[5].saved_bytes == tuple(-(-b // 2) for b in profile.units[5].saved_bytes)


def test_layout_switches_of_each_layout() -> None:
    assert layout_switches(TpLayout.BLOCKS) == (False, False)
    assert layout_switches(TpLayout.MEGATRON) == (True, True)
    assert layout_switches(TpLayout.MEGATRON, sequence_parallel=False) == (False, True)
    with pytest.raises(UsageError, match="--sequence-parallel on: pipeplan's runtime .* keeps the sequence whole"):
        layout_switches(TpLayout.BLOCKS, sequence_parallel=True)
    # A plan written before the layout was recorded was planned with Megatron's.
    assert planned_switches({"tensor_parallel": 2}) == (True, True)
    assert planned_switches({"sequence_parallel": False, "vocab_parallel": False}) == (False, False)


def test_roles_of_a_profile_without_repeated_blocks() -> None:
    plain = make_profile([1.0, 1.0])
    profile = replace(plain, units=tuple(replace(u, name=n) for u, n in zip(plain.units, ("a", "b"), strict=True)))
    assert unit_roles(profile) == (Role.REPLICATED, Role.REPLICATED)
    with pytest.raises(UsageError, match="no unit of the profile shards"):
        check_degree(profile, 2, 8, (8, 8))
    assert shardable_degrees(profile, 8, (8, 8)) == (1,)


# --- degrees ------------------------------------------------------------------------------------------------


def test_degrees_divide_the_node_and_the_heads() -> None:
    llama = transformer_profile("llama", heads=12, kv_heads=4)
    assert attention_heads(llama) == (12, 4)
    assert shardable_degrees(llama, 8, attention_heads(llama)) == (1, 2, 4)
    assert shardable_degrees(llama, 6, attention_heads(llama)) == (1, 2)
    assert shardable_degrees(llama, 8, None) == (1,)
    with pytest.raises(UsageError, match="--tensor-parallel 3 does not divide --devices-per-node 4"):
        check_degree(llama, 3, 4, (12, 4))
    with pytest.raises(UsageError, match="does not divide the model's 12 attention heads and 4 key-value heads"):
        check_degree(llama, 8, 8, (12, 4))
    with pytest.raises(UsageError, match="give --attention-heads H"):
        check_degree(transformer_profile("llama", heads=None), 2, 8, None)
    check_degree(llama, 4, 8, (12, 4))  # accepted


def test_layouts_count_tensor_parallel_groups_as_devices() -> None:
    cluster = Cluster(8, 4, intra_node_bytes_per_s=100.0, inter_node_bytes_per_s=10.0, latency_s=0.0)
    found = layouts(cluster, num_units=8, global_batch=4, tp=2)
    assert all(x.used_devices <= 8 and x.tp == 2 for x in found)
    assert sorted({(x.pp, x.dp) for x in found}) == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1)]
    two = next(x for x in found if (x.pp, x.dp, x.placement) == (2, 2, "pipeline-in-node"))
    # Each position is 2 consecutive devices: replica 0 on devices 0-1 and 2-3 (node 0), replica 1 on node 1.
    assert two.devices() == ((0, 2), (4, 6))
    assert (two.hop_bytes_per_s(cluster), two.ring_bytes_per_s(cluster)) == (100.0, 10.0)
    assert two.degrees == "2 x 2 x 2"


# --- the search ---------------------------------------------------------------------------------------------


def _memory_bound(style: str) -> object:
    """A model whose vocabulary table (2 x 10 M parameters, 320 MB of Adam state) fits no device of 200 MB whole."""
    profile = transformer_profile(style, block_params=10_000_000, heads=8, kv_heads=4 if style == "llama" else None)
    return replace(profile, device=replace(profile.device, memory_bytes=200_000_000))


def test_the_search_splits_tensors_when_no_stage_fits_otherwise() -> None:
    profile = _memory_bound("llama")
    cluster = Cluster(8, 4, 1.1e9, 1.1e9, 1e-4)
    with pytest.raises(Exception, match="no pp x dp layout"):
        plan_cluster(profile, _request(8), cluster, sha256=SHA)  # tensor parallelism off: nothing fits
    with pytest.raises(Exception, match="no pp x tp x dp layout"):
        # pipeplan's runtime keeps the vocabulary table whole on every device: it fits no better.
        plan_cluster(profile, _request(8), cluster, MeshSearch(tensor_parallel=None), sha256=SHA)
    result = plan_cluster(profile, _request(8), cluster, MeshSearch(tensor_parallel=None, **MEGATRON), sha256=SHA)
    mesh = result.plan.mesh
    assert mesh is not None and mesh.tp in (2, 4)
    assert mesh.used_devices == mesh.pp * mesh.dp * mesh.tp <= 8
    assert all(layout.tp != 1 for layout, step, _ in result.tried if step is not None)
    assert result.plan.constraints["tensor_parallel"] == "auto"
    capacity = 200_000_000 * 0.9
    assert max(s.memory_bytes.peak for s in result.plan.stages) <= capacity


def test_the_search_keeps_tp_1_where_splitting_only_costs() -> None:
    # Plenty of memory and a slow node link: every block's collectives cost more than the halved compute saves.
    profile = transformer_profile("llama", block_params=1000, hidden_bytes=1_000_000, heads=8)
    cluster = Cluster(4, 4, 1e8, 1e8, 1e-4)
    result = plan_cluster(profile, _request(4), cluster, MeshSearch(tensor_parallel=None), sha256=SHA)
    assert result.plan.mesh is not None and result.plan.mesh.tp == 1
    steps = {layout.tp for layout, step, _ in result.tried if step is not None}
    assert 1 in steps and len({layout.tp for layout, _, _ in result.tried}) == 3  # tp 1, 2 and 4 were tried


def test_tensor_parallel_1_writes_the_plan_it_wrote_before() -> None:
    profile = transformer_profile("llama", block_params=1000, heads=8)
    cluster = Cluster(4, 4, 1.1e9, 1.1e9, 1e-4)
    plan = plan_cluster(profile, _request(4), cluster, sha256=SHA).plan
    data = plan.to_dict()
    assert "tp" not in data["mesh"] and "tensor_parallel" not in data["constraints"]
    assert plan_cluster(profile, _request(4), cluster, MeshSearch(tensor_parallel=1), sha256=SHA).plan.to_dict() == data


def test_a_fixed_degree_and_pipeline_must_fill_the_devices() -> None:
    profile = transformer_profile("llama", heads=8)
    with pytest.raises(UsageError, match="--ranks 2 x --tensor-parallel 4 does not divide --devices 4"):
        plan_cluster(
            profile,
            _request(4),
            Cluster(4, 4, 1e9, 1e9, 0.0),
            MeshSearch(pipeline_degree=2, tensor_parallel=4),
            sha256=SHA,
        )
    with pytest.raises(UsageError, match="--tensor-parallel 2 needs 2 devices, and the plan has --devices 1"):
        plan_cluster(profile, _request(4), Cluster(1, 1, 1e9, 1e9, 0.0), MeshSearch(tensor_parallel=2), sha256=SHA)


# --- the command line ---------------------------------------------------------------------------------------


def test_plan_auto_writes_a_mesh_with_tp(tmp_path, capsys) -> None:
    profile_file, out = tmp_path / "p.json", tmp_path / "plan.json"
    save_profile(_memory_bound("llama"), profile_file)
    args = ["plan", str(profile_file), "--global-batch", "8", "--devices", "8", "--devices-per-node", "4"]
    assert main([*args, "--tensor-parallel", "auto", "--tp-layout", "megatron", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["mesh"]["tp"] in (2, 4)
    assert data["mesh"]["pp"] * data["mesh"]["dp"] * data["mesh"]["tp"] <= 8
    printed = capsys.readouterr().out
    assert "best step per tensor-parallel degree: tp " in printed and "tp 1: no plan fits" in printed
    assert f"x tp {data['mesh']['tp']} x dp" in printed
    assert load_plan(out).mesh.tp == data["mesh"]["tp"]
    # Why this degree, kept in the plan: each degree's best step, or why none.
    best = data["constraints"]["tensor_parallel_best_s"]
    assert best["1"] == "no plan fits (memory or batch)"
    assert best[str(data["mesh"]["tp"])] == pytest.approx(data["predicted"]["iteration_s"])
    assert all(isinstance(best[t], float) and best[t] >= best[str(data["mesh"]["tp"])] for t in best if t != "1")
    assert main(["show", str(out)]) == 0
    assert f"tp {data['mesh']['tp']}: " in capsys.readouterr().out


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_plan_with_a_fixed_degree_writes_it(tmp_path, style) -> None:
    profile_file, out = tmp_path / "p.json", tmp_path / "plan.json"
    profile = transformer_profile(style, block_params=1_000_000, heads=8)
    save_profile(profile, profile_file)
    argv = ["plan", str(profile_file), "--global-batch", "8", "--devices", "4", "--stages", "2"]
    assert main([*argv, "--tensor-parallel", "2", "--out", str(out)]) == 0
    plan = load_plan(out)
    assert plan.mesh is not None and (plan.mesh.pp, plan.mesh.tp, plan.mesh.dp) == (2, 2, 1)
    assert plan.mesh.tp_group(0, 1) == (plan.mesh.devices[0][1], plan.mesh.devices[0][1] + 1)
    assert plan.constraints["tensor_parallel"] == 2
    # What pipeplan's runtime runs, unless asked for Megatron's layout (or planned --for a trainer with it).
    assert (plan.constraints["sequence_parallel"], plan.constraints["vocab_parallel"]) == (False, False)
    for extra, switches in (
        (["--tp-layout", "megatron"], (True, True)),
        (["--tp-layout", "megatron", "--sequence-parallel", "off"], (False, True)),
        (["--for", "megatron"], (True, True)),
    ):
        assert main([*argv, "--tensor-parallel", "2", *extra, "--out", str(out)]) == 0
        plan = load_plan(out)
        assert (plan.constraints["sequence_parallel"], plan.constraints["vocab_parallel"]) == switches, extra


def test_bad_tensor_parallel_input_gets_one_line(tmp_path, capsys) -> None:
    profile_file = tmp_path / "p.json"
    save_profile(transformer_profile("llama", heads=6), profile_file)
    base = ["plan", str(profile_file), "--global-batch", "8", "--out", str(tmp_path / "o.json")]
    assert_fails(
        capsys,
        [*base, "--devices", "8", "--devices-per-node", "4", "--tensor-parallel", "3"],
        "does not divide --devices-per-node 4",
    )
    assert_fails(
        capsys, [*base, "--devices", "8", "--tensor-parallel", "4"], "does not divide the model's 6 attention heads"
    )
    assert_fails(
        capsys, [*base, "--ranks", "2", "--tensor-parallel", "2"], "--tensor-parallel: options of a cluster plan"
    )
    assert_fails(
        capsys, [*base, "--devices", "1", "--tensor-parallel", "2"], "needs 2 devices, and the plan has --devices 1"
    )
    assert_fails(capsys, [*base, "--devices", "4", "--attention-heads", "8"], "options of tensor parallelism")
    assert_fails(capsys, [*base, "--devices", "4", "--tp-layout", "megatron"], "options of tensor parallelism")
    assert_fails(
        capsys,
        [*base, "--devices", "4", "--tensor-parallel", "2", "--sequence-parallel", "on"],
        "--sequence-parallel on: pipeplan's runtime (--tp-layout blocks) keeps the sequence whole",
    )


def test_auto_without_heads_searches_tp_1_and_says_so() -> None:
    profile = transformer_profile("llama", block_params=1000, heads=None)
    with pytest.warns(PipeplanWarning, match="records no attention heads, so only tp 1 is searched"):
        result = plan_cluster(
            profile, _request(4), Cluster(4, 4, 1e9, 1e9, 0.0), MeshSearch(tensor_parallel=None), sha256=SHA
        )
    assert {layout.tp for layout, _, _ in result.tried} == {1}
    given = plan_cluster(
        profile,
        _request(4),
        Cluster(4, 4, 1e9, 1e9, 0.0),
        MeshSearch(tensor_parallel=None, attention_heads=(4, 2)),
        sha256=SHA,
    )
    assert {layout.tp for layout, _, _ in given.tried} == {1, 2}


def test_a_block_cut_in_two_shares_its_collectives_by_parameters() -> None:
    profile = make_profile([1.0, 1.0, 1.0, 1.0], param_counts=[300, 100, 300, 100])
    names = ("h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp")
    profile = replace(profile, units=tuple(replace(u, name=n) for u, n in zip(profile.units, names, strict=True)))
    assert unit_roles(profile) == (Role.BLOCK,) * 4
    sharded = sharded_profile(profile, TensorParallel(2, bytes_per_s=512.0, latency_s=0.0))
    # A block's 4 ring steps of 1024 / 2 bytes at 512 B/s = 4 s each way: 3 s to the attention, 1 s to the MLP.
    assert [u.forward_s[0] for u in sharded.units] == pytest.approx([0.5 + 3.0, 0.5 + 1.0, 0.5 + 3.0, 0.5 + 1.0])


def _modelled(sizes: tuple[int, ...], **device: object) -> Profile:
    llama = TransformerShape("llama-test", "llama", 4, 2048, 16, 8, 5632, 32000, 4096, False)
    return modelled_profile(llama, replace(DEVICE_MODELS["h100-80gb"], **device), sizes)


def test_a_modelled_profile_at_degree_1_is_its_own_times() -> None:
    profile = _modelled((1, 2, 4))
    times = tensor_parallel_times(profile, 1, sequence_parallel=True)
    assert [times[u.name] for u in profile.units] == [
        (u.forward_s, u.backward_input_s, u.backward_weight_s) for u in profile.units
    ]
    assert tensor_parallel_times(make_profile([1.0, 2.0]), 4, sequence_parallel=True) == {}


def test_a_modelled_block_splits_ideally_on_an_ideal_device_and_slower_on_a_real_one() -> None:
    # Kernels without a launch cost and products as efficient at every shape: a block with sequence parallelism
    # does 1/T of everything (without it, its norms and residuals stay whole on every device). At 8 the products
    # split by rows, which write their whole output on every device, turn bound by memory.
    ideal = _modelled((2,), matmul_half_size=1, kernel_s=0.0)
    block = ideal.units[1]
    assert block.name == "model.layers.0"
    for degree in (2, 4):
        forward, backward_input, backward_weight = tensor_parallel_times(ideal, degree, True)[block.name]
        assert forward[0] == pytest.approx(block.forward_s[0] / degree, rel=2e-3)
        assert backward_input[0] + backward_weight[0] == pytest.approx(block.backward_s[0] / degree, rel=2e-3)
        assert tensor_parallel_times(ideal, degree, False)[block.name][0][0] > forward[0] * 1.02
    # On the H100's constants the slices' products are narrower and run below the whole's efficiency, and every
    # kernel's launch stays whole.
    real = _modelled((2,))
    forward = tensor_parallel_times(real, 8, True)[real.units[1].name][0][0]
    assert real.units[1].forward_s[0] / 8 * 1.02 < forward < real.units[1].forward_s[0] / 4


def test_a_modelled_profile_shards_alike_whatever_sizes_it_holds() -> None:
    # A measured profile keeps the intercept over its sizes whole (fixed_part_s); a modelled one is modelled
    # again on its slices, so that one size profiled alone or among others shards to the same time.
    tp = TensorParallel(4, 450e9, 1e-5, **MEGATRON)
    alone, among = sharded_profile(_modelled((2,)), tp), sharded_profile(_modelled((1, 2, 4)), tp)
    for one, many in zip(alone.units, among.units, strict=True):
        assert one.forward_s[0] == pytest.approx(many.forward_s[1], rel=1e-12)
        assert one.backward_input_s[0] == pytest.approx(many.backward_input_s[1], rel=1e-12)
    block, whole = among.units[1], _modelled((1, 2, 4)).units[1]
    compute = tensor_parallel_times(_modelled((1, 2, 4)), 4, True)[block.name][0]
    comm = tp.block_comm_s(whole.output_bytes[1])[0]
    assert block.forward_s[1] == pytest.approx(compute[1] + comm, rel=1e-12)
