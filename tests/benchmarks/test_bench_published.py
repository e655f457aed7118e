"""bench_published reads any table of the published schema, and its statistics are what they say."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_published  # noqa: E402

HARDWARE = {
    "gpu": "h100-80gb",
    "peak_tflops_16bit": 989.4,
    "hbm_gib": 80,
    "gpus_per_node": 8,
    "intra_node_GBps_per_gpu": 900,
    "inter_node_Gbps_per_gpu": 400,
}
MODEL = {
    "arch": "llama",
    "layers": 8,
    "hidden": 2048,
    "heads": 16,
    "kv_heads": 4,
    "ffn_hidden": 5632,
    "vocab": 32000,
    "seq_len": 4096,
    "tied_embeddings": False,
}


def _row(pp: int, dp: int, recompute: str, seconds: float, cp: int = 1) -> dict[str, object]:
    return {
        "model": "m",
        "gpus": pp * dp * cp,
        "dp": dp,
        "tp": 1,
        "pp": pp,
        "vp": 1,
        "cp": cp,
        "mbs": 1,
        "gbs": 32,
        "schedule": "1f1b" if pp > 1 else None,
        "recompute": recompute,
        "sequence_parallel": False,
        "zero": 1,
        "date": "2025-01",
        "measured": {
            "iteration_s": seconds,
            "tokens_per_s_per_gpu": None,
            "samples_per_s": None,
            "tflops_per_gpu": None,
            "memory_gib": None,
            "oom": False,
            "mfu": None,
            "hfu": None,
        },
    }


def _table(rows: list[dict[str, object]]) -> dict[str, object]:
    """A table none of the benchmark's own: one model on H100s, Megatron-LM's."""
    return {
        "id": "unseen",
        "source": "test",
        "comparable": "all",
        "hardware": HARDWARE,
        "models": {"m": MODEL},
        "precision": "bf16",
        "framework": "Megatron-LM",
        "rows": rows,
    }


def test_spearman_and_pair_errors_by_hand() -> None:
    assert bench_published.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert bench_published.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert bench_published.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert bench_published.spearman([1, 2], [1, 2]) is None
    # predicted 2:1 where 4:1 was measured: the ratio is off by half.
    assert bench_published.pair_errors([(2.0, 4.0), (1.0, 1.0)]) == [pytest.approx(50.0)]


def test_an_unseen_table_is_read_predicted_and_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEPLAN_RESULTS_DIR", str(tmp_path / "records"))
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # the benchmark tees it; put it back afterwards
    table = _table(
        [_row(1, 8, "none", 1.0), _row(2, 4, "none", 1.1), _row(2, 4, "full", 1.4), _row(1, 2, "none", 1.0, cp=4)]
    )
    path = tmp_path / "tables.json"
    path.write_text(json.dumps([table]))
    bench_published.main([str(path), "--out", str(tmp_path / "out"), "--trial"])
    (result,) = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["id"] == "unseen" and len(result["rows"]) == 4
    timed = [r for r in result["rows"] if r["iteration_s"] is not None]
    assert len(timed) == 3 and all(r["fits"] for r in timed)
    full, plain = timed[2]["iteration_s"], timed[1]["iteration_s"]
    assert 1.2 < full / plain < 1.4  # one more forward in four passes' worth of work
    assert result["oom_agreement"] == 1.0 and result["spearman"] is not None
    assert result["rows"][3]["note"] == "context parallelism is not modelled"


def test_best_searches_the_best_published_rows_cluster_and_holds_its_plan_to_it() -> None:
    # The best row is the one of most samples a GPU-second as measured (here 2x4 over 1x8, both on 8 GPUs);
    # pipeplan searches the same 8 devices and batch, and the speed-up is that row's prediction over its plan's.
    # A cluster over --best's bound is named, not searched.
    table = _table([_row(1, 8, "none", 1.2), _row(2, 4, "none", 1.0)])
    rows = [bench_published.predict_row(table, i) for i in range(2)]
    (best,) = bench_published.best_plans(table, rows)
    assert best["model"] == "m" and best["published"]["index"] == 1
    assert best["pipeplan"] is not None and best["pipeplan"]["iteration_s"] > 0
    assert best["speedup"] == pytest.approx(rows[1].iteration_s / best["pipeplan"]["iteration_s"])
    # Costed as the row is (its framework's collectives and shardings), the search, whose space holds the published
    # layout, finds one at least as fast.
    assert best["speedup"] >= 1.0 - 1e-9, best
    # ... over the shardings its framework runs: torchtitan FSDP or none, the others ZeRO-1 or none.
    shape, _ = bench_published.shape_for("m", table["models"]["m"])
    titan = dict(table, framework="torchtitan")
    assert bench_published._framework_shardings(bench_published._workload(table, table["rows"][0], shape)) == (
        "none",
        "optimizer",
    )
    assert bench_published._framework_shardings(bench_published._workload(titan, titan["rows"][0], shape)) == (
        "none",
        "full",
    )
    big = dict(table, rows=[dict(_row(2, 4, "none", 1.0), gpus=4096, dp=2048, gbs=4096)])
    (skipped,) = bench_published.best_plans(big, [bench_published.predict_row(big, 0)])
    assert skipped["pipeplan"] is None and "not searched: 4096 devices" in skipped["note"]


def test_an_unstated_zero_is_the_frameworks_default() -> None:
    # NeMo's and Megatron-Bridge's recipes turn on the distributed optimizer; Megatron-LM leaves it off, and OneFlow's
    # GPT of 2021 had none. A stated stage is taken as stated.
    shape, _ = bench_published.shape_for("m", MODEL)
    row = dict(_row(1, 8, "none", 1.0), zero=None)

    def shard(framework: str, zero: int | None = None) -> str:
        return bench_published._workload(_table([]) | {"framework": framework}, row | {"zero": zero}, shape).shard

    assert [shard(f) for f in ("NeMo 24.07", "Megatron-Bridge 25.09", "Megatron-LM", "OneFlow")] == [
        "optimizer",
        "optimizer",
        "none",
        "none",
    ]
    assert shard("OneFlow", 1) == "optimizer" and shard("NeMo", 0) == "none" and shard("torchtitan", 3) == "full"
