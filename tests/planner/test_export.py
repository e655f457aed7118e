"""pipeplan export: each trainer's output checked against that trainer's own format rules.

- Megatron: the layout string is parsed back with Megatron's grammar (re-implemented below from
  megatron/core/transformer/pipeline_parallel_layer_layout.py: commas dropped, ``(..)*n`` then ``x*n`` unrolled,
  ``|`` between stages) and checked as ``validate_layer_layout`` does, plus stage by stage against the plan.
- torchtitan: the TOML is read with tomllib; the parts cover every unit once, in order, each a name
  ``pipeline_module_split`` can keep; the schedule name is one torch's ``get_schedule_class`` accepts.
- DeepSpeed: the snippet runs against a stand-in ``PipelineModule`` whose ``__init__`` calls
  ``_partition_layers`` as DeepSpeed's does; every rank's bounds are the plan's stage.
- accelerate: the snippet runs against a stand-in ``prepare_pippy``; the split points are the plan's.

Plans come from the planner itself (``make_plan`` on profiles with the built-in models' unit names) or, for
the refusals, are written by hand and passed through the plan reader, so every plan is one a user can have.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import sys
import types

import pytest

from cli import main
from cli_checks import assert_fails
from planner.cost import MemoryBreakdown
from planner.errors import ExportError, UsageError
from planner.export import Trainer, apply_renames, export_plan, megatron_layers
from planner.plan import Plan, SolverInfo, StagePlan, plan_from_dict, save_plan
from planner.prediction import Prediction
from planner.request import PlanRequest
from planner.schedule.orders import Schedule, stage_to_rank
from planner.search import make_plan
from synthetic import make_profile

tomllib = pytest.importorskip("tomllib")  # the standard library's TOML reader, Python 3.11+

# The units the built-in models are profiled as (README, "The model-spec protocol";
# tests/profiles/models/test_builtin_models.py).
GPT2_TINY = [
    "transformer.wte",
    "transformer.wpe",
    *(f"transformer.h.{i}" for i in range(4)),
    "transformer.ln_f",
    "lm_head",
]
LLAMA_SMALL = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(8)), "model.norm", "lm_head"]
MLP = ["layers.0", "layers.1", "layers.2", "layers.3", "head"]
UNET = ["enc.0", "enc.1", "enc.2", "mid", "dec.0", "dec.1", "dec.2", "head"]


def _planned(names, forward_s, *, ranks=2, schedule=None, batch=8) -> Plan:
    """What ``pipeplan plan`` writes for a profile with these unit names and forward times."""
    profile = make_profile(forward_s, sizes=(1, 2))
    units = tuple(dataclasses.replace(u, name=n) for u, n in zip(profile.units, names, strict=True))
    profile = dataclasses.replace(profile, units=units)
    request = PlanRequest(num_ranks=ranks, global_batch_size=batch, schedule=schedule)
    return make_plan(profile, request, sha256="0" * 64)


def _hand_plan(stages, *, ranks=None, schedule=Schedule.ONE_F_ONE_B, recompute=()) -> Plan:
    """A plan cutting the units as ``stages`` lists them, through the reader (so it is a valid plan)."""
    n = len(stages)
    ranks = ranks or n
    memory = MemoryBreakdown(params=0, grads=0, optimizer=0, activations=0, transient=0, peak=0)
    placement = stage_to_rank(schedule, n, ranks)
    plan = Plan(
        model_name="hand",
        model_fingerprint="ab" * 32,
        profile_sha256="0" * 64,
        num_stages=n,
        num_ranks=ranks,
        schedule=schedule,
        virtual_stages=n // ranks,
        micro_batch_size=1,
        num_microbatches=8,
        global_batch_size=8,
        stages=tuple(
            StagePlan(s, placement[s], tuple(units), s in recompute, 1e-3, 2e-3, 0, 1, memory)
            for s, units in enumerate(stages)
        ),
        split_points=tuple(units[0] for units in stages[1:]),
        predicted=Prediction(
            iteration_s=1.0, formula_iteration_s=1.0, bubble_fraction=0.0, samples_per_s=8.0, bottleneck_stage=0
        ),
        solver=SolverInfo(name="hand", objective="none", optimal=False),
    )
    return plan_from_dict(json.loads(json.dumps(plan.to_dict())))


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
    plan = _hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]])
    config = export_plan(plan, "megatron")
    assert config.pipeline_model_parallel_layout == "Et*2|t*2L"
    assert (config.num_layers, config.virtual_stages_per_rank) == (4, 1)
    check_megatron(plan, config.text())


def test_megatron_interleaved_layout_has_pp_times_vpp_stages() -> None:
    plan = _hand_plan(
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
    plan = _hand_plan([units[:3], units[3:]])
    config = export_plan(plan, "megatron")
    assert config.pipeline_model_parallel_layout == "Et|tL" and config.num_layers == 2
    check_megatron(plan, config.text())


@pytest.mark.parametrize("seed", range(12))
def test_planner_plans_export_or_are_refused_for_a_true_reason(seed: int) -> None:
    """Random costs, ranks and schedules: every plan the planner writes either exports to a valid layout, or
    cuts inside Megatron's embedding or head, which the refusal says."""
    rng = random.Random(seed)
    names = rng.choice([GPT2_TINY, LLAMA_SMALL])
    forward = [rng.uniform(0.05, 2.0) for _ in names]
    ranks = rng.choice([2, 3, 4])
    schedule = rng.choice([None, Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED_1F1B])
    if schedule is Schedule.INTERLEAVED_1F1B and 2 * ranks > len(names):
        schedule = None
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
    plan = _hand_plan([GPT2_TINY[:1], GPT2_TINY[1:5], GPT2_TINY[5:]])
    with pytest.raises(ExportError, match=r"cuts inside the embedding .* before transformer.wpe .*--pin transformer"):
        export_plan(plan, "megatron")


def test_megatron_refuses_a_cut_between_final_norm_and_head() -> None:
    plan = _hand_plan([GPT2_TINY[:7], GPT2_TINY[7:]])
    with pytest.raises(ExportError, match=r"final norm and head .* before lm_head .*--pin transformer.ln_f=1"):
        export_plan(plan, "megatron")


def test_megatron_refuses_a_cut_inside_a_decoder_layer() -> None:
    units = ["wte", "h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp", "ln_f"]
    with pytest.raises(ExportError, match=r"inside decoder layer 0 .* before h.0.mlp"):
        export_plan(_hand_plan([units[:2], units[2:]]), "megatron")


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
    plan = _hand_plan([units[:2], units[2:]])
    if message is None:
        check_megatron(plan, export_plan(plan, "megatron").text())
        return
    with pytest.raises(ExportError, match=re.escape(message)):
        export_plan(plan, "megatron")


def test_megatron_notes_a_schedule_it_does_not_run() -> None:
    plan = _hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], schedule=Schedule.GPIPE)
    text = export_plan(plan, "megatron").text()
    assert "Megatron runs 1F1B with this layout, not the plan's gpipe" in text
    check_megatron(plan, text)


# --- torchtitan -------------------------------------------------------------------------------------------


def check_torchtitan(plan: Plan, text: str, names=None) -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    config = tomllib.loads(text)
    p = config["parallelism"]
    parts = p["module_fqns_per_model_part"]
    assert len(parts) == plan.num_stages and p["pipeline_parallel_degree"] == plan.num_ranks
    flat = [name for part in parts for name in part]
    assert len(flat) == len(set(flat)) == sum(len(s.units) for s in plan.stages)  # every module once
    assert [len(part) for part in parts] == [len(s.units) for s in plan.stages]  # in order, stage by stage
    # pipeline_module_split keeps top-level modules and items NAME.KEY of top-level containers only.
    assert all(name.count(".") <= 1 for name in flat)
    assert (
        get_schedule_class(p["pipeline_parallel_schedule"]).__name__
        == {
            Schedule.GPIPE: "ScheduleGPipe",
            Schedule.ONE_F_ONE_B: "Schedule1F1B",
            Schedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
            Schedule.ZERO_BUBBLE: "ScheduleInterleavedZeroBubble",
        }[plan.schedule]
    )
    assert config["training"]["local_batch_size"] // p["pipeline_parallel_microbatch_size"] == plan.num_microbatches


def test_torchtitan_parts_of_a_llama_plan_with_torchtitans_names() -> None:
    plan = _hand_plan([LLAMA_SMALL[:4], LLAMA_SMALL[4:8], LLAMA_SMALL[8:]], ranks=3)
    renames = [
        ("model.embed_tokens", "tok_embeddings"),
        ("model.layers", "layers"),
        ("model.norm", "norm"),
        ("lm_head", "output"),
    ]
    config = export_plan(plan, "torchtitan", renames)
    assert config.module_fqns_per_model_part == (
        ("tok_embeddings", "layers.0", "layers.1", "layers.2"),
        ("layers.3", "layers.4", "layers.5", "layers.6"),
        ("layers.7", "norm", "output"),
    )
    assert config.pipeline_parallel_schedule == "1F1B"
    check_torchtitan(plan, config.text())


def test_torchtitan_refuses_names_nested_deeper_than_it_splits() -> None:
    plan = _hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]])
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
    def __init__(self, stages: int, rank: int) -> None:
        self.stages, self.rank = stages, rank

    def get_dim(self, name: str) -> int:
        assert name == "pipe"
        return self.stages

    def get_coord(self, rank: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(pipe=rank)


class _PipelineModule:
    """DeepSpeed's PipelineModule.__init__ as far as partitioning goes (deepspeed/runtime/pipe/module.py)."""

    def __init__(self, layers, num_stages, rank, partition_method="parameters") -> None:
        self._topo = _Topology(num_stages, rank)
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


def test_deepspeed_subclass_bounds_each_rank_to_the_plans_stage(monkeypatch) -> None:
    plan = _planned(GPT2_TINY, [0.1, 0.05, 1, 1.5, 1, 1, 0.05, 2], ranks=3, schedule=Schedule.ONE_F_ONE_B)
    config = export_plan(plan, "deepspeed")
    ns = _run_snippet(config.text(), monkeypatch, "deepspeed.pipe", PipelineModule=_PipelineModule)
    assert ns["PLAN_UNITS"] == GPT2_TINY and config.parts[-1] == len(GPT2_TINY)
    start = 0
    for s in plan.stages:
        module = ns["PlannedPipelineModule"](layers=GPT2_TINY, num_stages=plan.num_stages, rank=s.index)
        assert module.parts == list(config.parts)
        assert GPT2_TINY[module._local_start : module._local_stop] == list(s.units)
        assert module._local_start == start
        start = module._local_stop
    with pytest.raises(ValueError, match="the plan cuts 8 layers into 3 stages"):
        ns["PlannedPipelineModule"](layers=GPT2_TINY[:-1], num_stages=3, rank=0)


def test_deepspeed_and_accelerate_refuse_interleaved_stages() -> None:
    plan = _hand_plan(
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

    text = export_plan(plan, "accelerate").text()
    _run_snippet(f"model = object()\nexample_input = 0\n{text}", monkeypatch, "accelerate", prepare_pippy=prepare_pippy)
    assert calls == [(list(plan.split_points), plan.num_microbatches)]
    assert "accelerate launch --num_processes 4" in text


# --- all trainers, and the command ------------------------------------------------------------------------


def test_naive_schedule_is_not_exported() -> None:
    plan = _hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], schedule=Schedule.NAIVE)
    for trainer in Trainer:
        with pytest.raises(ExportError, match="naive"):
            export_plan(plan, trainer)


def test_recomputation_is_noted_not_dropped() -> None:
    plan = _hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]], recompute=(0,))
    for trainer in (Trainer.TORCHTITAN, Trainer.MEGATRON, Trainer.DEEPSPEED):  # accelerate: inference, no backward
        renames = [("transformer", "")] if trainer is Trainer.TORCHTITAN else []
        assert "recomputes activations on stages 0 only" in export_plan(plan, trainer, renames).text()


def test_cli_prints_to_stdout_and_writes_atomically(tmp_path, capsys) -> None:
    plan_file = tmp_path / "p.plan.json"
    save_plan(_hand_plan([GPT2_TINY[:4], GPT2_TINY[4:]]), plan_file)
    assert main(["export", str(plan_file), "--to", "megatron"]) == 0
    printed = capsys.readouterr().out
    assert '--pipeline-model-parallel-layout "Et*2|t*2L"' in printed
    out = tmp_path / "pp.toml"
    assert main(["export", str(plan_file), "--to", "torchtitan", "--rename", "transformer=", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert tomllib.loads(out.read_text())["parallelism"]["module_fqns_per_model_part"][0][:3] == ["wte", "wpe", "h.0"]


def test_cli_refusals_are_one_line(tmp_path, capsys, existing) -> None:
    plan_file = tmp_path / "p.plan.json"
    save_plan(_hand_plan([GPT2_TINY[:1], GPT2_TINY[1:]]), plan_file)
    assert_fails(
        capsys, ["export", plan_file, "--to", "megatron", "--out", existing], "cuts inside the embedding", existing
    )
    assert_fails(capsys, ["export", plan_file, "--to", "torchtitan"], "torchtitan splits only top-level")
    assert_fails(capsys, ["export", plan_file, "--to", "megatron", "--rename", "a=b"], "no effect on Megatron")
    assert_fails(capsys, ["export", plan_file, "--to", "torchtitan", "--rename", "=x"], "is not OLD=NEW")
    assert_fails(capsys, ["export", plan_file, "--to", "nemo"], "invalid choice")
    assert_fails(capsys, ["export", plan_file, "--to", "megatron", "--out", plan_file], "is this command's input")


def test_docstring_examples() -> None:
    import doctest

    import planner.export

    assert doctest.testmod(planner.export).failed == 0
