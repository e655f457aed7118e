"""pipeplan export: each trainer's output checked against that trainer's own format rules, without the trainer.

- Megatron: the layout string is parsed back with Megatron's grammar (re-implemented below from
  megatron/core/transformer/pipeline_parallel_layer_layout.py: commas dropped, ``(..)*n`` then ``x*n`` unrolled,
  ``|`` between stages) and checked as ``validate_layer_layout`` does, plus stage by stage against the plan.
- torchtitan: the flags, split as a shell splits them, cover every unit once, in order, each a name
  ``_split_module`` can keep; the schedule name is one torch's ``get_schedule_class`` accepts.
- DeepSpeed: the snippet runs against a stand-in ``PipelineModule`` whose ``__init__`` calls
  ``_partition_layers`` as DeepSpeed's does; every rank's bounds are the plan's stage.
- accelerate: the snippet runs against a stand-in ``prepare_pippy``; the split points are the plan's.

Plans come from the planner itself (``make_plan`` on profiles with the built-in models' unit names) or, for
the refusals, are written by hand and passed through the plan reader, so every plan is one a user can have.
The same exports fed to the trainers themselves: tests/planner/test_export_trainers.py.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types

import pytest
from export_plans import GPT2_TINY, LLAMA_SMALL, hand_plan, on_mesh, random_case, shell_words

from cli import main
from cli_checks import assert_fails
from planner.errors import ExportError, UsageError
from planner.export import RELEASES, Trainer, apply_renames, export_plan, megatron_layers, rank_of_device
from planner.plan import Plan, save_plan
from planner.request import PlanRequest
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule
from planner.search import make_plan
from synthetic import make_profile

MLP = ["layers.0", "layers.1", "layers.2", "layers.3", "head"]
UNET = ["enc.0", "enc.1", "enc.2", "mid", "dec.0", "dec.1", "dec.2", "head"]


def _planned(names, forward_s, *, ranks=2, schedule=None, batch=8) -> Plan:
    """What ``pipeplan plan`` writes for a profile with these unit names and forward times."""
    profile = make_profile(forward_s, sizes=(1, 2))
    units = tuple(dataclasses.replace(u, name=n) for u, n in zip(profile.units, names, strict=True))
    profile = dataclasses.replace(profile, units=units)
    request = PlanRequest(num_ranks=ranks, global_batch_size=batch, schedule=schedule)
    return make_plan(profile, request, sha256="0" * 64)


# --- Megatron's grammar -----------------------------------------------------------------------------------


def parse_megatron_layout(layout: str) -> list[list[str]]:
    """Megatron's ``parse_str_to_list``: the layer types of each stage."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = [list(stage) for stage in text.split("|")]
    assert all(c in "ELtm" for stage in stages for c in stage), layout
    return stages


def check_megatron(plan: Plan, flags: str) -> None:
    """The flags as Megatron reads them, and the layout as ``validate_layer_layout`` checks it."""
    pp = int(re.search(r"--pipeline-model-parallel-size (\d+)", flags)[1])
    layout = re.search(r'--pipeline-model-parallel-layout "([^"]+)"', flags)[1]
    num_layers = int(re.search(r"--num-layers (\d+)", flags)[1])
    assert "--num-virtual-stages-per-pipeline-rank" not in flags.replace("# ", "#").split("#")[-1]
    stages = parse_megatron_layout(layout)
    assert len(stages) % pp == 0 and len(stages) == plan.num_stages and pp == plan.num_ranks
    vpp = len(stages) // pp
    assert vpp == plan.virtual_stages
    # Megatron's flatten order: vpp-major, then pp rank; stage i is on rank i % pp.
    layout_2d = [[stages[v * pp + r] for v in range(vpp)] for r in range(pp)]
    flat = [layer for v in range(vpp) for r in range(pp) for layer in layout_2d[r][v]]
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == 1 and flat.count("L") == 1
    assert flat.count("t") == num_layers
    roles = megatron_layers([u for s in plan.stages for u in s.units])
    assert num_layers == len(roles.decoder)
    for s, stage in zip(plan.stages, stages, strict=True):
        layers = {u for layer in roles.decoder for u in layer if u in s.units}
        whole = [layer for layer in roles.decoder if layer[0] in layers]
        assert stage.count("t") == len(whole)
        assert ("E" in stage) == (roles.embedding[0] in s.units)
        assert ("L" in stage) == (roles.loss[-1] in s.units)
    assert re.search(r"--micro-batch-size (\d+)", flags)[1] == str(plan.micro_batch_size)
    assert re.search(r"--global-batch-size (\d+)", flags)[1] == str(plan.global_batch_size)


def test_the_grammar_reads_megatrons_own_example() -> None:
    # The documented DeepSeek-V3 PP16 VPP2 layout: 32 stages, E first, 61 decoder layers, MTP, loss last.
    stages = parse_megatron_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32 and stages[0] == ["E", "t", "t", "t"] and stages[-1] == ["L"]
    assert sum(s.count("t") for s in stages) == 61


def test_megatron_layout_of_a_two_stage_gpt2() -> None:
    plan = hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]])
    config = export_plan(plan, "megatron")
    assert config.pipeline_model_parallel_layout == "Et*2|t*2L"
    assert (config.num_layers, config.virtual_stages_per_rank) == (4, 1)
    check_megatron(plan, config.text())


def test_megatron_interleaved_layout_has_pp_times_vpp_stages() -> None:
    plan = hand_plan(
        [LLAMA_SMALL[:2], LLAMA_SMALL[2:4], LLAMA_SMALL[4:7], LLAMA_SMALL[7:]],
        ranks=2,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    config = export_plan(plan, Trainer.MEGATRON)
    assert config.pipeline_model_parallel_layout == "Et|t*2|t*3|t*2L"
    assert config.virtual_stages_per_rank == 2 and config.pipeline_model_parallel_size == 2
    check_megatron(plan, config.text())


def test_megatron_counts_a_layer_profiled_as_several_units_once() -> None:
    units = ["wte", "h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp", "ln_f"]
    plan = hand_plan([units[:3], units[3:]])
    config = export_plan(plan, "megatron")
    assert config.pipeline_model_parallel_layout == "Et|tL" and config.num_layers == 2
    check_megatron(plan, config.text())


@pytest.mark.parametrize("seed", range(12))
def test_planner_plans_export_or_are_refused_for_a_true_reason(seed: int) -> None:
    """Random costs, ranks and schedules: every plan the planner writes either exports to a valid layout, or
    cuts inside Megatron's embedding or head, which the refusal says."""
    names, forward, ranks, schedule = random_case(seed)
    plan = _planned(names, forward, ranks=ranks, schedule=schedule, batch=8 * ranks)
    stage_of = {u: s.index for s in plan.stages for u in s.units}
    roles = megatron_layers(names)
    cut_e = len({stage_of[u] for u in roles.embedding}) > 1
    cut_l = len({stage_of[u] for u in roles.loss}) > 1
    if cut_e or cut_l:
        with pytest.raises(ExportError, match="the embedding" if cut_e else "the final norm and head"):
            export_plan(plan, "megatron")
    else:
        check_megatron(plan, export_plan(plan, "megatron").text())
    check_torchtitan(plan, export_plan(plan, "torchtitan", [("transformer", ""), ("model", "")]).text(), names)


def test_megatron_refuses_a_cut_inside_the_embedding() -> None:
    plan = hand_plan([GPT2_TINY[:1], GPT2_TINY[1:5], GPT2_TINY[5:]])
    with pytest.raises(ExportError, match=r"cuts inside the embedding .* before transformer.wpe .*--pin transformer"):
        export_plan(plan, "megatron")


def test_megatron_refuses_a_cut_between_final_norm_and_head() -> None:
    plan = hand_plan([GPT2_TINY[:7], GPT2_TINY[7:]])
    with pytest.raises(ExportError, match=r"final norm and head .* before lm_head .*--pin transformer.ln_f=1"):
        export_plan(plan, "megatron")


def test_megatron_refuses_a_cut_inside_a_decoder_layer() -> None:
    units = ["wte", "h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp", "ln_f"]
    with pytest.raises(ExportError, match=r"inside decoder layer 0 .* before h.0.mlp"):
        export_plan(hand_plan([units[:2], units[2:]]), "megatron")


@pytest.mark.parametrize(
    ("units", "message"),
    [
        (MLP, "begins with the embedding"),  # layers.0..3 are the blocks; nothing runs before them
        (UNET, "2 block lists of 3 (dec, enc)"),
        (["embed", "layers.0", "pool", "layers.1", "head"], "unit pool runs between decoder layers"),
        (["embed", "layers.0", "layers.1", "norm"], None),
        (["conv", "fc", "head"], "no repeated decoder layers"),
        (["embed", "layers.0", "layers.2", "head"], "follows layer 0"),
        (["embed", "layers.0", "layers.1"], "ends with the loss"),
    ],
)
def test_megatron_refuses_what_is_not_a_decoder_stack(units, message) -> None:
    plan = hand_plan([units[:2], units[2:]])
    if message is None:
        check_megatron(plan, export_plan(plan, "megatron").text())
        return
    with pytest.raises(ExportError, match=re.escape(message)):
        export_plan(plan, "megatron")


def test_megatron_notes_a_schedule_it_does_not_run() -> None:
    plan = hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], schedule=Schedule.GPIPE)
    text = export_plan(plan, "megatron").text()
    assert "Megatron runs 1F1B with this layout, not the plan's gpipe" in text
    check_megatron(plan, text)


# --- torchtitan -------------------------------------------------------------------------------------------


def torchtitan_flags(text: str) -> dict[str, list[str]]:
    """The export's words as torchtitan's parser groups them: each ``--section.key`` with its values; the
    activation-checkpoint subcommand under its own name."""
    flags: dict[str, list[str]] = {}
    key = None
    for word in shell_words(text):
        if word.startswith("--") or word.startswith("activation-checkpoint:"):
            key = word
            flags[key] = []
        else:
            assert key is not None, word
            flags[key].append(word)
    return flags


def check_torchtitan(plan: Plan, text: str, names=None) -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    flags = torchtitan_flags(text)
    assert list(flags)[-1].startswith("activation-checkpoint:")  # tyro takes no --section.key after it
    assert flags["--training.disable_cuda_graphs"] == []  # torchtitan 0.3 refuses a pipeline without it
    parts = [part.split(",") for part in flags["--parallelism.module_fqns_per_model_part"]]
    assert len(parts) == plan.num_stages and flags["--parallelism.pipeline_parallel_degree"] == [str(plan.num_ranks)]
    flat = [name for part in parts for name in part]
    assert len(flat) == len(set(flat)) == sum(len(s.units) for s in plan.stages)  # every module once
    assert [len(part) for part in parts] == [len(s.units) for s in plan.stages]  # in order, stage by stage
    # _split_module keeps top-level modules and items NAME.KEY of top-level containers only.
    assert all(name.count(".") <= 1 for name in flat)
    (schedule,) = flags["--parallelism.pipeline_parallel_schedule"]
    assert get_schedule_class(schedule).__name__ == TORCH_SCHEDULE_CLASS[plan.schedule]
    (local,) = flags["--training.local_batch_size"]
    (micro,) = flags["--parallelism.pipeline_parallel_microbatch_size"]
    assert int(local) // int(micro) == plan.num_microbatches and int(micro) == plan.micro_batch_size
    dp = plan.mesh.dp if plan.mesh is not None else 1
    (replicate,) = flags["--parallelism.data_parallel_replicate_degree"]
    (shard,) = flags["--parallelism.data_parallel_shard_degree"]
    assert int(replicate) * int(shard) == dp
    assert flags["--training.global_batch_size"] == [str(dp * plan.global_batch_size)]
    if names is not None:
        assert [u for part in parts for u in part] == [
            n.removeprefix("transformer.").removeprefix("model.") for n in names
        ]


TORCHTITAN_LLAMA = [("model.embed_tokens", "tok_embeddings"), ("model.layers", "layers"), ("model.norm", "norm")]
"""docs/export.md's renames from transformers' Llama onto torchtitan's (whose head is lm_head in both)."""


def test_torchtitan_parts_of_a_llama_plan_with_torchtitans_names() -> None:
    plan = hand_plan([LLAMA_SMALL[:4], LLAMA_SMALL[4:8], LLAMA_SMALL[8:]], ranks=3)
    config = export_plan(plan, "torchtitan", TORCHTITAN_LLAMA)
    assert config.module_fqns_per_model_part == (
        ("tok_embeddings", "layers.0", "layers.1", "layers.2"),
        ("layers.3", "layers.4", "layers.5", "layers.6"),
        ("layers.7", "norm", "lm_head"),
    )
    assert config.pipeline_parallel_schedule == "1F1B" and config.activation_checkpoint == "none"
    assert "--parallelism.module_fqns_per_model_part tok_embeddings,layers.0,layers.1,layers.2 " in config.text()
    assert "not those of torchtitan's decoders" not in config.text()
    check_torchtitan(plan, config.text())


def test_torchtitan_says_when_names_are_not_its_decoders() -> None:
    plan = hand_plan([LLAMA_SMALL[:4], LLAMA_SMALL[4:]])
    renames = [*TORCHTITAN_LLAMA, ("lm_head", "output")]  # the head's name before torchtitan 0.3
    text = export_plan(plan, "torchtitan", renames).text()
    assert "not those of torchtitan's decoders (tok_embeddings, layers.N, norm, lm_head)" in text
    check_torchtitan(plan, text)


def test_torchtitan_sets_activation_checkpointing_from_the_plan() -> None:
    units = [LLAMA_SMALL[:5], LLAMA_SMALL[5:]]
    for recompute, choice, noted in (((), "none", False), ((0, 1), "full", False), ((1,), "full", True)):
        text = export_plan(hand_plan(units, recompute=recompute), "torchtitan", TORCHTITAN_LLAMA).text()
        assert text.rstrip().endswith(f"activation-checkpoint:{choice}")
        assert ("recomputes activations on stages 1 only" in text) == noted


def test_torchtitan_refuses_names_nested_deeper_than_it_splits() -> None:
    plan = hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]])
    with pytest.raises(ExportError, match=r"stage 0 holds transformer.h.0: map the names .* --rename"):
        export_plan(plan, "torchtitan")


def test_renames_take_the_longest_prefix_on_a_dot_boundary() -> None:
    renames = [("model", ""), ("model.layers", "blocks"), ("lm", "x")]
    assert apply_renames(["model.norm", "model.layers.3", "lm_head"], renames) == ("norm", "blocks.3", "lm_head")
    with pytest.raises(UsageError, match="the same name"):
        apply_renames(["a.x", "b.x"], [("a", ""), ("b", "")])
    with pytest.raises(UsageError, match="without a name"):
        apply_renames(["model"], [("model", "")])


# --- DeepSpeed --------------------------------------------------------------------------------------------


class _Topology:
    """DeepSpeed's PipeDataParallelTopology / ProcessTopology as far as the subclass reads them."""

    def __init__(self, *, axes=("pipe", "data"), dims=None, num_pp=None, num_dp=None) -> None:
        self.axes, self.dims = list(axes), list(dims) if dims is not None else [num_pp, num_dp]

    def get_dim(self, name: str) -> int:
        return self.dims[self.axes.index(name)]

    def get_coord(self, rank: int) -> types.SimpleNamespace:
        inner = self.dims[1]
        return types.SimpleNamespace(**{self.axes[0]: rank // inner, self.axes[1]: rank % inner})


class _PipelineModule:
    """DeepSpeed's PipelineModule.__init__ as far as partitioning goes (deepspeed/runtime/pipe/module.py)."""

    def __init__(self, layers, rank, topology, partition_method="parameters") -> None:
        self._topo = topology
        self.global_rank = rank
        self._layer_specs = list(layers)
        self._local_start, self._local_stop = 0, None
        self._partition_layers(method=partition_method)

    def _set_bounds(self, start=None, stop=None) -> None:
        self._local_start, self._local_stop = start, stop


def _run_snippet(text: str, monkeypatch, module: str, **attributes) -> dict:
    fake = types.ModuleType(module)
    for key, value in attributes.items():
        setattr(fake, key, value)
    monkeypatch.setitem(sys.modules, module, fake)
    namespace: dict = {}
    exec(compile(text, f"<{module} snippet>", "exec"), namespace)
    return namespace


def _deepspeed_snippet(text: str, monkeypatch) -> dict:
    def process_topology(axes, dims):
        return _Topology(axes=axes, dims=dims)

    def pipe_data_parallel_topology(num_pp, num_dp):
        return _Topology(num_pp=num_pp, num_dp=num_dp)

    fakes = {
        "deepspeed.runtime.pipe.topology": {
            "ProcessTopology": process_topology,
            "PipeDataParallelTopology": pipe_data_parallel_topology,
        },
        "deepspeed.pipe": {"PipelineModule": _PipelineModule},
    }
    for module, attributes in fakes.items():
        fake = types.ModuleType(module)
        for key, value in attributes.items():
            setattr(fake, key, value)
        monkeypatch.setitem(sys.modules, module, fake)
    namespace: dict = {}
    exec(compile(text, "<deepspeed snippet>", "exec"), namespace)
    return namespace


def test_deepspeed_subclass_bounds_each_rank_to_the_plans_stage(monkeypatch) -> None:
    plan = _planned(GPT2_TINY, [0.1, 0.05, 1, 1.5, 1, 1, 0.05, 2], ranks=3, schedule=Schedule.ONE_F_ONE_B)
    config = export_plan(plan, "deepspeed")
    ns = _deepspeed_snippet(config.text(), monkeypatch)
    assert ns["PLAN_UNITS"] == GPT2_TINY and config.parts[-1] == len(GPT2_TINY)
    assert ns["PLAN_DS_CONFIG"] == {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": 0},
    }
    start = 0
    for s in plan.stages:
        module = ns["PlannedPipelineModule"](layers=GPT2_TINY, rank=s.index, topology=ns["PLAN_TOPOLOGY"])
        assert module.parts == list(config.parts)
        assert GPT2_TINY[module._local_start : module._local_stop] == list(s.units)
        assert module._local_start == start
        start = module._local_stop
    with pytest.raises(ValueError, match="the plan cuts 8 layers into 3 stages"):
        ns["PlannedPipelineModule"](layers=GPT2_TINY[:-1], rank=0, topology=ns["PLAN_TOPOLOGY"])


@pytest.mark.parametrize(("placement", "shard"), [("pipeline-in-node", "optimizer"), ("replicas-in-node", "none")])
def test_deepspeed_batch_and_topology_of_a_cluster_plan(monkeypatch, placement: str, shard: str) -> None:
    plan = on_mesh(
        hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], micro_batch_size=2, num_microbatches=4),
        2,
        placement=placement,
        shard=shard,
    )
    ns = _deepspeed_snippet(export_plan(plan, "deepspeed").text(), monkeypatch)
    ds = ns["PLAN_DS_CONFIG"]
    # DeepSpeed's pipeline engine asserts train_batch_size == micro-batch x steps x data-parallel size.
    assert ds["train_batch_size"] == 2 * 4 * 2 == plan.mesh.global_batch_size
    assert ds["zero_optimization"] == {"stage": 1 if shard == "optimizer" else 0}
    topology = ns["PLAN_TOPOLOGY"]
    for device in range(4):
        replica, stage_rank = plan.mesh.coordinates(device)
        coord = topology.get_coord(device)
        assert (coord.pipe, coord.data) == (stage_rank, replica)


def test_deepspeed_refuses_zero_beyond_stage_1() -> None:
    plan = on_mesh(hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]]), 2, shard="full")
    with pytest.raises(ExportError, match=r"ZeRO stage 1 at most .*\(--shard full\)"):
        export_plan(plan, "deepspeed")


def test_deepspeed_and_accelerate_refuse_interleaved_stages() -> None:
    plan = hand_plan(
        [LLAMA_SMALL[:3], LLAMA_SMALL[3:6], LLAMA_SMALL[6:8], LLAMA_SMALL[8:]],
        ranks=2,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    for trainer in ("deepspeed", "accelerate"):
        with pytest.raises(ExportError, match="one stage per rank .* 4 stages on 2 ranks"):
            export_plan(plan, trainer)


# --- accelerate -------------------------------------------------------------------------------------------


def test_accelerate_splits_before_the_plans_split_points(monkeypatch) -> None:
    plan = _planned(LLAMA_SMALL, [0.2] + [1.0] * 8 + [0.1, 1.5], ranks=4, schedule=Schedule.GPIPE, batch=16)
    calls = []

    def prepare_pippy(model, split_points="auto", example_args=(), num_chunks=None, **_):
        calls.append((split_points, num_chunks))
        return model

    fake = types.ModuleType("accelerate")
    fake.prepare_pippy = prepare_pippy
    monkeypatch.setitem(sys.modules, "accelerate", fake)
    text = export_plan(plan, "accelerate").text()
    exec(compile(f"model = object()\nexample_input = 0\n{text}", "<accelerate snippet>", "exec"), {})
    assert calls == [(list(plan.split_points), plan.num_microbatches)]
    assert "torchrun --nproc-per-node 4" in text and "inference only" in text


def test_accelerate_says_its_micro_batch_is_1() -> None:
    plan = on_mesh(hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], micro_batch_size=2, num_microbatches=4), 2)
    config = export_plan(plan, "accelerate")
    assert config.num_chunks == 4 and config.num_processes == 2
    text = config.text()
    assert "the plan's micro-batch of 2 does not carry over: a call takes 1 x 4 samples, not 2 x 4" in text
    assert "the plan's 2 replicas are 2 launches of 2 processes" in text


# --- all trainers, and the command ------------------------------------------------------------------------


def test_naive_schedule_is_not_exported() -> None:
    plan = hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], schedule=Schedule.NAIVE)
    for trainer in Trainer:
        with pytest.raises(ExportError, match="naive"):
            export_plan(plan, trainer)


def test_recomputation_is_noted_not_dropped() -> None:
    plan = hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], recompute=(0,))
    for trainer in (Trainer.TORCHTITAN, Trainer.MEGATRON, Trainer.DEEPSPEED):  # accelerate: inference, no backward
        renames = [("transformer", "")] if trainer is Trainer.TORCHTITAN else []
        assert "recomputes activations on stages 0 only" in export_plan(plan, trainer, renames).text()


def test_cli_prints_to_stdout_and_writes_atomically(tmp_path, capsys) -> None:
    plan_file = tmp_path / "p.plan.json"
    save_plan(hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]]), plan_file)
    assert main(["export", str(plan_file), "--to", "megatron"]) == 0
    printed = capsys.readouterr().out
    assert '--pipeline-model-parallel-layout "Et*2|t*2L"' in printed
    assert "# for megatron-core 0.19.2 (this export is for 0.16.x to 0.19.x" in printed
    out = tmp_path / "pp.flags"
    argv = ["export", str(plan_file), "--to", "torchtitan", "--rename", "transformer=", "--out", str(out)]
    assert main([*argv, "--trainer-version", "0.3.1"]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    text = out.read_text()
    assert "# for torchtitan 0.3.1 (this export is for 0.3.x" in text
    assert torchtitan_flags(text)["--parallelism.module_fqns_per_model_part"][0].split(",")[:3] == ["wte", "wpe", "h.0"]


def test_cli_refusals_are_one_line(tmp_path, capsys, existing) -> None:
    plan_file = tmp_path / "p.plan.json"
    save_plan(hand_plan([GPT2_TINY[:1], GPT2_TINY[1:]]), plan_file)
    assert_fails(
        capsys, ["export", plan_file, "--to", "megatron", "--out", existing], "cuts inside the embedding", existing
    )
    assert_fails(capsys, ["export", plan_file, "--to", "torchtitan"], "torchtitan splits only top-level")
    assert_fails(capsys, ["export", plan_file, "--to", "megatron", "--rename", "a=b"], "no effect on Megatron")
    assert_fails(capsys, ["export", plan_file, "--to", "torchtitan", "--rename", "=x"], "is not OLD=NEW")
    assert_fails(capsys, ["export", plan_file, "--to", "nemo"], "invalid choice")
    assert_fails(capsys, ["export", plan_file, "--to", "megatron", "--out", plan_file], "is this command's input")
    assert_fails(
        capsys, ["export", plan_file, "--to", "torchtitan", "--trainer-version", "0.2.2"], "read a TOML job config"
    )


# --- releases and rank order ------------------------------------------------------------------------------


def test_each_export_names_and_checks_its_trainer_release() -> None:
    plan = hand_plan([LLAMA_SMALL[:5], LLAMA_SMALL[5:]])
    for trainer, release in RELEASES.items():
        renames = TORCHTITAN_LLAMA if trainer is Trainer.TORCHTITAN else []
        config = export_plan(plan, trainer, renames)
        assert config.trainer_version == release.current
        assert f"# for {release.package} {release.current} (this export is for {release.series_text}" in config.text()
    assert export_plan(plan, "megatron", trainer_version="0.16.1").trainer_version == "0.16.1"
    assert export_plan(plan, "accelerate", trainer_version="v1.2").trainer_version == "1.2"
    assert export_plan(plan, "deepspeed", trainer_version="0.19.9rc1").trainer_version == "0.19.9rc1"
    for trainer, version, message in [
        ("torchtitan", "0.2.2", "torchtitan 0.2.2 is not a release this export is for (0.3.x; run against 0.3.0)"),
        ("megatron", "0.15.0", "megatron-core 0.15.0 is not a release this export is for (0.16.x to 0.19.x"),
        ("megatron", "0.2", "megatron-core 0.2 is not"),
        ("deepspeed", "0.18.9", "_partition_layers, a private method"),
        ("accelerate", "2.0.0", "accelerate 2.0.0 is not"),
        ("deepspeed", "latest", "--trainer-version 'latest' is not a version"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            export_plan(plan, trainer, TORCHTITAN_LLAMA if trainer == "torchtitan" else [], trainer_version=version)


def _shell_arithmetic(expression: str, rank: int) -> int:
    """``$(( ... ))`` of non-negative integers, as bash computes it."""
    body = re.fullmatch(r"\$\(\((.*)\)\)", expression)[1]
    return eval(body.replace("RANK", str(rank)).replace("/", "//"))  # digits, RANK and + * / % ( ) only


@pytest.mark.parametrize(("pp", "dp"), [(2, 2), (4, 2), (2, 3)])
def test_pipeline_in_node_plans_tell_each_trainer_how_to_place_ranks(pp: int, dp: int) -> None:
    bounds = [0, *range(3, 3 + 2 * (pp - 1), 2), len(LLAMA_SMALL)]
    names = [LLAMA_SMALL[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    inner = on_mesh(hand_plan(names, num_microbatches=2 * pp), dp)
    outer = on_mesh(hand_plan(names, num_microbatches=2 * pp), dp, placement="replicas-in-node")
    ranks = rank_of_device(inner)
    # torchtitan, DeepSpeed and Megatron run replica r's pipeline rank s on rank s x dp + r.
    for device, rank in enumerate(ranks):
        replica, stage_rank = inner.mesh.coordinates(device)
        assert rank == stage_rank * dp + replica
    assert rank_of_device(outer) == () and rank_of_device(hand_plan(names)) == ()
    text = export_plan(inner, "torchtitan", TORCHTITAN_LLAMA).text()
    expression = re.search(r"export RANK=(\$\(\(.*?\)\));", text)[1]
    assert [_shell_arithmetic(expression, device) for device in range(pp * dp)] == list(ranks)
    assert "export RANK" not in export_plan(outer, "torchtitan", TORCHTITAN_LLAMA).text()
    assert export_plan(inner, "megatron").flags()[-1] == "--use-tp-pp-dp-mapping"
    assert "--use-tp-pp-dp-mapping" not in export_plan(outer, "megatron").flags()
    assert export_plan(inner, "deepspeed").topology() == f'ProcessTopology(axes=["data", "pipe"], dims=[{dp}, {pp}])'
    assert export_plan(outer, "deepspeed").topology() == f"PipeDataParallelTopology(num_pp={pp}, num_dp={dp})"


def test_megatron_takes_a_cluster_plans_batch_and_sharding() -> None:
    plan = on_mesh(
        hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], micro_batch_size=2, num_microbatches=4),
        2,
        placement="replicas-in-node",
        shard="optimizer",
    )
    flags = export_plan(plan, "megatron").flags()
    assert "--global-batch-size 16" in flags and "--micro-batch-size 2" in flags
    assert flags[-1] == "--use-distributed-optimizer"


def test_megatron_refuses_interleaved_micro_batches_it_cannot_group() -> None:
    units = [LLAMA_SMALL[:2], *([u] for u in LLAMA_SMALL[2:8]), LLAMA_SMALL[8:]]
    assert len(units) == 8
    for m in (4, 8, 12):  # groups of pp = 4
        plan = hand_plan(units, ranks=4, schedule=Schedule.INTERLEAVED_1F1B, num_microbatches=m)
        assert export_plan(plan, "megatron").virtual_stages_per_rank == 2
    plan = hand_plan(units, ranks=4, schedule=Schedule.INTERLEAVED_1F1B, num_microbatches=6)
    with pytest.raises(ExportError, match="groups of pp .* 6 micro-batches on pp 4"):
        export_plan(plan, "megatron")


def test_megatron_says_pp_2_interleaved_needs_p2p_overlap() -> None:
    units = [LLAMA_SMALL[:3], LLAMA_SMALL[3:6], LLAMA_SMALL[6:8], LLAMA_SMALL[8:]]
    text = export_plan(hand_plan(units, ranks=2, schedule=Schedule.INTERLEAVED_1F1B), "megatron").text()
    assert "no --no-overlap-p2p-communication" in text


def test_docstring_examples() -> None:
    import doctest

    import planner.export

    assert doctest.testmod(planner.export).failed == 0


# --- tensor parallelism -------------------------------------------------------------------------------------


def test_megatron_and_torchtitan_carry_the_tensor_parallel_degree() -> None:
    halves = [LLAMA_SMALL[:5], LLAMA_SMALL[5:]]
    plan = on_mesh(hand_plan(halves), 2, tp=4)
    megatron = export_plan(plan, "megatron")
    assert megatron.flags()[:3] == (
        "--tensor-model-parallel-size 4",
        "--sequence-parallel",
        "--pipeline-model-parallel-size 2",
    )
    assert "pp 2 x tp 4 x dp 2 = 16 processes" in megatron.text()
    titan = export_plan(plan, "torchtitan", TORCHTITAN_LLAMA)
    assert titan.flags()[0] == "--parallelism.tensor_parallel_degree 4"
    assert "--parallelism.no_enable_sequence_parallel" not in titan.flags()
    plain = on_mesh(hand_plan(halves), 1, tp=2, sequence_parallel=False)
    assert "--sequence-parallel" not in export_plan(plain, "megatron").flags()
    assert export_plan(plain, "torchtitan", TORCHTITAN_LLAMA).flags()[:2] == (
        "--parallelism.tensor_parallel_degree 2",
        "--parallelism.no_enable_sequence_parallel",
    )
    # Without tensor parallelism the flags are as they were.
    assert not any("tensor" in f for f in export_plan(on_mesh(hand_plan(halves), 2), "megatron").flags())


def test_a_plan_in_the_runtimes_tensor_parallel_layout_exports_without_sequence_parallelism() -> None:
    """pipeplan's runtime layout (the default of plan --tensor-parallel): no sequence parallelism to carry, and a
    note that the trainer splits the embedding and head by vocabulary, which the plan's memory kept whole."""
    halves = [LLAMA_SMALL[:5], LLAMA_SMALL[5:]]
    blocks = on_mesh(hand_plan(halves), 1, tp=2, sequence_parallel=False, vocab_parallel=False)
    megatron = export_plan(blocks, "megatron")
    assert megatron.flags()[0] == "--tensor-model-parallel-size 2" and "--sequence-parallel" not in megatron.flags()
    titan = export_plan(blocks, "torchtitan", TORCHTITAN_LLAMA)
    assert "--parallelism.no_enable_sequence_parallel" in titan.flags()
    for config in (megatron, titan):
        assert "embedding and head whole on every device" in config.text()
        assert "plan with --tp-layout megatron" in config.text()
    assert "embedding and head whole" not in export_plan(on_mesh(hand_plan(halves), 1, tp=2), "megatron").text()


@pytest.mark.parametrize("trainer", ["deepspeed", "accelerate"])
def test_trainers_without_tensor_parallelism_refuse_it(tmp_path, capsys, trainer: str) -> None:
    plan = on_mesh(hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]]), 1, tp=2)
    with pytest.raises(ExportError, match=rf"{trainer} cannot run the plan's tensor parallelism \(tp 2\)"):
        export_plan(plan, trainer)
    plan_file = tmp_path / "p.plan.json"
    save_plan(plan, plan_file)
    assert_fails(capsys, ["export", plan_file, "--to", trainer], "plan with --tensor-parallel 1")


@pytest.mark.parametrize("placement", ["pipeline-in-node", "replicas-in-node"])
def test_rank_order_keeps_tensor_parallel_groups_innermost(placement: str) -> None:
    pp, dp, tp = 2, 2, 2
    plan = on_mesh(hand_plan([LLAMA_SMALL[:5], LLAMA_SMALL[5:]]), dp, placement=placement, tp=tp)
    ranks = rank_of_device(plan)
    if placement == "replicas-in-node":
        assert ranks == ()  # the trainers' own order: rank = (s x dp + r) x tp + member
        return
    for device, rank in enumerate(ranks):
        replica, stage_rank = plan.mesh.coordinates(device)
        assert rank == (stage_rank * dp + replica) * tp + plan.mesh.tp_rank(device)
    assert ranks == (0, 1, 4, 5, 2, 3, 6, 7)
    text = export_plan(plan, "torchtitan", TORCHTITAN_LLAMA).text()
    expression = re.search(r"export RANK=(\$\(\(.*?\)\));", text)[1]
    assert [_shell_arithmetic(expression, device) for device in range(pp * dp * tp)] == list(ranks)
    assert export_plan(plan, "megatron").flags()[-1] == "--use-tp-pp-dp-mapping"
