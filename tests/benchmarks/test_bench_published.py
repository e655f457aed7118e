"""bench_published reads any table of the published schema, and its statistics are what they say."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from planner.errors import PipeplanError
from profiles.device_model import DEVICE_MODELS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_published  # noqa: E402
import published_facts  # noqa: E402

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
    # Five rows, one pair swapped: 1 - 6 * 2 / (5 * 24) = 0.9 exactly, which a bar of >= 0.9 must read as met.
    assert bench_published.spearman([1, 2, 3, 4, 5], [1, 2, 3, 5, 4]) == 0.9
    assert bench_published.spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # ties
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


def test_an_unstated_torchtitan_micro_batch_is_its_default_at_the_rows_date() -> None:
    # 32 samples a replica over 4 pipeline ranks, 2 stages a rank: torchtitan split them into as many micro-batches
    # as ranks until its pull request #781 (2025-01-07), as stages until #1073 (2025-04-08), micro-batches of 1 since.
    def size(date: str | None, framework: str = "torchtitan", pp: int = 4) -> int:
        row = {"date": date} if date else {}
        return published_facts.torchtitan_microbatch_size(row, {"framework": framework}, 32, pp, 2)

    assert [size(d) for d in ("2024-12", "2025-01", "2025-03", "2025-04", "2026-02")] == [8, 4, 4, 1, 1]
    assert size(None) == 1 and size(None, "torchtitan 2024") == 8  # a year alone is its December
    assert size("2024-12", pp=1) == 32  # no pipeline: the replica's batch in one micro-batch
    rows = [
        dict(_row(4, 2, "none", 1.0), mbs=None, gbs=64, schedule=s, vp=v)
        for s, v in (("1f1b", 1), ("interleaved-1f1b", 2))
    ]
    for row in rows:
        row["date"] = "2024-12"
    table = _table(rows) | {"framework": "torchtitan"}
    assert [bench_published.predict_row(table, i).config for i in range(2)] == ["4x1x2 b8 none", "4x1x2 v2 b8 none"]


def test_a_gpu_is_read_by_its_name_as_the_device_models_spell_it_or_as_its_familys() -> None:
    facts = published_facts
    assert facts.gpu_key("NVIDIA A100 SXM4 80GB") == "a100-80gb"
    assert facts.gpu_key("H100_SXM5_80_GB") == "h100-80gb"
    assert facts.gpu_key("h800") == "h800"
    device, note = facts.device_for(dict(HARDWARE, gpu="NVIDIA H100 SXM5 80GB"))
    assert device.name == "h100-80gb" and note == ""
    # A GPU of a family with a device model takes the family's constants, with the memory and peak the table states.
    device, note = facts.device_for(dict(HARDWARE, gpu="h100-94gb", hbm_gib=94, peak_tflops_16bit=835))
    assert device.memory_bytes == 94 * 2**30 and device.matmul_flops_per_s == 835e12
    assert device.memory_bytes_per_s == DEVICE_MODELS["h100-80gb"].memory_bytes_per_s
    assert "h100-80gb's constants" in note
    with pytest.raises(PipeplanError, match="'mi300x' has no device model"):
        facts.device_for(dict(HARDWARE, gpu="mi300x"))


def test_a_row_pipeplan_cannot_read_or_does_not_model_is_reported_with_why_and_the_others_are_predicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = _row(2, 4, "none", 1.1)
    rows = [
        good,
        dict(good, gbs=None),
        dict(good, model="not in the table"),
        dict(good, schedule="chimera"),
        dict(good, recompute="block"),
        dict(good, mbs=2.5),
        dict(good, zero=5),
        None,
    ]
    table = _table(rows)
    results = [bench_published.predict_row(table, i) for i in range(len(rows))]
    assert results[0].iteration_s is not None and results[0].note == ""
    notes = [r.note for r in results[1:]]
    assert [r.iteration_s for r in results[1:]] == [None] * 7
    assert notes[0] == "global batch not published"
    assert notes[1] == "model 'not in the table' has no shape in the table"
    assert notes[2].startswith("unknown schedule 'chimera'")
    assert notes[3].startswith("recomputation 'block' is not modelled")
    assert notes[4] == "mbs 2.5 is not a positive whole number"
    assert notes[5] == "ZeRO stage 5 is not one of 0-3"
    assert notes[6] == "model 'None' has no shape in the table"
    # What was published is kept beside the note: the row's own measured time.
    assert results[3].measured_iteration_s == pytest.approx(1.1)
    # What a row leaves out is read as the schema's rules say: an unstated dp is the GPUs over tp x pp x cp, and
    # Megatron's 1F1B with virtual stages is interleaved 1F1B.
    derived = bench_published.predict_row(_table([dict(good, dp=None, gpus=8)]), 0)
    assert derived.config == "2x1x4 b1 none" and derived.iteration_s == pytest.approx(results[0].iteration_s)
    virtual = bench_published.predict_row(_table([dict(good, vp=2)]), 0)
    assert virtual.config == "2x1x4 v2 b1 none" and virtual.iteration_s is not None
    assert virtual.iteration_s < results[0].iteration_s  # the interleaved schedule's smaller bubble
    junk = bench_published.predict_row(_table([dict(good, measured={"iteration_s": "fast", "memory_gib": "a lot"})]), 0)
    assert junk.iteration_s is None and junk.measured_memory_gib is None
    assert junk.note == "iteration_s 'fast' is not a number"
    # Facts of the whole table: a shape, a precision, an architecture, a GPU with no device model of its family.
    for changed, why in [
        ({"models": {"m": dict(MODEL, layers=None)}}, "m: layers not published"),
        ({"models": {"m": dict(MODEL, arch="mixtral")}}, "m: architecture 'mixtral' is not modelled"),
        ({"precision": "tf32"}, "precision 'tf32' is not modelled"),
        ({"hardware": dict(HARDWARE, gpu="mi300x")}, "GPU 'mi300x' has no device model"),
    ]:
        assert bench_published.predict_row(_table([good]) | changed, 0).note.startswith(why), changed
    # The benchmark goes on past a table none of whose rows it can predict, and writes every table's result.
    monkeypatch.setenv("PIPEPLAN_RESULTS_DIR", str(tmp_path / "records"))
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    path = tmp_path / "tables.json"
    path.write_text(json.dumps([_table([good]) | {"hardware": dict(HARDWARE, gpu="mi300x")}, _table(rows)]))
    bench_published.main([str(path), "--out", str(tmp_path / "out"), "--trial"])
    unknown, mixed = json.loads((tmp_path / "out" / "result.json").read_text())
    assert unknown["rows"][0]["iteration_s"] is None and mixed["rows"][0]["iteration_s"] is not None
    assert len(mixed["rows"]) == len(rows)


def test_an_h800_node_runs_tensor_parallelism_over_less_nvlink_than_an_h100_node() -> None:
    row = dict(_row(1, 1, "none", 1.0), tp=8, gpus=8, sequence_parallel=True)
    hardware = {"gpu": "h100-80gb", "gpus_per_node": 8}
    h100 = bench_published.predict_row(_table([row]) | {"hardware": hardware}, 0)
    h800 = bench_published.predict_row(_table([row]) | {"hardware": dict(hardware, gpu="h800")}, 0)
    assert h100.iteration_s is not None and h800.iteration_s is not None
    assert h800.iteration_s > h100.iteration_s * 1.02  # the same chip; its collectives over 200 GB/s, not 450


def test_predicted_mfu_counts_the_flops_the_publication_counts() -> None:
    # A row that publishes its MFU and its time implies its FLOP count; the predicted MFU is in that count, so a
    # publication counting other FLOPs than pipeplan's (attention's causal half, the head) does not move it.
    row = _row(1, 8, "none", 2.0)
    own = bench_published.predict_row(_table([row]), 0)
    assert own.iteration_s is not None and own.mfu_predicted is not None and own.mfu_published is None
    published = dict(row, measured=dict(row["measured"], mfu=0.3))  # type: ignore[arg-type]
    theirs = bench_published.predict_row(_table([published]), 0)
    assert theirs.iteration_s == own.iteration_s
    assert theirs.mfu_predicted == pytest.approx(0.3 * 2.0 / own.iteration_s)
    # Without a published time, the time is the one its MFU implies in pipeplan's count: the same MFU either way.
    untimed = dict(row, measured=dict(row["measured"], iteration_s=None, mfu=0.3))  # type: ignore[arg-type]
    derived = bench_published.predict_row(_table([untimed]), 0)
    assert derived.mfu_predicted == pytest.approx(own.mfu_predicted)
