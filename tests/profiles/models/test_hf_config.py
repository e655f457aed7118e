"""``hf:CONFIG.json`` models (profiles/models/hf_config.py): four tasks from config files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli import main
from cli_checks import assert_fails
from planner.errors import ModelSpecError
from profiles.format import load_profile
from profiles.workload import load_workload

torch.set_num_threads(1)

CONFIGS = {
    "causal-lm": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 32,
    },
    "masked-lm": {
        "model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 64, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 32,
        "hidden_dropout_prob": 0.1,
    },
    "seq2seq": {
        "model_type": "t5", "vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
        "num_decoder_layers": 2, "num_heads": 4, "decoder_start_token_id": 0, "pad_token_id": 0,
    },
    "image-classification": {
        "model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "image_size": 16, "patch_size": 8, "num_channels": 3,
    },
}  # fmt: skip
# a unit per block of each block list, before and after modules of their own
BLOCK_UNITS = {
    "causal-lm": ["model.layers.0", "model.layers.1"],
    "masked-lm": ["bert.encoder.layer.0", "bert.encoder.layer.1"],
    "seq2seq": ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"],
    "image-classification": ["vit.layers.0", "vit.layers.1"],
}


def _write(tmp_path: Path, task: str) -> Path:
    path = tmp_path / f"{task}.json"
    path.write_text(json.dumps(CONFIGS[task]))
    return path


@pytest.mark.parametrize("task", list(CONFIGS))
def test_each_task_profiles_from_a_config_file(tmp_path: Path, capsys, task: str) -> None:
    config = _write(tmp_path, task)
    out = tmp_path / "p.json"
    argv = ["profile", f"hf:{config}", "--micro-batch-sizes", "2", "--repeats", "1", "--warmup", "0"]
    argv += ["--no-pipeline-run", "--max-repeats", "1", "--min-time", "0"]
    assert main([*argv, "--seq-len", "8", "--no-progress", "--out", str(out)]) == 0
    profile = load_profile(out)
    names = [u.name for u in profile.units]
    assert [n for n in names if n in BLOCK_UNITS[task]] == BLOCK_UNITS[task]
    assert len(names) > len(BLOCK_UNITS[task])  # embeddings and heads are units too
    # the task came from the config (architectures, or encoder-decoder / image settings), and rides in the name
    expected = f"hf:{config}?task={task}" + ("" if task == "image-classification" else "&seq_len=8")
    assert profile.model.name == expected
    assert "random weights, dropout 0" in profile.settings["adapted"][0]
    assert "built " in capsys.readouterr().err


def test_the_profiled_name_rebuilds_the_same_model(tmp_path: Path) -> None:
    config = _write(tmp_path, "masked-lm")
    first = load_workload(f"hf:{config}", task="masked-lm", seq_len=8)
    again = load_workload(first.name)
    assert again.name == first.name
    assert all(torch.equal(a, b) for a, b in zip(first.model.parameters(), again.model.parameters(), strict=True))
    inputs, target = again.make_batch(3)
    assert [tuple(t.shape) for t in inputs] == [(3, 8), (3, 8)] and tuple(target.shape) == (3, 8)
    assert again.model.config.hidden_dropout_prob == 0.0  # 0.1 in the file: runs must be comparable
    assert isinstance(again.model(*inputs), torch.Tensor)  # logits, not a MaskedLMOutput


def test_bad_configs_are_one_line(tmp_path: Path, capsys, existing) -> None:
    no_type = tmp_path / "no_type.json"
    no_type.write_text('{"hidden_size": 8}')
    base = ["profile", "--repeats", "1", "--warmup", "0", "--out", existing]
    assert_fails(capsys, [*base[:1], f"hf:{no_type}", *base[1:]], 'has no "model_type"', existing)
    assert_fails(capsys, ["profile", f"hf:{tmp_path}/missing.json", *base[1:]], "config file not found", existing)
    config = _write(tmp_path, "causal-lm")
    assert_fails(capsys, ["profile", f"hf:{config}?task=causal-lm", "--task", "seq2seq", *base[1:]], "give it once")
    assert_fails(capsys, ["profile", "mlp", "--task", "seq2seq", *base[1:]], "--task applies to hf:CONFIG.json")
    with pytest.raises(ModelSpecError, match="exceeds the config's 32 positions"):
        load_workload(f"hf:{config}", seq_len=64)
