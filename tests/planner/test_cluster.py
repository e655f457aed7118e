"""Cluster plans (planner/cluster.py): layouts, links, the replicas' gradient sync, and the search's choice."""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import replace

import pytest

from cli import main
from cli_checks import assert_fails
from planner.cluster import (
    Cluster,
    Layout,
    MeshSearch,
    _lower_bound_s,
    layout_settings,
    layouts,
    plan_cluster,
    sharded_for,
)
from planner.cost import CostSettings, DataParallel, bytes_per_param, unit_costs
from planner.errors import PlanFormatError, PlanInfeasibleError, UsageError
from planner.plan import load_plan, plan_from_dict, save_plan
from planner.request import PlanRequest
from planner.search import make_plan, plan_key
from planner.step_tails import LAST_BUCKET_BYTES, step_tails
from planner.tensor_parallel import TensorParallel, sharded_profile
from profiles.format import Profile, save_profile
from synthetic import make_profile, transformer_profile

SHA = "0" * 64


def _request(batch: int, **settings: object) -> PlanRequest:
    return PlanRequest(num_ranks=1, global_batch_size=batch, settings=CostSettings(**settings))


def test_placements_put_hops_or_rings_inside_nodes() -> None:
    cluster = Cluster(8, 4, intra_node_bytes_per_s=100.0, inter_node_bytes_per_s=10.0, latency_s=0.0)
    pipeline = Layout(pp=4, dp=2, placement="pipeline-in-node")
    replicas = Layout(pp=4, dp=2, placement="replicas-in-node")
    assert pipeline.devices() == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert replicas.devices() == ((0, 2, 4, 6), (1, 3, 5, 7))
    # A replica's 4 ranks fill a node: every hop is inside it, every ring crosses nodes.
    assert (pipeline.hop_bytes_per_s(cluster), pipeline.ring_bytes_per_s(cluster)) == (100.0, 10.0)
    # Pairs of replicas share a node: rings stay inside, hop 1 -> 2 (devices 2 -> 4) leaves it.
    assert (replicas.hop_bytes_per_s(cluster), replicas.ring_bytes_per_s(cluster)) == (10.0, 100.0)
    assert Layout(1, 8, "pipeline-in-node").hop_bytes_per_s(cluster) == math.inf
    assert Layout(8, 1, "pipeline-in-node").ring_bytes_per_s(cluster) == math.inf


def test_layouts_split_the_batch_and_never_exceed_the_devices() -> None:
    cluster = Cluster(8, 8, 1.0, 1.0, 0.0)
    found = layouts(cluster, num_units=3, global_batch=4)
    # One node: both placements have the same links, so each (p, d) appears once.
    assert [(x.pp, x.dp) for x in found] == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (3, 1), (3, 2)]
    assert [(x.pp, x.dp) for x in layouts(cluster, 3, 4, pipeline_degree=2)] == [(2, 1), (2, 2), (2, 4)]


def test_ring_collectives_follow_the_textbook_formula() -> None:
    dp = DataParallel(replicas=4, bytes_per_s=1e9, latency_s=1e-5)
    # all-reduce: 2 (d - 1) steps of n / d bytes; all-gather: d - 1 steps.
    assert dp.allreduce_s(4e9) == pytest.approx(6 * (1e-5 + 1.0))
    assert dp.gather_s(4e9) == pytest.approx(3 * (1e-5 + 1.0))
    assert DataParallel(1, 1e9, 1e-5).allreduce_s(4e9) == 0.0
    assert DataParallel(4, 1e9, 0.0, "none").state_divisors() == (1, 1, 1)
    assert DataParallel(4, 1e9, 0.0, "optimizer").state_divisors() == (1, 1, 4)
    assert DataParallel(4, 1e9, 0.0, "full").state_divisors() == (4, 4, 4)
    with pytest.raises(UsageError, match="--shard"):
        DataParallel(2, 1e9, 0.0, "zero2")


def test_each_rank_reduces_its_own_gradients_after_its_last_backward() -> None:
    profile = make_profile([1.0, 1.0, 1.0], param_counts=[1000, 2000, 3000])
    costs = unit_costs(profile, 1)
    dp = DataParallel(replicas=2, bytes_per_s=1000.0, latency_s=0.5)
    tails = step_tails(profile, costs, CostSettings(data_parallel=dp), [[0, 1], [2]], (0, 1))
    # fp32 gradients, 4 bytes a parameter: 2 steps of (0.5 s + bytes / 2 / 1000).
    assert tails == pytest.approx((2 * (0.5 + 12000 / 2000), 2 * (0.5 + 12000 / 2000)))
    sharded = step_tails(
        profile, costs, CostSettings(data_parallel=replace(dp, shard="optimizer")), [[0], [1, 2]], (0, 1)
    )
    # ZeRO-1: reduce-scatter the gradients, all-gather the weights: one step each of the same size.
    assert sharded == pytest.approx((2 * (0.5 + 4000 / 2000), 2 * (0.5 + 20000 / 2000)))
    assert step_tails(profile, costs, CostSettings(data_parallel=replace(dp, shard="full")), [[0], [1, 2]], (0, 1)) == (
        0.0,
        0.0,
    )


def test_sharding_divides_the_state_a_stage_keeps() -> None:
    profile = make_profile([1.0, 1.0], param_counts=[1000, 1000])
    request = PlanRequest(num_ranks=2, global_batch_size=2)
    plain = make_plan(profile, request, sha256=SHA).stages[0].memory_bytes
    dp = DataParallel(replicas=4, bytes_per_s=1e9, latency_s=0.0, shard="optimizer")
    zero1 = make_plan(profile, replace(request, settings=CostSettings(data_parallel=dp)), sha256=SHA).stages[0]
    assert (zero1.memory_bytes.params, zero1.memory_bytes.grads) == (plain.params, plain.grads)
    assert zero1.memory_bytes.optimizer == plain.optimizer // 4


def test_a_tensor_parallel_group_wider_than_a_node_rings_on_the_nodes_nics() -> None:
    # 16 devices over two nodes of 8, one 100 Gb/s NIC a node (1.5625 GB/s a device): the ring's slowest hop
    # crosses between the nodes on the node's NIC, 12.5 GB/s, as a one-node group on a 12.5 GB/s link would.
    profile = transformer_profile("gpt2", layers=4, sizes=(1, 2), heads=16)
    two_nodes = Cluster(16, 8, 150e9, 1.5625e9, 1e-5)
    one_slow_node = Cluster(16, 16, 12.5e9, 1.5625e9, 1e-5)
    fast_node = Cluster(16, 16, 150e9, 1.5625e9, 1e-5)
    across, slow, fast = (sharded_for(profile, c, 16, True, True) for c in (two_nodes, one_slow_node, fast_node))
    assert [u.forward_s for u in across.units] == [u.forward_s for u in slow.units]
    assert sum(u.forward_s[0] for u in across.units) > sum(u.forward_s[0] for u in fast.units)
    # Inside a node nothing changes.
    assert sharded_for(profile, two_nodes, 8, True, True) == sharded_for(profile, fast_node, 8, True, True)


def test_fsdp_gathered_once_a_step_costs_zero1s_sync_and_no_gathers_a_micro_batch() -> None:
    # torchtitan under a pipeline (reshard_after_forward=False): the stage's weights are gathered once and its
    # gradients reduce-scattered once, so the step pays ZeRO-1's volume once, whatever the micro-batch count.
    profile = make_profile([1.0, 1.0], param_counts=[10**6, 10**6])
    request = PlanRequest(num_ranks=2, global_batch_size=8)
    full = DataParallel(replicas=4, bytes_per_s=1e9, latency_s=0.0, shard="full")

    def predicted(dp: DataParallel):
        return make_plan(profile, replace(request, settings=CostSettings(data_parallel=dp)), sha256=SHA).predicted

    once, zero1 = predicted(replace(full, gathered_all_step=True)), predicted(replace(full, shard="optimizer"))
    assert once.runtime.step_tail_s == pytest.approx(zero1.runtime.step_tail_s)
    assert once.busy_s == pytest.approx(zero1.busy_s)
    per_param = bytes_per_param(profile.device.dtype, "adam")
    weights, grads = 10**6 * per_param[0], 10**6 * per_param[1]  # one unit's a rank
    assert once.runtime.step_tail_s[0] == pytest.approx(full.gather_s(weights) + full.gather_s(grads))
    every = predicted(full)  # each micro-batch gathers before its forward and backward, reduce-scatters after
    assert sum(every.busy_s) > sum(once.busy_s) + 8 * 2 * (2 * full.gather_s(weights) + full.gather_s(grads)) * 0.99


def _exhaustive(
    profile, request: PlanRequest, cluster: Cluster, degrees: tuple[int, ...] = (1,)
) -> tuple[float, int, tuple]:
    """The fastest step over every layout of every tensor-parallel degree, planned one by one (no bound, no
    pruning): (step, devices, the winner's baselines)."""
    best: tuple[float, int, tuple] | None = None
    every = [
        (layout, sharded_profile(profile, TensorParallel(tp, cluster.intra_node_bytes_per_s, cluster.latency_s)))
        for tp in degrees
        for layout in layouts(cluster, profile.num_units, request.global_batch_size, tp=tp)
    ]
    for layout, sharded in every:
        settings = request.settings
        hop, ring = layout.hop_bytes_per_s(cluster), layout.ring_bytes_per_s(cluster)
        if math.isfinite(hop):
            settings = replace(settings, link_bytes_per_s=hop, link_latency_s=cluster.latency_s)
        if layout.dp > 1:
            settings = replace(settings, data_parallel=DataParallel(layout.dp, ring, cluster.latency_s, cluster.shard))
        one = replace(request, num_ranks=layout.pp, global_batch_size=request.global_batch_size // layout.dp)
        try:
            plan = make_plan(sharded, replace(one, settings=settings), sha256=SHA)
        except Exception:  # noqa: BLE001 - a layout without a plan (memory, batch) is simply not a candidate
            continue
        key = (round(plan.predicted.iteration_s, 12), layout.used_devices)
        best = (*key, plan.baselines) if best is None or key < best[:2] else best
    assert best is not None
    return best


def _random_profile(rng: random.Random, memories: tuple[int, ...]) -> Profile:
    """3 to 6 units of random times and parameter counts at micro-batch sizes 1 and 2, on one of ``memories``."""
    n = rng.randint(3, 6)
    return make_profile(
        [rng.uniform(0.5, 2.0) for _ in range(n)],
        sizes=(1, 2),
        param_counts=[rng.choice([10**5, 10**6, 10**7]) for _ in range(n)],
        memory_bytes=rng.choice(memories),
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_choice_is_the_exhaustive_searchs(seed: int) -> None:
    rng = random.Random(seed)
    profile = _random_profile(rng, (2**28, 2**30, 2**36))
    cluster = Cluster(
        rng.choice([4, 6, 8]),
        rng.choice([2, 4]),
        intra_node_bytes_per_s=rng.choice([1e9, 1e10]),
        inter_node_bytes_per_s=1e8,
        latency_s=1e-4,
        shard=rng.choice(["none", "optimizer", "full"]),
    )
    request = _request(rng.choice([4, 8]), link_bytes_per_s=1e9)
    result = plan_cluster(profile, request, cluster, sha256=SHA)
    mesh = result.plan.mesh
    assert mesh is not None
    step, devices, baselines = _exhaustive(profile, request, cluster)
    assert result.plan.predicted.iteration_s == pytest.approx(step, rel=1e-12)
    assert mesh.pp * mesh.dp == devices
    # The search scores the baselines for the winning layout alone, as its own search would.
    assert result.plan.baselines == baselines and len(baselines) == 3
    assert mesh.global_batch_size == request.global_batch_size == mesh.dp * result.plan.global_batch_size


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_with_tensor_parallelism_searched_is_the_exhaustive_searchs(seed: int) -> None:
    # Every degree's layouts in one branch and bound, each held against the best step of any degree so far:
    # the bounds and the schedule floors (planner/bounds.py) skip only what cannot win.
    rng = random.Random(seed)
    profile = transformer_profile(
        rng.choice(["llama", "gpt2"]),
        layers=rng.randint(3, 6),
        block_params=rng.choice([10**5, 10**6, 10**7]),
        block_forward_s=rng.uniform(0.005, 0.02),
        hidden_bytes=rng.choice([4096, 1_000_000]),
        heads=8,
        sizes=(1, 2),
        memory_bytes=rng.choice([2**27, 2**30, 2**36]),
    )
    cluster = Cluster(
        rng.choice([4, 8]),
        4,
        intra_node_bytes_per_s=rng.choice([1e9, 1e11]),
        inter_node_bytes_per_s=1e8,
        latency_s=1e-5,
        shard=rng.choice(["none", "optimizer"]),
    )
    request = _request(rng.choice([4, 8]), link_bytes_per_s=1e9)
    result = plan_cluster(profile, request, cluster, MeshSearch(tensor_parallel=None), sha256=SHA)
    mesh = result.plan.mesh
    assert mesh is not None
    step, devices, _ = _exhaustive(profile, request, cluster, degrees=(1, 2, 4))
    assert result.plan.predicted.iteration_s == pytest.approx(step, rel=1e-12, abs=1e-12)  # step: to 12 places
    assert mesh.used_devices == devices


def test_a_cpu_profile_is_planned_at_the_threads_of_every_process_on_the_machine() -> None:
    # Profiled on 4 cores at 2 threads. pp 2 x dp 2 on one machine runs 4 processes of 1 thread each (the launcher's
    # cores // world size), 1.8x the profiled time; two machines of 2 give each process 2 threads, as profiled.
    from planner.prediction import plan_pipeline
    from profiles.format import ThreadScaling

    base = make_profile([1.0] * 4, sizes=(1,))
    profile = replace(
        base,
        thread_scaling=ThreadScaling((4, 2, 1), ((0.6,), (1.0,), (1.8,)), (0.5, 1.0, 1.8), cores=4),
        settings={**base.settings, "threads": 2},
    )
    request = _request(4, link_bytes_per_s=1e12)
    forward = {}
    for per_node in (4, 2):
        cluster = Cluster(4, per_node, intra_node_bytes_per_s=1e12, inter_node_bytes_per_s=1e12, latency_s=0.0)
        plan = plan_cluster(profile, request, cluster, MeshSearch(pipeline_degree=2), sha256=SHA).plan
        assert plan.mesh is not None and (plan.mesh.pp, plan.mesh.dp) == (2, 2) and plan.threads_ranks == per_node
        forward[per_node] = sum(s.forward_s for s in plan.stages)
        # What verify and tune predict the plan again with takes the same threads.
        assert sum(plan_pipeline(profile, plan, CostSettings()).forward_s) == pytest.approx(forward[per_node])
    assert forward[2] == pytest.approx(4 * 1.0 * 1.0) and forward[4] == pytest.approx(4 * 1.0 * 1.8)


@pytest.mark.parametrize("seed", range(8))
def test_a_layouts_bound_holds_under_a_trainers_collectives(seed: int) -> None:
    # The bound that prunes a layout is below its best plan whatever hides the collectives: FSDP's gathers
    # prefetched behind compute (pp 1), the stage gathered all step (pp > 1), a reduction behind the backward.
    rng = random.Random(seed)
    profile = _random_profile(rng, (2**30, 2**36))
    cluster = Cluster(8, 4, intra_node_bytes_per_s=rng.choice([1e9, 1e11]), inter_node_bytes_per_s=1e8, latency_s=1e-5)
    request = _request(8, link_bytes_per_s=1e9)
    mesh = MeshSearch(trainer_collectives=True, overlap_grad_reduce=rng.random() < 0.5)
    checked = 0
    for shard in ("none", "optimizer", "full"):
        for layout in layouts(replace(cluster, shard=shard), profile.num_units, request.global_batch_size):
            if layout.dp == 1:
                continue
            settings = layout_settings(request, cluster, layout, mesh)
            replica = replace(request, num_ranks=layout.pp, global_batch_size=8 // layout.dp, settings=settings)
            try:
                plan = make_plan(profile, replica, sha256=SHA)
            except PlanInfeasibleError:
                continue
            bound = _lower_bound_s(profile, request, settings, layout)
            assert bound <= plan.predicted.iteration_s * (1 + 1e-9), (layout, bound, plan.predicted.iteration_s)
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("seed", range(4))
def test_worker_processes_choose_the_same_plan(seed: int) -> None:
    # Layouts searched two at a time meet a different best step to beat; bounds and floors only skip what
    # cannot win, so the plan is the same.
    rng = random.Random(seed)
    n = rng.randint(4, 8)
    profile = make_profile([rng.uniform(0.5, 2.0) for _ in range(n)], sizes=(1, 2))
    cluster = Cluster(8, 4, intra_node_bytes_per_s=1e10, inter_node_bytes_per_s=1e8, latency_s=1e-4)
    request = _request(8, link_bytes_per_s=1e9)
    one = plan_cluster(profile, request, cluster, sha256=SHA)
    two = plan_cluster(profile, request, cluster, sha256=SHA, jobs=2)
    assert plan_key(two.plan) == plan_key(one.plan)
    assert two.plan.mesh == one.plan.mesh
    assert two.plan.predicted.iteration_s == one.plan.predicted.iteration_s
    assert [t[0] for t in two.tried] == [t[0] for t in one.tried]  # every layout accounted for, in order


def test_data_parallel_wins_when_everything_fits_and_pipelines_when_it_must() -> None:
    units = [1.0] * 4
    cluster = Cluster(4, 4, 1e12, 1e12, 0.0)
    roomy = make_profile(units, param_counts=[1000] * 4)
    assert (plan_cluster(roomy, _request(8), cluster, sha256=SHA).plan.mesh.pp, 4) == (1, 4)
    # 4 units of 10M fp32 Adam parameters (160 MB each) on 256 MiB devices: one unit a device at most.
    tight = make_profile(units, param_counts=[10**7] * 4, memory_bytes=2**28)
    mesh = plan_cluster(tight, _request(8), cluster, sha256=SHA).plan.mesh
    assert (mesh.pp, mesh.dp) == (4, 1)


def test_fewer_devices_when_the_batch_allows_no_more() -> None:
    profile = make_profile([1.0, 1.0])
    result = plan_cluster(profile, _request(2), Cluster(8, 8, 1e12, 1e12, 0.0), sha256=SHA)
    mesh = result.plan.mesh
    # 2 units and 2 samples: at most 2 pipeline ranks x 2 replicas.
    assert (mesh.pp, mesh.dp, mesh.used_devices, mesh.num_devices) == (2, 2, 4, 8)


def test_a_fixed_pipeline_degree_must_divide_the_devices() -> None:
    profile = make_profile([1.0] * 4)
    with pytest.raises(UsageError, match="does not divide --devices 6"):
        plan_cluster(profile, _request(8), Cluster(6, 6, 1e9, 1e9, 0.0), MeshSearch(pipeline_degree=4), sha256=SHA)
    plan = plan_cluster(
        profile, _request(8), Cluster(8, 4, 1e9, 1e8, 0.0), MeshSearch(pipeline_degree=2), sha256=SHA
    ).plan
    assert (plan.mesh.pp, plan.mesh.dp, plan.num_ranks) == (2, 4, 2)


def test_the_mesh_round_trips_and_is_checked(tmp_path) -> None:
    profile = make_profile([1.0] * 4)
    plan = plan_cluster(
        profile, _request(8), Cluster(8, 4, 1e10, 1e9, 1e-5), MeshSearch(pipeline_degree=2), sha256=SHA
    ).plan
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    data = json.loads(path.read_text())
    bad = {**data, "mesh": {**data["mesh"], "pp": 4}}
    with pytest.raises(PlanFormatError, match="mesh.pp is 4"):
        plan_from_dict(bad)
    rows = [list(r) for r in data["mesh"]["devices"]]
    rows[1][0] = rows[0][0]
    with pytest.raises(PlanFormatError, match="once each"):
        plan_from_dict({**data, "mesh": {**data["mesh"], "devices": rows}})
    with pytest.raises(PlanFormatError, match="global_batch_size"):
        plan_from_dict({**data, "mesh": {**data["mesh"], "global_batch_size": 7}})


def test_cli_plans_a_cluster_and_says_what_it_tried(tmp_path, capsys) -> None:
    profile = tmp_path / "model.profile.json"
    save_profile(make_profile([1.0] * 4, sizes=(1, 2)), profile)
    out = tmp_path / "plan.json"
    argv = ["plan", profile, "--devices", 8, "--devices-per-node", 4, "--global-batch", 8, "--out", out]
    assert main([str(a) for a in argv]) == 0
    printed = capsys.readouterr().out
    assert "cluster search:" in printed and "mesh: pp " in printed
    mesh = json.loads(out.read_text())["mesh"]
    assert mesh["pp"] * mesh["dp"] <= 8 and mesh["global_batch_size"] == 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--devices", 6, "--stages", 4], "does not divide --devices 6"),
        ([], "give --ranks P"),
        (["--devices", 4, "--pin", "layers.0=0"], "per pipeline rank"),
        (["--devices", 4, "--shard", "zero2"], "invalid choice"),
    ],
)
def test_cli_refuses_bad_cluster_requests(tmp_path, capsys, extra: list, message: str) -> None:
    profile = tmp_path / "model.profile.json"
    save_profile(make_profile([1.0] * 4), profile)
    assert_fails(capsys, ["plan", profile, "--global-batch", 8, "--out", tmp_path / "p.json", *extra], message)


def test_export_gives_torchtitan_the_replicas() -> None:
    from export_plans import shell_words

    from planner.export import export_plan

    profile = make_profile([1.0] * 4)
    for shard, replicate, sharded in (("none", 4, 1), ("full", 1, 4)):
        cluster = Cluster(8, 8, 1e10, 1e10, 1e-5, shard=shard)
        plan = plan_cluster(profile, _request(8), cluster, MeshSearch(pipeline_degree=2), sha256=SHA).plan
        words = shell_words(export_plan(plan, "torchtitan").text())
        value = {flag.removeprefix("--parallelism."): words[i + 1] for i, flag in enumerate(words) if "." in flag}
        assert value["pipeline_parallel_degree"] == "2"
        assert (value["data_parallel_replicate_degree"], value["data_parallel_shard_degree"]) == (
            str(replicate),
            str(sharded),
        )


def test_a_reduction_overlapped_with_the_backward_leaves_only_what_outlasts_it() -> None:
    # DDP's buckets reduce behind the last backward: a rank's tail is the all-reduce less that backward, and never
    # less than its last bucket's (ready only when the backward ends); ZeRO-1 overlaps its reduce-scatter only, the
    # updated weights' all-gather follows.
    profile = make_profile([1e-3, 1e-3], param_counts=[10**7, 10**7])
    request = PlanRequest(num_ranks=2, global_batch_size=2)

    def tails(dp: DataParallel, model: Profile = profile) -> tuple[float, ...]:
        settings = CostSettings(data_parallel=dp)
        return make_plan(model, replace(request, settings=settings), sha256=SHA).predicted.runtime.step_tail_s

    slow = DataParallel(replicas=4, bytes_per_s=1e8, latency_s=0.0)
    per_param = bytes_per_param(profile.device.dtype, "adam")
    backward_s = 2e-3  # one unit's backward (twice its forward) a rank
    grads = 10**7 * per_param[1]
    assert grads > LAST_BUCKET_BYTES
    assert tails(slow) == pytest.approx((slow.allreduce_s(grads),) * 2)
    assert tails(replace(slow, overlaps_backward=True)) == pytest.approx((slow.allreduce_s(grads) - backward_s,) * 2)
    fast = replace(slow, bytes_per_s=1e12, overlaps_backward=True)
    assert fast.allreduce_s(grads) < backward_s
    assert tails(fast) == pytest.approx((fast.allreduce_s(LAST_BUCKET_BYTES),) * 2)
    small = make_profile([1e-3, 1e-3], param_counts=[10**5, 10**5])  # a bucket holds it all: nothing overlaps
    assert tails(fast, small) == pytest.approx((fast.allreduce_s(10**5 * per_param[1]),) * 2)
    zero1 = replace(slow, shard="optimizer", overlaps_backward=True)
    weights = 10**7 * per_param[0]
    expected = slow.gather_s(grads) - backward_s + slow.gather_s(weights)
    assert tails(zero1) == pytest.approx((expected,) * 2)


@pytest.mark.parametrize("seed", range(6))
def test_sharding_searched_chooses_what_the_best_explicit_sharding_gives(seed: int) -> None:
    # --shard auto searches each mode in one branch and bound: its plan is the fastest of the three searches
    # with the mode given, ties going to less memory, and it says each mode's best step.
    from planner.cost import SHARDING

    rng = random.Random(seed)
    profile = _random_profile(rng, (2**28, 2**29, 2**36))
    cluster = Cluster(rng.choice([4, 8]), 4, 1e10, 1e8, 1e-4)
    request = _request(8, link_bytes_per_s=1e9)
    searched = plan_cluster(profile, request, cluster, MeshSearch(shards=SHARDING), sha256=SHA)
    each = {}
    for shard in SHARDING:
        try:
            each[shard] = plan_cluster(profile, request, replace(cluster, shard=shard), sha256=SHA).plan
        except PlanInfeasibleError:
            continue
    best = min(each.values(), key=lambda p: (round(p.predicted.iteration_s, 12), p.mesh.used_devices))
    plan = searched.plan
    assert plan.predicted.iteration_s == pytest.approx(best.predicted.iteration_s, rel=1e-12)
    assert each[plan.mesh.shard].predicted.iteration_s == pytest.approx(plan.predicted.iteration_s, rel=1e-12)
    assert plan.constraints["shard"] == "auto"
    steps = plan.constraints["shard_best_s"]
    assert steps[plan.mesh.shard] == pytest.approx(plan.predicted.iteration_s, rel=1e-12)
    for shard, step in steps.items():
        assert isinstance(step, str) or step >= plan.predicted.iteration_s * (1 - 1e-12)
        if shard not in each:
            assert step == "no plan fits (memory or batch)" or step.startswith("pruned")


def test_sharding_searched_finds_the_mode_that_fits() -> None:
    # 4 units of 10M fp32 Adam parameters (160 MB each) on 256 MiB devices, 8 devices and 8 samples: unsharded,
    # one unit a device at most (pp 4 x dp 2); sharded over the replicas, fewer pipeline ranks hold it all.
    tight = make_profile([1.0] * 4, param_counts=[10**7] * 4, memory_bytes=2**28)
    cluster = Cluster(8, 8, 1e12, 1e12, 0.0)
    unsharded = plan_cluster(tight, _request(8), cluster, sha256=SHA).plan
    assert (unsharded.mesh.pp, unsharded.mesh.shard) == (4, "none")
    plan = plan_cluster(tight, _request(8), cluster, MeshSearch(shards=("none", "full")), sha256=SHA).plan
    assert plan.mesh.shard == "full" and plan.mesh.pp < 4
    assert plan.predicted.iteration_s < unsharded.predicted.iteration_s
    assert set(plan.constraints["shard_best_s"]) == {"none", "full"}


def test_cli_shard_auto_searches_what_the_trainer_runs(tmp_path, capsys) -> None:
    from planner.planning import _shards_searched
    from planner.trainer_rules import TRAINER_SHARDING

    assert _shards_searched(None) == ("none", "optimizer", "full")
    assert _shards_searched("torchtitan") == ("none", "full")  # no ZeRO-1 in torchtitan
    assert all("full" not in _shards_searched(t.value) for t in TRAINER_SHARDING if t.value != "torchtitan")
    profile = tmp_path / "model.profile.json"
    save_profile(make_profile([1.0] * 4, param_counts=[10**7] * 4, memory_bytes=2**28), profile)
    out = tmp_path / "plan.json"
    argv = ["plan", profile, "--devices", 8, "--global-batch", 8, "--shard", "auto", "--out", out]
    assert main([str(a) for a in argv]) == 0
    printed = capsys.readouterr().out
    assert "best step per sharding of the replicas: full: " in printed and "(chosen)" in printed
    assert "shard" in printed.split("\n")[1]  # the table of layouts has a column for it
    data = json.loads(out.read_text())
    assert data["mesh"]["shard"] == "full" and data["constraints"]["shard"] == "auto"
    assert load_plan(out).mesh.shard == "full"


def test_a_plan_for_a_trainer_is_costed_with_its_collectives() -> None:
    # pipeplan's runtime gathers an FSDP stage for every micro-batch; torchtitan keeps a pipeline stage gathered all
    # step and reduces behind the last backward; a ring leaving a node runs on each of its devices' NICs (NCCL).
    from planner.cluster import layout_settings
    from planner.planning import trainer_collectives

    assert trainer_collectives(None) == {}
    titan = MeshSearch(**trainer_collectives("torchtitan"))
    assert (titan.trainer_collectives, titan.overlap_grad_reduce) == (True, True)
    assert MeshSearch(**trainer_collectives("megatron")).overlap_grad_reduce is False  # Megatron-LM's default
    cluster = Cluster(16, 4, 1e11, 1e10, 1e-5, shard="full")
    request = _request(16)
    staged = Layout(pp=2, dp=8, placement="replicas-in-node", shard="full")
    ours = layout_settings(request, cluster, staged).data_parallel
    theirs = layout_settings(request, cluster, staged, titan).data_parallel
    assert (ours.gathered_all_step, ours.overlaps_backward, ours.bytes_per_s) == (False, False, 1e10)
    assert (theirs.gathered_all_step, theirs.per_unit, theirs.overlaps_backward) == (True, False, True)
    assert theirs.bytes_per_s == 4e10  # 4 replicas a node, each on its own NIC
    alone = layout_settings(request, cluster, replace(staged, pp=1, dp=16), titan).data_parallel
    assert (alone.per_unit, alone.gathered_all_step) == (True, False)
    profile = make_profile([1.0] * 4, sizes=(1, 2), param_counts=[10**7] * 4)
    slow, fast = (plan_cluster(profile, request, cluster, m, sha256=SHA).plan for m in (MeshSearch(), titan))
    assert fast.predicted.iteration_s < slow.predicted.iteration_s  # fewer gathers, a faster ring


def test_cli_collectives_cost_a_plan_as_a_trainer_runs_it_without_its_layout_rules(tmp_path, capsys) -> None:
    """--collectives torchtitan: the plan costed with torchtitan's collectives (and --shard auto searching its
    modes), without --for's layout rules, which a profile whose units torchtitan cannot cut would fail."""
    profile = tmp_path / "model.profile.json"
    save_profile(make_profile([1.0] * 4, sizes=(1, 2), param_counts=[10**7] * 4), profile)
    base = ["plan", profile, "--devices", 16, "--devices-per-node", 4, "--global-batch", 16, "--shard", "auto"]
    base += ["--intra-node-bandwidth", "100GB/s", "--inter-node-bandwidth", "10GB/s"]
    plans = {}
    for name in ("pipeplan", "torchtitan"):
        out = tmp_path / f"{name}.plan.json"
        assert main([str(a) for a in [*base, "--collectives", name, "--out", out]]) == 0
        plans[name] = (json.loads(out.read_text()), capsys.readouterr().out)
    ours, theirs = plans["pipeplan"][0], plans["torchtitan"][0]
    assert "collectives" not in ours["constraints"] and theirs["constraints"]["collectives"] == "torchtitan"
    assert set(ours["constraints"]["shard_best_s"]) == {"none", "optimizer", "full"}
    assert set(theirs["constraints"]["shard_best_s"]) == {"none", "full"}  # torchtitan has no ZeRO-1
    assert theirs["predicted"]["iteration_s"] < ours["predicted"]["iteration_s"]
    assert "(as torchtitan runs it)" in plans["torchtitan"][1]
    idle = ["plan", str(profile), "--collectives", "megatron", "--global-batch", "8", "--out", str(tmp_path / "p")]
    assert main(idle) == 2
    assert "--collectives: options of a cluster plan" in capsys.readouterr().err


def test_a_cluster_with_no_plan_that_fits_says_why_for_the_layout_it_names() -> None:
    # Each layout's search stops at "no plan fits" without the bisection for the smallest plan; the one layout
    # the refusal names is explained in full, as a single pipeline's search explains it.
    # 5 units of 6M fp32 Adam parameters (92 MiB each) on 4 devices of 256 MiB: every unit fits alone, two do not.
    tight = make_profile(
        [1.0] * 5, param_counts=[6 * 10**6] * 5, saved_bytes=[2**24] * 5, activation_bytes=2**22, memory_bytes=2**28
    )
    with pytest.raises(PlanInfeasibleError) as refused:
        plan_cluster(tight, _request(8), Cluster(4, 4, 1e12, 1e12, 0.0), MeshSearch(pipeline_degree=4), sha256=SHA)
    message = str(refused.value)
    assert message.startswith("no pp x dp layout of 4 devices gives a plan (pp=4 dp=1: ")
    named = re.search(r"\(pp=(\d+) dp=(\d+): (.*)\)$", message)
    assert named is not None
    pp, dp = int(named[1]), int(named[2])
    alone = replace(_request(8 // dp), num_ranks=pp)
    with pytest.raises(PlanInfeasibleError) as single:
        make_plan(tight, alone, sha256=SHA)
    assert named[3] == str(single.value) and "the smallest plan" in named[3]
