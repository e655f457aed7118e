"""Seeded fuzz of the readers (issue 14): every mutation of a real profile or plan is either refused as one
line with exit 2, or accepted with a valid result; never a traceback, a hang or an inconsistent file accepted."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest

from cli import main
from planner.plan import load_plan
from profiles.device_model import DEVICE_MODELS
from profiles.format import save_profile
from synthetic import make_profile

SEED = int(os.environ.get("PIPEPLAN_FUZZ_SEED", "14"))
MUTATIONS = int(os.environ.get("PIPEPLAN_FUZZ_MUTATIONS", "200"))  # per format: about 8 s for both on 2 cores

_VALUES: list[Any] = [
    0, -1, 1, 2, 99, 2**53 + 1, 10**30, 0.5, -0.0, 1e308, 1e-308, True, None, "", " ", "x", "\ud800",
    [], {}, [1], ["layers.0"], {"a": 1}, "layers.0", "1f1b", "interleaved-1f1b",
]  # fmt: skip


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*path, i))
    return found


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _mutate(data: Any, rng: random.Random) -> str:
    """One structural edit (or a text-level one), returned as the file's new text."""
    path = rng.choice(_paths(data)[1:])
    parent, key = _get(data, path[:-1]), path[-1]
    kind = rng.randrange(7)
    if kind == 0:
        parent[key] = rng.choice(_VALUES)
    elif kind == 1 and isinstance(parent, dict):
        del parent[key]
    elif kind == 1:
        parent.pop(key)
    elif kind == 2 and isinstance(parent, list):
        parent.insert(key, parent[key])  # duplicate an element
    elif kind == 3 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = rng.choice([parent[key] + 1, parent[key] - 1, parent[key] * 1000, -parent[key]])
    elif kind == 4 and isinstance(parent, list) and len(parent) > 1:
        rng.shuffle(parent)
    elif kind == 5 and isinstance(parent, dict):
        parent[f"extra_{rng.randrange(9)}"] = rng.choice(_VALUES)
    else:
        text = json.dumps(data)
        cut = rng.randrange(len(text))
        return rng.choice([text[:cut], text[:cut] + "1e400" + text[cut:], text.replace("1.0", "NaN", 1)])
    return json.dumps(data)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return int(code or 0), capsys.readouterr().err


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    folder = tmp_path_factory.mktemp("fuzz")
    profile = folder / "p.json"
    # With the I/W split measured, so that the mutations reach those fields and the plan's stage I/W.
    save_profile(make_profile([1.0, 2.0, 1.0, 3.0, 1.0, 2.0], sizes=(1, 2), weight_share=0.5), profile)
    plan = folder / "plan.json"
    argv = ["plan", str(profile), "--stages", "2", "--global-batch", "4", "--schedule", "zero-bubble"]
    assert main([*argv, "--out", str(plan)]) == 0
    return json.loads(profile.read_text()), json.loads(plan.read_text())


def _check(code: int, err: str, what: str) -> None:
    assert code in (0, 2), f"{what}: exit {code}: {err}"
    if code == 2:
        assert err.count("\n") == 1 and len(err) <= 301 and "Traceback" not in err, f"{what}: {err}"


def test_mutated_profiles(originals, tmp_path, capsys):
    rng = random.Random(SEED)
    refused = 0
    for i in range(MUTATIONS):
        data = json.loads(json.dumps(originals[0]))
        text = _mutate(data, rng)
        path = tmp_path / f"p{i}.json"
        path.write_text(text)
        out = tmp_path / f"plan{i}.json"
        code, err = _run(capsys, ["plan", str(path), "--stages", "2", "--global-batch", "4", "--out", str(out)])
        _check(code, err, f"mutation {i} ({text[:80]})")
        if code == 0:
            load_plan(out)  # what was accepted made a plan that every reader accepts
        else:
            refused += 1
            assert not out.exists()
    assert refused > MUTATIONS // 3  # the mutations do reach the checks


def test_mutated_plans(originals, tmp_path, capsys):
    rng = random.Random(SEED + 1)
    refused = 0
    for i in range(MUTATIONS):
        data = json.loads(json.dumps(originals[1]))
        text = _mutate(data, rng)
        path = tmp_path / f"plan{i}.json"
        path.write_text(text)
        code, err = _run(capsys, ["show", str(path)])
        _check(code, err, f"show, mutation {i}")
        code2, err2 = _run(capsys, ["simulate", str(path), "--json"])
        _check(code2, err2, f"simulate, mutation {i}")
        assert (code == 0) == (code2 == 0), f"mutation {i}: show {err} / simulate {err2}"
        if code == 0:
            plan = load_plan(path)
            units = [u for s in plan.stages for u in s.units]
            assert len(units) == len(set(units)) and all(u.strip() for u in units)
        else:
            refused += 1
    assert refused > MUTATIONS // 3


def test_mutated_device_models_and_model_configs(tmp_path, capsys):
    # What `profile --device-model` reads: a device-model file and an hf: config. Either refused in one line with
    # exit 2 or modelled into a profile that `plan` reads back (a file's field of the wrong kind, or a shape whose
    # bytes pass the readers' limits, once crashed mid-roofline or wrote a profile that plan refused).
    rng = random.Random(SEED + 2)
    device = DEVICE_MODELS["v100-16gb"].as_dict()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 1024,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    base = tmp_path / "base.json"
    base.write_text(json.dumps(config))
    refused = {"device": 0, "config": 0}
    for i in range(MUTATIONS):
        kind = "device" if i % 2 else "config"
        data = json.loads(json.dumps(device if kind == "device" else config))
        text = _mutate(data, rng)
        path = tmp_path / f"{kind}{i}.json"
        path.write_text(text)
        model, gpu = (f"hf:{path}", "h100-80gb") if kind == "config" else (f"hf:{base}", str(path))
        out = tmp_path / f"profile{i}.json"
        argv = ["profile", model, "--device-model", gpu, "--micro-batch-sizes", "1", "--out", str(out)]
        code, err = _run(capsys, argv)
        _check(code, err, f"{kind} mutation {i} ({text[:80]})")
        if code == 2:
            refused[kind] += 1
            assert not out.exists()
            continue
        plan = ["plan", str(out), "--devices", "4", "--global-batch", "8", "--jobs", "1", "--out", f"{out}.plan"]
        code, err = _run(capsys, plan)
        _check(code, err, f"plan of {kind} mutation {i}")
    assert min(refused.values()) > MUTATIONS // 10  # the mutations do reach the checks
