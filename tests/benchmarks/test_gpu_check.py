"""The prepared device check (benchmarks/gpu_check.py) runs its CPU path end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_cpu_path(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["device"] == "cpu" and result["torch"] == torch.__version__ and len(result["date"]) == 10
    assert result["calibration"]["device_kind"] == "cpu" and result["calibration"]["num_ranks"] == 2
    (model,) = result["models"]
    assert model["name"] == "gpt2-tiny" and model["dtype"] == "float32"
    assert len(model["unit_sum_error_pct"]) == 3 and len(model["replay_error_pct"]) == 1
    assert model["memory_error_pct"] == [None]  # no allocator peak on CPU
    assert model["plans"][0]["predicted_iteration_s"] > 0 and model["plans"][0]["replayed_iteration_s"] > 0
    assert model["unit_timing"] == {"units": "alone"}  # the CPU times each unit alone
    for name in ("calibration.json", "gpt2-tiny.profile.json", "gpt2-tiny.p2.plan.json", "check.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| replayed vs predicted iteration (2, 4 stages) |" in (tmp_path / "check.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the refusal is for machines without one")
def test_gpu_check_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cuda", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "no CUDA device here" in done.stderr
