"""Meta profiles (profiles/meta.py, profiles/meta_profile.py): one unit materialised at a time.

A meta profile must describe the same model as a loaded one (units, parameters, bytes, FLOPs, data flow:
timings are not compared), copy identical blocks only when asked and say so, hold far less than the
model's weights, and refuse what it cannot do in one line with exit code 2.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from cli import main
from cli_checks import assert_fails
from planner.errors import ModelSpecError
from profiles.measure_settings import MeasureSettings
from profiles.meta import materialise, move_to_meta, parameters_on_meta
from profiles.profiler import profile_model
from profiles.workload import load_workload

REPO = Path(__file__).resolve().parents[2]
FAST = {"repeats": 1, "max_repeats": 1, "warmup": 0, "progress": False, "min_time_s": 0.0}
TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 200,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "use_cache": False,
}


def _structure(unit):
    """Everything a unit's profile holds but its timings."""
    return (
        unit.name,
        unit.type,
        unit.param_count,
        unit.param_bytes,
        unit.tied_params,
        unit.tied_param_count,
        unit.param_tensor_count,
        unit.flops,
        unit.output_bytes,
        unit.saved_bytes,
        unit.weight_grad_bytes,
    )


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return f"hf:{path}"


def test_meta_profile_describes_the_same_model_as_a_loaded_one():
    # gpt2-tiny: tied embedding and LM head, position embeddings, an integer input reaching the first unit
    sizes = {"micro_batch_sizes": (1, 2)}
    loaded = profile_model(load_workload("gpt2-tiny", seq_len=8), MeasureSettings(**sizes, **FAST))
    meta = profile_model(load_workload("gpt2-tiny", meta=True, seq_len=8), MeasureSettings(**sizes, **FAST))
    assert [_structure(u) for u in meta.units] == [_structure(u) for u in loaded.units]
    assert meta.tensors == loaded.tensors
    assert meta.model == loaded.model  # name, fingerprint, parameter count and bytes
    assert meta.settings["meta"] is True and "meta" not in loaded.settings
    assert "sampled_from" not in meta.settings
    assert meta.settings["whole_model_path"].startswith("not measured")
    for j in range(2):  # the whole model is not measured: it holds the unit sum (docs/profile-format.md)
        assert meta.whole_s(j) == pytest.approx(meta.unit_sum_s(j))
    assert all(t > 0 for u in meta.units for t in u.forward_s)


def test_sample_blocks_measures_one_layer_and_copies_it(tiny_llama):
    profile = profile_model(
        load_workload(tiny_llama, meta=True), MeasureSettings(micro_batch_sizes=(1, 2), sample_blocks=True, **FAST)
    )
    names = [u.name for u in profile.units]
    assert names == ["model.embed_tokens", *(f"model.layers.{i}" for i in range(3)), "model.norm", "lm_head"]
    assert profile.settings["sampled_from"] == {"model.layers.1": "model.layers.0", "model.layers.2": "model.layers.0"}
    first = profile.units[1]
    for copy in profile.units[2:4]:
        assert (copy.forward_s, copy.backward_s, copy.backward_input_s, copy.backward_weight_s) == (
            first.forward_s,
            first.backward_s,
            first.backward_input_s,
            first.backward_weight_s,
        )
        assert _structure(copy)[2:] == _structure(first)[2:]
    # the copies' outputs stood in for theirs: the units after them ran on tensors of the right shape
    loaded = profile_model(load_workload(tiny_llama), MeasureSettings(micro_batch_sizes=(1, 2), **FAST))
    assert [_structure(u) for u in profile.units] == [_structure(u) for u in loaded.units]
    assert profile.tensors == loaded.tensors


def test_materialise_restores_buffers_and_fills_deterministically():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)
            self.register_buffer("table", torch.arange(8.0), persistent=False)

    with parameters_on_meta():
        block = Block()
    buffers = move_to_meta(block, "Block")
    assert all(t.is_meta for t in [*block.parameters(), *block.buffers()])
    assert torch.equal(buffers["table"], torch.arange(8.0))
    materialise(block, buffers, torch.device("cpu"))
    first = block.proj.weight.detach().clone()
    assert torch.equal(block.table, torch.arange(8.0))
    assert torch.equal(block.norm.weight, torch.ones(8)) and torch.equal(block.proj.bias, torch.zeros(8))
    assert torch.isfinite(first).all() and 0.005 < first.std().item() < 0.05
    block.to_empty(device="meta")
    materialise(block, buffers, torch.device("cpu"))
    assert torch.equal(block.proj.weight, first)  # seeded by the parameter's name


_PEAK_SCRIPT = """
import json, sys, torch
from torch import nn
from profiles.measure import peak_rss_bytes
from profiles.measure_settings import MeasureSettings
from profiles.profiler import profile_model
from profiles.workload import Workload, load_workload

WIDTH, UNITS = 2048, 24  # 24 x 16.8 MB of float32 weights: 403 MB

def workload():
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(UNITS)))
    def make_batch(b):
        g = torch.Generator().manual_seed(b)
        return torch.randn(b, WIDTH, generator=g), torch.randn(b, WIDTH, generator=g)
    return Workload(model, make_batch, nn.functional.mse_loss, name="wide")

sys.modules["wide_spec"] = sys.modules[__name__]
w = load_workload("wide_spec:workload", meta=True)
before = peak_rss_bytes()
settings = MeasureSettings(micro_batch_sizes=(1,), repeats=1, max_repeats=1, warmup=0, progress=False, min_time_s=0.0)
profile = profile_model(w, settings)
print(json.dumps({"before": before, "peak": profile.settings["peak_rss_bytes"], "weights": profile.model.param_bytes}))
"""


def test_meta_profile_holds_far_less_than_the_weights():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PEAK_SCRIPT)],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    numbers = json.loads(done.stdout.strip().splitlines()[-1])
    assert numbers["weights"] == 24 * (2048 * 2048 + 2048) * 4
    # One unit's weights, gradients and kept gradients are about 50 MB; a loaded profile would hold
    # 403 MB of weights and as much again of gradients on top of the same starting point.
    grown = numbers["peak"] - numbers["before"]
    assert grown < 0.4 * numbers["weights"], numbers


@pytest.fixture
def specs(tmp_path):
    (tmp_path / "meta_specs.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            from profiles.workload import Workload

            def _batch(b):
                return torch.randn(b, 8), torch.randn(b, 4)

            def uneven():  # no two consecutive units alike
                model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 32), nn.Linear(32, 4))
                return Workload(model, _batch, nn.functional.mse_loss)

            def moved():  # moving a meta model to a device would copy weights that do not exist
                model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)).to("cpu")
                return Workload(model, _batch, nn.functional.mse_loss)
            """
        )
    )
    return tmp_path


def test_sample_blocks_with_nothing_identical_is_refused(capsys, existing, specs):
    argv = ["profile", specs / "meta_specs.py:uneven", "--sample-blocks", "--micro-batch-sizes", "1"]
    assert_fails(capsys, [*argv, "--repeats", "1", "--no-progress", "--out", existing], "no two", existing)


def test_a_spec_that_cannot_be_built_on_meta_is_refused(capsys, existing, specs):
    argv = ["profile", specs / "meta_specs.py:moved", "--meta", "--no-progress", "--out", existing]
    assert_fails(capsys, argv, "on the meta device: calling", existing)


def test_a_model_with_real_weights_is_not_taken_for_a_meta_one():
    model = nn.Linear(4, 4)  # built outside parameters_on_meta(): its weights exist
    with pytest.raises(ModelSpecError, match="parameter weight is on cpu"):
        move_to_meta(model, "spec.py:made_before")


def test_cli_meta_profile_is_written_and_says_so(capsys, tmp_path, tiny_llama):
    out = tmp_path / "tiny.profile.json"
    code = main(
        ["profile", tiny_llama, "--sample-blocks", "--micro-batch-sizes", "1", "--repeats", "1"]
        + ["--max-repeats", "1", "--warmup", "0", "--no-progress", "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "peak resident memory" in captured.err and "2 units copied from 1 measured" in captured.out
    assert "whole model not measured" in captured.out
    data = json.loads(out.read_text())
    assert data["version"] == 1 and data["settings"]["meta"] is True
    assert data["settings"]["peak_rss_bytes"] > 0
