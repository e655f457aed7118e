"""The models people train, as a user brings them (tests/model_zoo.py): units, plans, and numerics on 2 ranks.

Each model is profiled once with its default units (module fixture), planned for P = 2 and P = 4 for a
global batch of 8, and its P = 2 plan is run for one step on 2 gloo processes (verify's own rank code,
all models in one launch: a launch costs seconds of imports) and compared with one process. The P = 4
plans run in replay mode (one process, every stage in schedule order): 4 processes on this 2-core CI
machine would cost more than the whole matrix.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import make_plan as make_hand_plan

from planner.request import PlanRequest
from planner.runtime.apply import tied_parameter_groups
from planner.runtime.launch import run_ranks
from planner.runtime.rank_timing import rank_main
from planner.runtime.run_options import VerifyOptions
from planner.runtime.verify import _merge_rank_grads, compare_numerics, reference_step, verify_plan
from planner.search import make_plan
from profiles.measure_settings import MeasureSettings
from profiles.profiler import profile_model
from profiles.workload import load_workload

torch.set_num_threads(1)

UNITS = {
    "gpt2": ["transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1", "transformer.ln_f", "lm_head"],
    "llama": ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"],
    "bert_mlm": ["bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "cls"],
    "vit": ["vit.embeddings", "vit.layers.0", "vit.layers.1", "vit.layernorm", "classifier"],
    # both block lists split; T5's shared embedding is called by both stacks, so it is no unit itself
    "t5": [
        "encoder.embed_tokens",
        "encoder.block.0",
        "encoder.block.1",
        "encoder.final_layer_norm",
        "decoder.embed_tokens",
        "decoder.block.0",
        "decoder.block.1",
        "decoder.final_layer_norm",
        "lm_head",
    ],
    "mixtral": ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"],
    # the children of the top-level Sequential, its two block stages opened into their blocks
    "cnn_sequential": ["0", "2.0", "2.1", "3", "4.0", "4.1", "7"],
    "unet": ["enc.0", "enc.1", "enc.2", "mid", "dec.0", "dec.1", "dec.2", "head"],
    "wrapped_gpt2": [
        "m.transformer.wte",
        "m.transformer.wpe",
        "m.transformer.h.0",
        "m.transformer.h.1",
        "m.transformer.ln_f",
        "m.lm_head",
    ],
}
MODELS = list(UNITS)
GLOBAL_BATCH = 8


def spec(name: str) -> str:
    return f"tests/model_zoo.py:{name}"


@pytest.fixture(scope="module")
def profiles():
    return {
        name: profile_model(
            load_workload(spec(name)),
            MeasureSettings(micro_batch_sizes=(2,), repeats=1, warmup=0, progress=False, min_time_s=0.0),
        )
        for name in MODELS
    }


@pytest.fixture(scope="module")
def plans(profiles):
    return {
        (name, p): make_plan(
            profiles[name],
            PlanRequest(num_ranks=p, global_batch_size=GLOBAL_BATCH),
            sha256="0" * 64,
        )
        for name in MODELS
        for p in (2, 4)
    }


@pytest.mark.parametrize("name", MODELS)
def test_default_units_follow_the_structure(profiles, name: str) -> None:
    profile = profiles[name]
    assert [u.name for u in profile.units] == UNITS[name]
    assert profile.settings["unit_choice"].startswith("default: ")
    # every parameter is measured in some unit (nothing lost between units)
    assert sum(u.param_count for u in profile.units) == profile.model.param_count


def test_profiles_say_how_the_model_was_adapted(profiles) -> None:
    assert profiles["t5"].settings["adapted"][0] == "inputs passed by keyword: input_ids, decoder_input_ids"
    assert "'logits' of the Seq2SeqLMOutput" in profiles["t5"].settings["adapted"][1]
    assert "unit_choice" in profiles["unet"].settings and "adapted" not in profiles["unet"].settings
    assert profiles["wrapped_gpt2"].settings["unit_choice"].startswith("default: inside wrapper m;")
    assert "encoder.block (2), decoder.block (2)" in profiles["t5"].settings["unit_choice"]


def test_expert_layout_is_recorded(profiles) -> None:
    assert profiles["mixtral"].settings["experts"] == [
        {"module": f"model.layers.{i}.mlp.experts", "unit": f"model.layers.{i}", "experts": 4, "top_k": 2}
        for i in range(2)
    ]
    assert "experts" not in profiles["llama"].settings


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("num_ranks", [2, 4])
def test_plans_cover_every_unit_once(plans, profiles, name: str, num_ranks: int) -> None:
    plan = plans[(name, num_ranks)]
    assert plan.num_ranks == num_ranks and plan.global_batch_size == GLOBAL_BATCH
    assert [u for s in plan.stages for u in s.units] == UNITS[name]
    assert all(s.units for s in plan.stages)


def _run_all(rank: int, world_size: int, jobs: list) -> list:
    """One rank: verify's rank code for every (spec, plan), one numerics step each."""
    return [rank_main(rank, world_size, s, plan, 1, 0, 0.0, 0.0, True, "cpu") for s, plan in jobs]  # no time floors


def _bert_hand_plan():
    """BERT cut before its last layer: rank 0 holds no copy of the decoder's tied bias (the crash of issue 10)."""
    workload = replace(load_workload(spec("bert_mlm")), units=tuple(UNITS["bert_mlm"]))
    return make_hand_plan(workload, ["bert.encoder.layer.1"], "1f1b", num_microbatches=4, micro_batch_size=2)


def test_two_processes_match_one_process(plans) -> None:
    jobs = [(spec(name), plans[(name, 2)]) for name in MODELS]
    jobs += [(spec("bert_mlm"), _bert_hand_plan())]
    jobs += [(spec("t5"), _t5_split_hand_plan(case)) for case in ("bias at several depths", "embedding passed on")]
    results = run_ranks(_run_all, (jobs,), 2, timeout_s=600)
    failed = []
    for k, (s, plan) in enumerate(jobs):
        per_rank = [results[r][k] for r in range(2)]
        loss = next(r.loss for r in per_rank if r.loss is not None)
        fresh = load_workload(s)
        grads = _merge_rank_grads([r.grads for r in per_rank], tied_parameter_groups(fresh.model))
        numerics = compare_numerics(*reference_step(fresh, plan), loss, grads)
        if not numerics.ok:
            failed.append((s, plan.schedule.value, [st.units for st in plan.stages], numerics))
    assert not failed


@pytest.mark.parametrize("name", MODELS)
def test_four_stages_replay_matches_one_process(plans, name: str) -> None:
    report = verify_plan(
        plans[(name, 4)],
        spec(name),
        VerifyOptions(mode="replay", steps=1, warmup=0, check_numerics=True, tolerance=0.25, timeout_s=300.0),
    )
    assert report.numerics is not None and report.numerics.ok, report.numerics


# T5 under a split backward: torch's own W fails or misses gradients on each of these cuts (profiles/weight_groups.py).
T5_SPLIT_CUTS = {
    # the position bias, made in block 0 and added in every block, puts a group's nodes one below another
    "bias at several depths": (["encoder.block.0"], "zero-bubble", 2),
    # a stage holding the decoder's embedding makes the decoder's input from token ids: from its weights alone
    "embedding passed on": (["encoder.final_layer_norm", "decoder.block.0", "decoder.block.1"], "zero-bubble", 2),
    # every unit a stage: several stages pass on outputs made from their weights alone
    "a unit a stage": (UNITS["t5"][2:], "zbv", 4),
}


def _t5_split_hand_plan(case: str):
    cuts, schedule, ranks = T5_SPLIT_CUTS[case]
    workload = replace(load_workload(spec("t5")), units=tuple(UNITS["t5"]))
    return make_hand_plan(workload, cuts, schedule, num_ranks=ranks, num_microbatches=4, micro_batch_size=2)


@pytest.mark.parametrize("case", list(T5_SPLIT_CUTS))
def test_t5_under_a_split_backward_matches_one_process(case: str) -> None:
    plan = _t5_split_hand_plan(case)
    report = verify_plan(
        plan,
        spec("t5"),
        VerifyOptions(mode="replay", steps=1, warmup=0, check_numerics=True, tolerance=10.0, timeout_s=300.0),
    )
    assert report.numerics is not None and report.numerics.ok, report.numerics
