"""pipeplan export fed to the trainers themselves, not to our reading of them (pip install -e ".[trainers]").

- torchtitan 0.3.0: every export, split as a shell splits it, through ``ConfigManager.parse_args``; then its
  ``ParallelDims`` mesh, ``_pipeline_module_split`` and ``_build_pipeline_schedule`` on its llama3 debug model and
  one step on gloo, for 1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble and
  DualPipeV on 2 processes, 4 stages on 4, and pp 2 x dp 2 launched as examples/torchtitan/train.sh launches it
  (its command line recorded by a stand-in torchrun, its RANK rewrite applied): the modules each stage keeps,
  the pipeline rank and replica of each device, the loss against the unsplit model; and the untied Llama 3.2
  config of examples/torchtitan/config_registry.py against torchtitan's refusal of tied weights.
- DeepSpeed 0.19.8: each export's snippet used as examples/deepspeed/train.py uses it -- ``PlannedPipelineModule``
  over examples/custom_model.py on ``PLAN_TOPOLOGY``, ``deepspeed.initialize`` with ``PLAN_DS_CONFIG``, one
  ``train_batch`` -- on 4 gloo processes: pp 2 x dp 2 with ZeRO-1 and each pipeline on consecutive ranks,
  pp 2 x dp 2 the other way round, and 4 stages with activation checkpointing.
- accelerate 1.15.0: the export run by examples/accelerate/infer.py's ``prepared`` on 2 processes: the units
  each stage holds, and the logits of a call of ``NUM_CHUNKS`` samples.
- Megatron-Core: every export's layout through its ``PipelineParallelLayerLayout`` and ``RankGenerator``
  (megatron-core 0.16.1 on Python 3.11, whose layout file is the same as 0.19.2's); ``parse_args`` and
  ``validate_args`` where megatron.training installs (megatron-core 0.19, Python >= 3.12); and the command line
  examples/megatron/pretrain.sh builds.

A test skips, saying why, only where its trainer does not import. The trainers run in processes of their own
(tests/trainer_runs.py). Not run here: torchtitan's own training loop (in 0.3.0 it calls ``schedule.step`` with
per-micro-batch lists that torch 2.13 does not take, and its language models' flex attention has no backward
on CPU), and Megatron-Core's model and schedules (CUDA).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trainer_runs
from export_plans import GPT2_TINY, hand_plan, on_mesh, shell_words
from trainer_runs import DEBUGMODEL_LAYERS, DEEPSPEED_UNITS, spawn

from planner.export import export_plan, megatron_layers, rank_of_device
from planner.plan import Plan, save_plan
from planner.request import PlanRequest
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule
from planner.search import make_plan
from synthetic import make_profile

# transformers' Llama with the debug model's 6 layers, and docs/export.md's renames onto torchtitan's names.
LLAMA = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(DEBUGMODEL_LAYERS)), "model.norm", "lm_head"]
TORCHTITAN_RENAMES = [("model.embed_tokens", "tok_embeddings"), ("model.layers", "layers"), ("model.norm", "norm")]
TORCHTITAN_BASE = ["--module", "trainer_runs", "--config", "llama3_debugmodel_cpu", "--training.seq_len", "16"]
ROOT = Path(__file__).resolve().parents[2]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _needs(module: str) -> None:
    if not _installed(module):
        pytest.skip(
            f"{module} is not installed here: the trainers extra installs it (pip install -e '.[test,trainers]')"
        )


def _planned(ranks: int, schedule: Schedule | None, seed: int) -> Plan:
    """What ``pipeplan plan`` writes for the Llama units on seeded costs."""
    import dataclasses
    import random

    rng = random.Random(seed)
    profile = make_profile([rng.uniform(0.2, 2.0) for _ in LLAMA], sizes=(1, 2))
    units = tuple(dataclasses.replace(u, name=n) for u, n in zip(profile.units, LLAMA, strict=True))
    request = PlanRequest(num_ranks=ranks, global_batch_size=8 * ranks, schedule=schedule)
    return make_plan(dataclasses.replace(profile, units=units), request, sha256="0" * 64)


def _quarters(units: list[str]) -> list[list[str]]:
    return [units[:2], units[2:4], units[4:6], units[6:]]


# --- torchtitan 0.3.0 -------------------------------------------------------------------------------------


def _torchtitan_cases(plans: list[tuple[Plan, bool]]) -> list[dict]:
    return [
        {
            "argv": [*TORCHTITAN_BASE, *shell_words(export_plan(plan, "torchtitan", TORCHTITAN_RENAMES).text())],
            "run": run,
        }
        for plan, run in plans
    ]


def _recorded_launch(tmp_path: Path, script: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """What ``examples/<script>`` hands torchrun, recorded by a stand-in ``torchrun`` (and the ``pipeplan`` of
    this checkout) first on PATH: its arguments, and PLAN_RANKS from its environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "torchrun.json"
    stand_ins = {
        "torchrun": "import json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'ranks': os.environ.get('PLAN_RANKS')}}, open({str(record)!r}, 'w'))\n",
        "pipeplan": "import sys\nfrom cli import main\nsys.exit(main())\n",
    }
    for name in ("torchrun", "pipeplan"):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{stand_ins[name]}")
        path.chmod(0o755)
    python = bin_dir / "python"  # this interpreter (a link would lose its virtual environment)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    environment = {**os.environ, **(env or {}), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    subprocess.run(["bash", str(ROOT / "examples" / script), *args], env=environment, check=True, timeout=120)
    return json.loads(record.read_text())


def _check_torchtitan(plan: Plan, results: list[dict], index: int) -> None:
    """What torchtitan read, split and computed for ``plan`` (case ``index`` on every process)."""
    config = export_plan(plan, "torchtitan", TORCHTITAN_RENAMES)
    parts = [list(p) for p in config.module_fqns_per_model_part]
    dp = plan.mesh.dp if plan.mesh is not None else 1
    for result in results:
        case = result["cases"][index]
        parsed = case["parsed"]
        assert parsed["parts"] == parts
        assert (parsed["pp"], parsed["microbatch"]) == (plan.num_ranks, plan.micro_batch_size)
        assert "Schedule" + parsed["schedule"] == TORCH_SCHEDULE_CLASS[plan.schedule]
        assert parsed["local_batch"] == plan.global_batch_size and parsed["global_batch"] == dp * plan.global_batch_size
        assert parsed["replicate"] * parsed["shard"] == dp and parsed["cuda_graphs_off"]
        tp = plan.mesh.tp if plan.mesh is not None else 1
        assert parsed["tp"] == tp  # torchtitan's own parse of the degree (1: the flag is left out)
        assert parsed["sequence_parallel"] == (tp == 1 or plan.constraints["sequence_parallel"])
        recompute = any(s.recompute for s in plan.stages)
        assert parsed["activation_checkpoint"] == ("FullAC.Config" if recompute else None)
        if "holds" not in case:
            continue
        if plan.mesh is not None:
            assert (case["replica"], case["pp_rank"]) == plan.mesh.coordinates(case["device"])
        for stage, kept in case["holds"].items():
            assert kept == parts[int(stage)]  # the plan's units under torchtitan's names, no more, no fewer
            assert plan.stages[int(stage)].rank == case["pp_rank"]
        if "loss" in case:
            assert case["loss"] == pytest.approx(case["reference_loss"], rel=1e-5)
    if "holds" in results[0]["cases"][index]:
        held = {int(s) for r in results for s in r["cases"][index]["holds"]}
        assert held == set(range(plan.num_stages))
        assert sum("loss" in r["cases"][index] for r in results) == dp  # the last stage of each replica


def test_torchtitan_splits_and_steps_every_schedule_as_planned() -> None:
    _needs("torchtitan")
    plans = [
        (hand_plan([LLAMA[:4], LLAMA[4:]]), True),
        (hand_plan([LLAMA[:4], LLAMA[4:]], schedule=Schedule.GPIPE, micro_batch_size=2, num_microbatches=4), True),
        *(
            (hand_plan(_quarters(LLAMA), ranks=2, schedule=schedule), True)
            for schedule in (
                Schedule.INTERLEAVED_1F1B,
                Schedule.LOOPED_BFS,
                Schedule.ZERO_BUBBLE,
                Schedule.ZBV,
                Schedule.DUALPIPEV,
            )
        ),
        (hand_plan([LLAMA[:5], LLAMA[5:]], recompute=(0,)), False),
        (on_mesh(hand_plan([LLAMA[:4], LLAMA[4:]]), 2, tp=2), False),
        (on_mesh(hand_plan([LLAMA[:4], LLAMA[4:]]), 1, tp=4, sequence_parallel=False), False),
        *((_planned(2, schedule, seed), False) for seed, schedule in enumerate([None, Schedule.ZBV])),
    ]
    results = spawn(trainer_runs.torchtitan_worker, 2, _torchtitan_cases(plans))
    for index, (plan, _) in enumerate(plans):
        _check_torchtitan(plan, results, index)


def test_torchtitan_runs_4_stages_and_a_cluster_plan_on_4_processes(tmp_path) -> None:
    _needs("torchtitan")
    cluster = on_mesh(hand_plan([LLAMA[:4], LLAMA[4:]], micro_batch_size=2, num_microbatches=2), 2)
    plans = [
        (cluster, True),
        (hand_plan(_quarters(LLAMA), recompute=(0, 1, 2, 3)), True),
        (on_mesh(hand_plan([LLAMA[:4], LLAMA[4:]]), 2, placement="replicas-in-node", shard="full"), False),
    ]
    cases = _torchtitan_cases(plans)
    # examples/torchtitan/train.sh's command line for the cluster plan: torchrun's arguments after the bash
    # that rewrites RANK, and the ranks it rewrites to, which every process below is given.
    plan_file = tmp_path / "cluster.plan.json"
    save_plan(cluster, plan_file)
    launch = _recorded_launch(
        tmp_path, "torchtitan/train.sh", str(plan_file), *TORCHTITAN_BASE[1:4:2], "--training.seq_len", "16"
    )
    ranks = tuple(int(r) for r in launch["ranks"].split())
    assert ranks == rank_of_device(cluster) == (0, 2, 1, 3)  # pipeline-in-node: not the devices' own
    assert launch["argv"][:4] == ["--nproc-per-node", "4", "--no-python", "bash"]
    argv = launch["argv"][launch["argv"].index("bash", 4) + 1 :]
    assert argv == cases[0]["argv"]  # the flags as the export prints them, after the user's
    cases.append({"argv": argv, "run": False})
    # A tied Llama 3.2 config torchtitan refuses under a pipeline, and examples/torchtitan's untied one.
    untied = [
        "--module",
        "examples.torchtitan.config_registry",
        "--config",
        "llama3_2_3b_untied",
        *cases[0]["argv"][4:],
    ]
    cases.append({"argv": untied, "run": False, "tying": True})
    results = spawn(trainer_runs.torchtitan_worker, 4, cases, ranks=ranks)
    for index, (plan, _) in enumerate(plans):
        _check_torchtitan(plan, results, index)
    _check_torchtitan(cluster, results, len(plans))
    for result in results:
        assert result["cases"][-1]["parsed"]["tied_refused"] == "Weight tying is not supported with Pipeline Parallel."


# --- DeepSpeed 0.19.8 -------------------------------------------------------------------------------------


def test_deepspeed_initializes_and_trains_pp_x_dp_plans() -> None:
    _needs("deepspeed")
    units = list(DEEPSPEED_UNITS)
    halves = [units[:3], units[3:]]
    plans = [
        on_mesh(hand_plan(halves, micro_batch_size=2, num_microbatches=4), 2, shard="optimizer"),
        on_mesh(hand_plan(halves, schedule=Schedule.GPIPE, num_microbatches=4), 2, placement="replicas-in-node"),
        hand_plan([units[:2], units[2:4], units[4:6], units[6:]], recompute=(0, 1, 2, 3)),
    ]
    snippets = [export_plan(plan, "deepspeed").text() for plan in plans]
    results = spawn(trainer_runs.deepspeed_worker, 4, snippets)
    for index, plan in enumerate(plans):
        dp = plan.mesh.dp if plan.mesh is not None else 1
        for device, result in enumerate(results):
            case = result["cases"][index]
            stage_rank = case["pipe"]
            if plan.mesh is not None:
                assert (case["data"], case["pipe"]) == plan.mesh.coordinates(device)
            assert case["holds"] == list(plan.stages[stage_rank].units)
            assert case["train_batch_size"] == dp * plan.global_batch_size
            assert case["zero_stage"] == (1 if plan.mesh is not None and plan.mesh.shard == "optimizer" else 0)
            assert case["loss"] == pytest.approx(case["reference_loss"], rel=1e-5)


# --- accelerate 1.15.0 ------------------------------------------------------------------------------------


def test_accelerate_runs_the_export_as_its_comments_say(tmp_path) -> None:
    _needs("accelerate")
    _needs("transformers")
    plan = hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], micro_batch_size=2, num_microbatches=4)
    export = tmp_path / "gpt2_accelerate.py"
    export.write_text(export_plan(plan, "accelerate").text())
    results = spawn(trainer_runs.accelerate_worker, 2, str(export), 8)
    for rank, result in enumerate(results):
        assert result["stage"] == rank and result["num_chunks"] == plan.num_microbatches
        assert result["holds"] == sorted(plan.stages[rank].units)
    last = results[-1]
    assert last["shape"] == [plan.num_microbatches, 8, 128]  # a call of NUM_CHUNKS samples, micro-batch 1
    assert last["max_abs_diff"] < 1e-5


# --- Megatron-Core ----------------------------------------------------------------------------------------


def _megatron_plans() -> list[Plan]:
    llama8 = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(8)), "model.norm", "lm_head"]
    sixths = [llama8[:2], llama8[2:4], llama8[4:5], llama8[5:7], llama8[7:8], llama8[8:]]
    plans = [
        hand_plan([llama8[:5], llama8[5:]]),
        hand_plan([llama8[:3], llama8[3:6], llama8[6:8], llama8[8:]], ranks=2, schedule=Schedule.INTERLEAVED_1F1B),
        hand_plan(sixths, ranks=3, schedule=Schedule.INTERLEAVED_1F1B, num_microbatches=6),
        hand_plan([llama8[:3], llama8[3:5], llama8[5:7], llama8[7:]], schedule=Schedule.GPIPE, recompute=(1,)),
        on_mesh(hand_plan([llama8[:5], llama8[5:]], micro_batch_size=2, num_microbatches=4), 2, shard="optimizer"),
        on_mesh(hand_plan([llama8[:5], llama8[5:]]), 4, placement="replicas-in-node"),
        on_mesh(hand_plan([llama8[:5], llama8[5:]]), 2, tp=2),
        on_mesh(hand_plan([llama8[:5], llama8[5:]]), 2, placement="replicas-in-node", tp=4, sequence_parallel=False),
    ]
    for seed, (ranks, schedule) in enumerate([(2, None), (4, Schedule.ONE_F_ONE_B), (2, Schedule.INTERLEAVED_1F1B)]):
        plan = _planned(ranks, schedule, 100 + seed)
        try:
            export_plan(plan, "megatron")
        except Exception:  # a cut inside E or L, refused with its reason (tests/planner/test_export.py)
            continue
        plans.append(plan)
    return plans


def _megatron_cases(plans: list[Plan]) -> list[dict]:
    world = [plan.mesh.used_devices if plan.mesh is not None else plan.num_ranks for plan in plans]
    return [
        {"words": shell_words(export_plan(plan, "megatron").text()), "world": w}
        for plan, w in zip(plans, world, strict=True)
    ]


def test_megatron_core_builds_each_stage_of_every_export_as_planned() -> None:
    _needs("megatron.core")
    plans = _megatron_plans()
    (result,) = spawn(trainer_runs.megatron_worker, 1, _megatron_cases(plans), False)
    for plan, case in zip(plans, result["cases"], strict=True):
        roles = megatron_layers([u for s in plan.stages for u in s.units])
        layer_of = {unit: k for k, layer in enumerate(roles.decoder) for unit in layer}
        assert case["vpp"] == plan.num_stages // plan.num_ranks
        for stage in plan.stages:
            built = case["stages"][str(stage.index)]
            assert built["rank"] == stage.rank
            assert built["layers"] == sorted({layer_of[u] for u in stage.units if u in layer_of})
            assert built["embedding"] == (roles.embedding[0] in stage.units)
            assert built["loss"] == (roles.loss[-1] in stage.units)
        # Megatron's pipeline groups: each the devices of one replica's pipeline (one per member of its tensor-parallel
        # groups), in stage order.
        if plan.mesh is not None:
            pipelines = [[d + j for d in row] for row in plan.mesh.devices for j in range(plan.mesh.tp)]
        else:
            pipelines = [list(range(plan.num_ranks))]
        assert sorted(case["pipelines"]) == sorted(pipelines)


def test_megatron_example_hands_pretrain_gpt_the_export_as_printed(tmp_path) -> None:
    plan = _megatron_plans()[4]  # pp 2 x dp 2, each pipeline on consecutive devices, ZeRO-1
    plan_file = tmp_path / "p.plan.json"
    save_plan(plan, plan_file)
    launch = _recorded_launch(
        tmp_path, "megatron/pretrain.sh", str(plan_file), "--hidden-size", "64", env={"MEGATRON": "/opt/Megatron-LM"}
    )
    words = shell_words(export_plan(plan, "megatron").text())
    assert launch["argv"] == [
        "--nproc-per-node",
        "4",
        "/opt/Megatron-LM/pretrain_gpt.py",
        "--hidden-size",
        "64",
        *words,
    ]
    assert words[words.index("--pipeline-model-parallel-layout") + 1] == "Et*4|t*4L"  # unquoted, as argparse gets it
    assert words[-2:] == ["--use-distributed-optimizer", "--use-tp-pp-dp-mapping"]


def test_megatron_arguments_accept_every_export() -> None:
    if not _installed("megatron.training"):
        pytest.skip(
            f"megatron.training (parse_args, validate_args) ships in the megatron-core 0.19 wheel, which needs "
            f"Python >= 3.12; this is Python {sys.version_info.major}.{sys.version_info.minor}, where pip offers "
            "megatron-core 0.16.1, whose wheel has megatron.core only"
        )
    plans = _megatron_plans()
    (result,) = spawn(trainer_runs.megatron_worker, 1, _megatron_cases(plans), True)
    for plan, case in zip(plans, result["cases"], strict=True):
        config = export_plan(plan, "megatron")
        dp = plan.mesh.dp if plan.mesh is not None else 1
        vpp = plan.num_stages // plan.num_ranks
        assert case["args"] == {
            "pp": plan.num_ranks,
            "vpp": vpp if vpp > 1 else None,
            "dp": dp,
            "global": dp * plan.global_batch_size,
            "micro": plan.micro_batch_size,
            "num_layers": config.num_layers,
            "layout": config.pipeline_model_parallel_layout,
            "distributed_optimizer": config.use_distributed_optimizer,
            "tp_pp_dp_mapping": config.use_tp_pp_dp_mapping,
            "tp": config.tensor_model_parallel_size,
            "sequence_parallel": config.sequence_parallel,
        }
