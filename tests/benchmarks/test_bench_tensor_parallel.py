"""bench_tensor_parallel plans its cases on device-model profiles, with the published trainer's collectives."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_tensor_parallel  # noqa: E402


def test_each_model_is_profiled_by_its_gpus_device_model() -> None:
    gpt3 = next(c for c in bench_tensor_parallel.CASES if c.model.arch == "gpt")
    llama = next(c for c in bench_tensor_parallel.CASES if c.model.arch == "llama")
    (gpt3_profile, a100), (llama_profile, h100) = map(bench_tensor_parallel.case_profile, (gpt3, llama))
    assert (a100.name, h100.name) == ("a100-80gb", "h100-80gb")
    assert gpt3_profile.settings["modelled"] and llama_profile.settings["modelled"]
    assert len(gpt3_profile.units) == 96 + 4 and len(llama_profile.units) == 80 + 3  # gpt: two embeddings
    assert gpt3_profile.micro_batch_sizes == llama_profile.micro_batch_sizes == bench_tensor_parallel.SIZES


def test_the_smallest_case_plans_every_device_within_memory() -> None:
    case = bench_tensor_parallel.CASES[0]  # GPT-3 175B on 64 A100s: no published row at this size
    (row,) = bench_tensor_parallel.run_case(case, jobs=1)
    pp, tp, dp = (int(x) for x in row[4].split(" x "))
    assert row[3] == "pipeplan" and pp * tp * dp == case.devices and tp in (1, 2, 4, 8)
    assert float(row[10].split(" GiB")[0]) <= 80
