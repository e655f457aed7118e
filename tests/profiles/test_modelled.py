"""The device-model profile (profiles/modelled.py): its FLOPs and saved bytes are the published formulas, its
times behave as a GPU's, and the device files and CLI read as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import sharded_for
from planner.errors import UsageError
from planner.mesh_layouts import Cluster
from planner.planning import cluster_devices
from planner.request import MODELLED_LABEL, ClusterOptions, calibration_settings
from profiles.device_model import DEVICE_MODELS, device_model
from profiles.format import load_profile
from profiles.modelled import TransformerShape, model_flops, modelled_profile, shape_from_hf_config

ROOT = Path(__file__).resolve().parents[2]
GPT = TransformerShape("gpt-test", "gpt", 4, 1024, 16, 16, 4096, 51200, 2048, True)
LLAMA = TransformerShape("llama-test", "llama", 4, 2048, 16, 4, 5632, 32000, 4096, False)
A100 = DEVICE_MODELS["a100-80gb"]


def test_model_flops_are_megatrons_formula() -> None:
    # Narayanan et al. (SC 2021), eq. 3 without recomputation: 72 B s l h^2 (1 + s / 6h + V / 12 l h), per sample.
    s, layers, h, v = GPT.seq_len, GPT.layers, GPT.hidden, GPT.vocab
    expected = 72 * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    assert model_flops(GPT) == pytest.approx(expected, rel=1e-12)
    assert model_flops(GPT, micro_batch=4) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("flash", "recompute", "attention_terms"), [(False, "none", 5), (True, "none", 0), (False, "selective", 0)]
)
def test_gpt_block_saves_korthikantis_bytes(flash: bool, recompute: str, attention_terms: int) -> None:
    # Korthikanti et al. (MLSys 2023), Sec. 4.1: 34 s b h + 5 a s^2 b bytes a block; flash attention and
    # selective recomputation keep none of the 5 a s^2 b (flash adds the fp32 log-sum-exp of each row).
    b, s, h, a = 2, GPT.seq_len, GPT.hidden, GPT.heads
    profile = modelled_profile(GPT, A100, (b,), flash_attention=flash, recompute=recompute)
    block = profile.units[2]
    assert block.name == "transformer.h.0"
    lse = 4 * b * a * s if flash else 0
    assert block.saved_bytes[0] == 34 * s * b * h + attention_terms * a * s * s * b + lse


def test_selective_recomputation_adds_the_attention_core_to_the_backward() -> None:
    # On GPT-3 175B the core is a few per cent of a layer's step (Korthikanti et al., Table 4: 2.7 % overhead).
    gpt3 = TransformerShape("gpt3", "gpt", 2, 12288, 96, 96, 49152, 51200, 2048, True)
    plain = modelled_profile(gpt3, A100, (1,), flash_attention=False)
    selective = modelled_profile(gpt3, A100, (1,), flash_attention=False, recompute="selective")
    block, again = plain.units[2], selective.units[2]
    assert again.forward_s == block.forward_s and again.backward_weight_s == block.backward_weight_s
    extra = again.backward_s[0] - block.backward_s[0]
    assert 0.01 < extra / (block.forward_s[0] + block.backward_s[0]) < 0.07


def test_times_fall_per_sample_with_the_micro_batch_and_backward_is_twice_forward() -> None:
    profile = modelled_profile(LLAMA, DEVICE_MODELS["h100-80gb"], (1, 2, 4, 8))
    block = profile.units[1]
    per_sample = [t / b for t, b in zip(block.forward_s, profile.micro_batch_sizes, strict=True)]
    assert per_sample == sorted(per_sample, reverse=True) and per_sample[0] > per_sample[-1]
    for f, i, w in zip(block.forward_s, block.backward_input_s or (), block.backward_weight_s or (), strict=True):
        assert 1.8 < (i + w) / f < 2.6
        assert w < i  # I carries the attention core's and the element-wise kernels' backward
    assert profile.whole_s(0) == pytest.approx(profile.unit_sum_s(0))


def test_a_faster_gpu_is_faster_and_fp8_speeds_up_products_only() -> None:
    a100 = modelled_profile(LLAMA, A100, (2,)).whole_s(0)
    h100 = modelled_profile(LLAMA, DEVICE_MODELS["h100-80gb"], (2,))
    fp8 = modelled_profile(LLAMA, DEVICE_MODELS["h100-80gb"], (2,), precision="fp8")
    assert h100.whole_s(0) < a100 / 2
    assert h100.whole_s(0) / 2 < fp8.whole_s(0) < h100.whole_s(0)
    with pytest.raises(UsageError, match="no fp8"):
        modelled_profile(LLAMA, A100, (2,), precision="fp8")


def test_shapes_from_transformers_configs() -> None:
    config = json.loads((ROOT / "examples" / "llama-3-70b.json").read_text())
    shape = shape_from_hf_config(config, "llama-3-70b")
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.ffn_hidden, shape.seq_len) == (80, 8192, 8, 28672, 8192)
    gpt2 = shape_from_hf_config(
        {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
        "gpt2",
    )
    assert (gpt2.arch, gpt2.ffn_hidden, gpt2.tied_embeddings) == ("gpt", 3072, True)
    # GPT-2 small has 124.4 M parameters with its 1,024 learned positions.
    assert modelled_profile(gpt2, A100, (1,)).model.param_count == 124_439_808
    with pytest.raises(UsageError, match="model_type 't5'"):
        shape_from_hf_config({"model_type": "t5"}, "t5")


def test_device_files_read_and_refuse(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(replace(A100, name="mine", memory_bytes=2**30).as_dict()))
    assert device_model(str(path)) == replace(A100, name="mine", memory_bytes=2**30)
    # A file without nvlink_efficiency takes its NVLink at the datasheet rate.
    path.write_text(json.dumps({k: v for k, v in A100.as_dict().items() if k != "nvlink_efficiency"}))
    assert A100.nvlink_efficiency == 0.8 and device_model(str(path)).intra_node_ring_bytes_per_s == 300e9
    path.write_text(json.dumps({**A100.as_dict(), "clock_hz": 1}))
    with pytest.raises(UsageError, match="unknown field 'clock_hz'"):
        device_model(str(path))
    with pytest.raises(UsageError, match="unknown device model 'tpu'"):
        device_model("tpu")
    # A field of the wrong kind is refused where it is read, in one line (not met mid-roofline as a TypeError).
    for field, value, why in [
        ("memory_bytes", "80GB", "memory_bytes must be a number, got '80GB'"),
        ("kernel_s", None, "kernel_s must be a number, got None"),
        ("devices_per_node", 7.5, "devices_per_node must be a whole number, got 7.5"),
        ("flash_attention", 1, "flash_attention is true or false"),
        ("name", ["a"], "a device model's name is a string"),
        ("nvlink_efficiency", 1.5, "nvlink_efficiency is a fraction in"),
    ]:
        path.write_text(json.dumps({**A100.as_dict(), field: value}))
        with pytest.raises(UsageError, match=why):
            device_model(str(path))


def test_a_shape_is_refused_where_pipeplan_could_not_read_its_profile_back() -> None:
    # Layers beyond the units a plan holds, or numbers whose bytes pass the readers' 2**53: refused before writing.
    with pytest.raises(UsageError, match="3,000 layers make more units than pipeplan plans"):
        replace(LLAMA, layers=3000)
    with pytest.raises(UsageError, match="beyond what pipeplan reads: .*param_bytes is"):
        modelled_profile(replace(LLAMA, vocab=10**15), A100, (1,))
    config = {"model_type": "llama", "num_attention_heads": 16, "num_hidden_layers": "32", "hidden_size": 2048}
    with pytest.raises(UsageError, match="num_hidden_layers must be a whole number, got '32'"):
        shape_from_hf_config(config, "m")


def test_a_v100_node_rings_a_group_over_the_links_its_members_share(tmp_path: Path) -> None:
    # DGX-1's hybrid cube-mesh has no switch: a tensor-parallel pair rings over one of a GPU's six NVLinks, four GPUs
    # over four, eight over all six; a switched node gives every group all of it.
    v100 = DEVICE_MODELS["v100-16gb"]
    path = tmp_path / "v100.json"
    path.write_text(json.dumps(v100.as_dict()))  # the shares as JSON lists, read back as the built-in's
    assert device_model(str(path)) == v100
    with pytest.raises(UsageError, match="group_link_shares"):
        replace(v100, group_link_shares=((2, 1.5),))
    for bad in (5, [[2]], [["a", 0.5]], [[2, "x"]], [[2.5, 0.5]]):  # a file's wrong shapes: one line, no traceback
        path.write_text(json.dumps({**v100.as_dict(), "group_link_shares": bad}))
        with pytest.raises(UsageError, match="group_link_shares are"):
            device_model(str(path))
    profile = modelled_profile(GPT, v100, (1,))
    cube = cluster_devices(profile, ClusterOptions(devices=16), None)
    # Each NVLink2 at NCCL's 20 of its 25 GB/s.
    assert [cube.group_bytes_per_s(g) for g in (2, 4, 8)] == pytest.approx([20e9, 80e9, 120e9])
    given = cluster_devices(profile, ClusterOptions(devices=16, intra_node_bytes_per_s=100e9), None)
    assert given.group_bytes_per_s(2) == 100e9  # links given on the command line are the whole node's, as given
    switched = replace(cube, group_link_shares=())
    assert switched.group_bytes_per_s(2) == pytest.approx(120e9)

    # The device model a profile carries is read as a device file is: a field of the wrong kind is one line.
    settings = {**profile.settings, "modelled": {**profile.settings["modelled"]}}
    settings["modelled"]["device_model"] = {**v100.as_dict(), "nvlink_efficiency": "x"}
    with pytest.raises(UsageError, match="nvlink_efficiency must be a number, got 'x'"):
        cluster_devices(replace(profile, settings=settings), ClusterOptions(devices=16), None)

    def tensor_parallel_s(cluster: Cluster) -> float:
        sharded = sharded_for(profile, cluster, 2, sequence_parallel=True, vocab_parallel=True)
        return sum(u.forward_s[0] + u.backward_s[0] for u in sharded.units)

    assert tensor_parallel_s(cube) > tensor_parallel_s(switched)


def test_the_cli_models_a_profile_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    script = (
        "import sys, cli; code = cli.main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    args = [
        "profile",
        "hf:examples/llama-3-70b.json",
        "--device-model",
        "h100-80gb",
        "--micro-batch-sizes",
        "1,2",
        "--out",
        str(out),
    ]
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    profile = load_profile(out)
    assert profile.device.name == "h100-80gb (modelled)" and len(profile.units) == 83
    bad = subprocess.run(
        [sys.executable, "-c", script, *args[:3], "h1000", *args[4:]], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown device model 'h1000'" in bad.stderr


def test_the_optimizer_step_moves_its_bytes_at_the_devices_bandwidth() -> None:
    # A modelled profile carries its device's runtime terms, which `plan` takes by default: an Adam step over N
    # parameters is 30 N bytes through HBM, so a GPU of twice the bandwidth steps twice as fast.
    slow = modelled_profile(GPT, A100, (1,))
    fast = modelled_profile(GPT, replace(A100, memory_bytes_per_s=2 * A100.memory_bytes_per_s), (1,))
    costs = [calibration_settings("auto", "cuda", p) for p in (slow, fast)]
    assert costs[0]["calibration_label"] == MODELLED_LABEL
    step = [c["calibration"].optimizer_s("adam", 10**9, 100) for c in costs]  # type: ignore[union-attr]
    per_step = 10 * A100.kernel_s
    assert step[0] - per_step == pytest.approx(30e9 / (A100.memory_bytes_per_s * A100.memory_efficiency))
    assert (step[0] - per_step) == pytest.approx(2 * (step[1] - per_step))


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_transformer_engine_layers_keep_less(precision: str) -> None:
    # A llama block keeps its norms' inputs and outputs, q, k, v, the core's output and SwiGLU's four s b f
    # tensors in 16 bits; Transformer Engine's fused SwiGLU keeps its input only (three), and in fp8 its products
    # keep their inputs (both norms' outputs, the core's output, the MLP's last input) in one byte.
    h100 = DEVICE_MODELS["h100-80gb"]
    b, s, h, f = 1, LLAMA.seq_len, LLAMA.hidden, LLAMA.ffn_hidden
    kv = LLAMA.kv_heads * LLAMA.head_dim
    torch_layers = modelled_profile(LLAMA, h100, (b,), precision=precision).units[1]
    te_layers = modelled_profile(LLAMA, h100, (b,), precision=precision, transformer_engine=True).units[1]
    assert torch_layers.name == te_layers.name == "model.layers.0"
    lse = 4 * b * LLAMA.heads * s
    assert torch_layers.saved_bytes[0] == 2 * s * b * (6 * h + 2 * kv + 4 * f) + lse
    fp8 = s * b * (3 * h + f) if precision == "fp8" else 0
    assert te_layers.saved_bytes[0] == 2 * s * b * (6 * h + 2 * kv + 3 * f) - fp8 + lse
    assert te_layers.forward_s == torch_layers.forward_s
