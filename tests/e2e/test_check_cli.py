"""``pipeplan check``: exit 0 when the configuration fits every rank, 1 when a rank would run out of memory
(named), 2 on a configuration it cannot read or the trainer would refuse (one line, nothing on disk touched);
and a hand layout over one rank's memory is flagged before it runs, then measured over by ``verify``."""

from __future__ import annotations

import warnings

import pytest
import torch

from cli import main
from cli_checks import assert_fails
from planner.check import CheckOptions, check_config
from planner.errors import PipeplanWarning
from planner.plan import load_plan
from planner.runtime.run_options import VerifyOptions
from planner.runtime.verify import verify_plan
from profiles.format import save_profile
from profiles.measure_settings import MeasureSettings
from profiles.models import BUILTIN_MODELS
from profiles.profiler import profile_model
from synthetic import transformer_profile

MEGATRON = "--pipeline-model-parallel-size 4 --micro-batch-size 1 --global-batch-size 16\n"


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "llama.profile.json"
    save_profile(transformer_profile("llama", layers=8, sizes=(1, 2)), path)
    return path


def test_a_configuration_that_fits_exits_0_and_writes_its_plan(profile_file, tmp_path, capsys) -> None:
    config, out = tmp_path / "megatron.args", tmp_path / "mine.plan.json"
    config.write_text(MEGATRON)
    assert main(["check", str(profile_file), "--from", "megatron", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "decoder layers per stage = 2, 2, 2, 2" in printed and "verdict: fits every rank" in printed
    assert "pipeplan's best plan under Megatron-Core's rules" in printed
    plan = load_plan(out)
    assert plan.solver.name == "given" and plan.num_ranks == 4 and plan.num_microbatches == 16
    assert main(["simulate", str(out)]) == 0


def test_a_rank_over_its_memory_exits_1_naming_it(profile_file, tmp_path, capsys) -> None:
    config = tmp_path / "megatron.args"
    config.write_text(MEGATRON)
    profile = transformer_profile("llama", layers=8, sizes=(1, 2))
    peaks = [r.peak_bytes for r in check_config(profile, "megatron", MEGATRON, CheckOptions(no_best=True)).ranks]
    # Between the middle ranks' peak and the first rank's (embedding and two layers): the first is over.
    memory = int((peaks[1] + peaks[0]) / 2 / 0.9)
    code = main(["check", str(profile_file), "--from", "megatron", str(config), "--memory", str(memory), "--no-best"])
    printed = capsys.readouterr().out
    assert code == 1
    assert "verdict: does not fit: rank" in printed and "rank 0: predicted peak" in printed
    assert "OVER by" in printed.split("rank 0: predicted peak")[1].split("\n")[0]
    assert "OVER" not in printed.split("rank 1: predicted peak")[1].split("\n")[0]


@pytest.mark.parametrize(
    ("trainer", "text", "message"),
    [
        ("megatron", "--pipeline-model-parallel-size 3 --micro-batch-size 1", "num_layers should be divisible"),
        ("deepspeed", "{not json", "cannot read the ds_config as JSON"),
        (
            "deepspeed",
            '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "pipeline": {"stages": 2}}',
            "ZeRO-2 and ZeRO-3",
        ),
        ("torchtitan", "--parallelism.pipeline_parallel_degree 2", "Set --training.disable_cuda_graphs"),
        ("megatron", "--micro-batch-size 4 --global-batch-size 8", "micro-batch size 4 was not profiled"),
    ],
)
def test_unreadable_or_refused_configurations_are_one_line(
    profile_file, tmp_path, capsys, existing, trainer, text, message
) -> None:
    config = tmp_path / "config"
    config.write_text(text)
    argv = ["check", profile_file, "--from", trainer, config, "--out", existing]
    assert_fails(capsys, argv, message, existing)


def test_missing_files_and_unknown_trainers_are_one_line(profile_file, tmp_path, capsys) -> None:
    assert_fails(capsys, ["check", profile_file, "--from", "megatron", tmp_path / "none"], "no configuration file")
    assert_fails(capsys, ["check", profile_file, "--from", "accelerate", tmp_path / "none"], "invalid choice")


@pytest.fixture(scope="module")
def gpt2_tiny_profile():
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PipeplanWarning)  # a busy machine: its times, not its bytes
        return profile_model(
            BUILTIN_MODELS["gpt2-tiny"](),
            MeasureSettings(micro_batch_sizes=(2,), repeats=1, warmup=1, min_time_s=0.0, progress=False),
        )


def test_a_hand_layout_over_one_rank_is_flagged_then_measured_over(gpt2_tiny_profile, tmp_path, capsys) -> None:
    """Megatron's layout with every decoder layer on the last rank: check names that rank before anything runs,
    its plan replayed by verify measures that stage over the memory given, and the best plan check prints fits."""
    profile_path, config, out = tmp_path / "tiny.profile.json", tmp_path / "mlm.args", tmp_path / "mine.plan.json"
    save_profile(gpt2_tiny_profile, profile_path)
    text = '--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "E|t*4L" --micro-batch-size 2 '
    text += "--global-batch-size 8"
    config.write_text(text)
    # --memory is each CPU rank's: just under the last stage of the hand layout's plan as check writes it (the
    # plan verify replays, whose measured peak verify holds to the whole of it), so that check, which keeps a
    # plan within 90 % of it, must find a plan of its own that fits.
    assert main(["check", str(profile_path), "--from", "megatron", str(config), "--out", str(out)]) == 0
    capsys.readouterr()
    hand = [s.memory_bytes.peak for s in load_plan(out).stages]
    memory = int(hand[1] * 0.99)
    assert hand[0] < 0.9 * memory
    code = main(
        ["check", str(profile_path), "--from", "megatron", str(config), "--memory", str(memory), "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "verdict: does not fit: rank 1 would run out of memory" in printed
    assert "rank 0: predicted peak" in printed and "OVER" not in printed.split("rank 0:")[1].split("\n")[0]
    best_part = printed.split("pipeplan's best plan")[1]
    assert "usable: fits every rank" in best_part and ("faster" in best_part or "as fast" in best_part)
    report = verify_plan(
        load_plan(out), "gpt2-tiny", VerifyOptions(mode="replay", steps=1, warmup=1, tolerance=1e9, timeout_s=300.0)
    )
    assert report.stages[1].over_capacity and not report.stages[0].over_capacity, [
        (s.predicted_memory_bytes, s.measured_memory_bytes, s.capacity_bytes) for s in report.stages
    ]
    assert not report.memory_ok
