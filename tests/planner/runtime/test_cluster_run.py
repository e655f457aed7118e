"""Cluster plans on real processes: pp = 2 pipeline ranks x dp = 2 replicas on 4 gloo processes, against one process."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_plan

from planner.plan import Mesh
from planner.runtime.run_options import VerifyOptions
from planner.runtime.verify import verify_plan
from profiles.models import BUILTIN_MODELS


def _mesh(plan, shard: str, placement: str = "pipeline-in-node") -> Mesh:
    devices = ((0, 1), (2, 3)) if placement == "pipeline-in-node" else ((0, 2), (1, 3))
    return Mesh(
        pp=2,
        dp=2,
        placement=placement,
        shard=shard,
        num_devices=4,
        devices_per_node=4,
        global_batch_size=2 * plan.global_batch_size,
        devices=devices,
        hop_bytes_per_s=1e9,
        hop_latency_s=1e-4,
        ring_bytes_per_s=1e9,
        ring_latency_s=1e-4,
    )


@pytest.mark.parametrize(
    ("model", "split", "shard", "placement"),
    [
        # GPT-2's tied wte / lm_head on both pipeline ranks, DDP over the replicas.
        ("gpt2-tiny", "transformer.h.2", "none", "replicas-in-node"),
        # FSDP2 (fully_shard) over the replicas, each rank's shards stepped by Adam; the tied copies' shards
        # summed across the pipeline ranks of each replica.
        ("gpt2-tiny", "transformer.h.2", "full", "pipeline-in-node"),
    ],
)
def test_pp2_x_dp2_matches_one_process(model: str, split: str, shard: str, placement: str) -> None:
    base = make_plan(BUILTIN_MODELS[model](), [split], "1f1b", num_microbatches=2, micro_batch_size=2)
    plan = replace(base, mesh=_mesh(base, shard, placement))
    report = verify_plan(
        plan,
        model,
        VerifyOptions(mode="processes", steps=1, warmup=0, check_numerics=True, timeout_s=240, tolerance=0.25),
    )
    assert report.mode == "processes" and [r.rank for r in report.ranks] == [0, 1]
    assert report.numerics is not None and report.numerics.ok, report.numerics
    assert report.numerics.max_grad_abs_diff < 1e-6
