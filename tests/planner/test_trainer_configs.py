"""The trainers' configurations read as the trainers read them: each reader's rules against the trainer's own
code where it is installed (the ``trainers`` extra: megatron-core's ``get_num_layers_to_build`` and layer
offsets, torchtitan's ``ConfigManager`` and ``_generate_llm_fqn_per_model_part``, DeepSpeed's partitioners),
and the configurations a trainer would refuse or would train only in part, refused in its words."""

from __future__ import annotations

import importlib.util
import itertools
import random

import pytest
from export_plans import GPT2_TINY, LLAMA_SMALL

from planner.errors import ConfigError
from planner.schedule.orders import Schedule
from planner.trainer_configs.deepspeed import partition_balanced, partition_uniform, read_deepspeed
from planner.trainer_configs.megatron import megatron_layers_per_stage, parse_layout, read_megatron
from planner.trainer_configs.torchtitan import read_torchtitan, torchtitan_layers_per_stage, torchtitan_settings
from synthetic import transformer_profile


def _needs(module: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"{module} is not installed here: the trainers extra installs it (pip install -e '.[trainers]')")


LLAMA_12 = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(12)), "model.norm", "lm_head"]


# --- Megatron-Core ----------------------------------------------------------------------------------------

MEGATRON_CASES = [
    (layers, pp, vp, first, last, embedding, loss)
    for layers, pp, vp, first, last, embedding, loss in itertools.product(
        [8, 12, 15, 30], [1, 2, 4], [1, 2], [None, 3], [None, 2], [False, True], [False, True]
    )
    if not (pp == 1 and (vp > 1 or first or last))
]


def test_megatron_layers_per_stage_are_megatron_cores() -> None:
    """Every case's layers per stage, and where Megatron refuses one, a refusal: against megatron-core's own
    TransformerConfig checks, get_num_layers_to_build and get_transformer_layer_offset (layers follow in stage
    order)."""
    _needs("megatron.core")
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    refused = 0
    for layers, pp, vp, first, last, embedding, loss in MEGATRON_CASES:
        try:
            config = TransformerConfig(
                num_layers=layers,
                hidden_size=64,
                num_attention_heads=4,
                pipeline_model_parallel_size=pp,
                pipeline_dtype=torch.float32,
                virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                num_layers_in_first_pipeline_stage=first,
                num_layers_in_last_pipeline_stage=last,
                account_for_embedding_in_pipeline_split=embedding,
                account_for_loss_in_pipeline_split=loss,
            )
            chunks = [(c if vp > 1 else None, r) for c in range(vp) for r in range(pp)]
            theirs = [get_num_layers_to_build(config, c, r) for c, r in chunks]
            offsets = [get_transformer_layer_offset(config, c, r) for c, r in chunks]
        except (AssertionError, ValueError):
            theirs = None
        case = (layers, pp, vp, first, last, embedding, loss)
        if theirs is None:
            refused += 1
            with pytest.raises(ConfigError, match="Megatron"):
                megatron_layers_per_stage(
                    layers, pp, vp, first=first, last=last, embedding_counts=embedding, loss_counts=loss
                )
            continue
        mine = megatron_layers_per_stage(
            layers, pp, vp, first=first, last=last, embedding_counts=embedding, loss_counts=loss
        )
        assert mine == theirs, case
        if pp > 1:
            assert offsets == [sum(theirs[:i]) for i in range(len(theirs))], case
    assert 0 < refused < len(MEGATRON_CASES)


@pytest.mark.parametrize("layout", ["Et*2|(tt|)*2L", "E|t*3|tt,tL", "Ettt|(tt|)*2,m|L", "(Et|)*1tL"])
def test_megatron_layout_strings_parse_as_megatron_parses_them(layout: str) -> None:
    _needs("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    symbol = {"embedding": "E", "decoder": "t", "loss": "L", "mtp": "m"}
    theirs = PipelineParallelLayerLayout.parse_str_to_list(layout)
    assert parse_layout(layout) == [[symbol[t.name] for t in stage] for stage in theirs]


def test_megatron_reads_a_torchrun_command_line() -> None:
    text = """# a job of 2 nodes
    torchrun --nproc-per-node 4 --nnodes 2 pretrain_gpt.py \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \\
        --num-layers 12 --hidden-size 4096 --micro-batch-size 2 --global-batch-size 32 \\
        --num-layers-per-virtual-pipeline-stage 3 --use-distributed-optimizer \\
        --recompute-granularity full --recompute-method uniform"""
    layout = read_megatron(text, LLAMA_12)
    assert (layout.num_ranks, layout.tensor_parallel, layout.data_parallel) == (2, 2, 2)
    assert layout.schedule is Schedule.INTERLEAVED_1F1B and len(layout.stages) == 4
    assert [len(s) for s in layout.stages] == [4, 3, 3, 5]  # E + 3, 3, 3, 3 + norm and head
    assert (layout.micro_batch_size, layout.num_microbatches) == (2, 8)
    assert layout.sequence_parallel and layout.shard == "optimizer" and all(layout.recompute)
    assert any("--hidden-size" in note for note in layout.notes)


def test_megatron_uneven_first_and_last_stages() -> None:
    layout = read_megatron(
        "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2 "
        "--micro-batch-size 1",
        LLAMA_12,
    )
    assert [sum(u.startswith("model.layers") for u in s) for s in layout.stages] == [2, 4, 4, 2]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--pipeline-model-parallel-size 5 --micro-batch-size 1", "num_layers should be divisible"),
        ("--pipeline-model-parallel-size 2", "--micro-batch-size is missing"),
        ("--pipeline-model-parallel-size 2 --micro-batch-size 1 --num-layers 24", "another model"),
        ("--pipeline-model-parallel-size 2 --micro-batch-size 3 --global-batch-size 8", "not divisible by micro"),
        (
            '--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et*6|t*5L" --micro-batch-size 1',
            "Number of decoder layers 11 must match num_layers 12",
        ),
        (
            '--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et*6|t*6L" --micro-batch-size 1 '
            "--num-virtual-stages-per-pipeline-rank 2",
            "cannot be given with it",
        ),
        ('--pipeline-model-parallel-layout "Ex|t*12L" --micro-batch-size 1', "invalid layer character 'x'"),
        ("--context-parallel-size 2 --micro-batch-size 1", "context or expert parallelism"),
        ("--micro-batch-size 1 --recompute-granularity full", "--recompute-method is required"),
        ("--pipeline-model-parallel-size 2 --micro-batch-size 1 'unclosed", "as a shell would"),
    ],
)
def test_megatron_refusals_in_megatrons_words(flags: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_megatron(flags, LLAMA_12)


# --- torchtitan -------------------------------------------------------------------------------------------


def test_torchtitan_layers_per_stage_are_torchtitans() -> None:
    _needs("torchtitan")
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    compared = refused = 0
    for stages, layers, first, last in itertools.product([1, 2, 3, 4, 8], [4, 7, 12, 16], [0, 1, 2], [0, 1, 3]):
        try:
            parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
        except ValueError:
            refused += 1
            with pytest.raises(ConfigError, match="torchtitan"):
                torchtitan_layers_per_stage(stages, layers, first, last)
            continue
        compared += 1
        theirs = [sum(name.startswith("layers.") for name in part) for part in parts]
        assert torchtitan_layers_per_stage(stages, layers, first, last) == theirs, (stages, layers, first, last)
    assert compared > 50 and refused > 0


TORCHTITAN_FLAGS = [
    "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B "
    "--parallelism.pipeline_parallel_layers_per_stage 4 --training.local_batch_size 4 --training.disable_cuda_graphs",
    "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_microbatch_size 2 "
    "--parallelism.module_fqns_per_model_part tok_embeddings,layers.0 layers.1,norm,output "
    "--parallelism.data_parallel_shard_degree 2 --parallelism.no_enable_sequence_parallel "
    "--training.disable_cuda_graphs activation-checkpoint:full",
    "--parallelism.pipeline_parallel_degree=4 --parallelism.pipeline_parallel_first_stage_less_layers 0 "
    "--parallelism.tensor_parallel_degree 2 --training.global_batch_size 64 --training.disable_cuda_graphs",
]


@pytest.mark.parametrize("flags", TORCHTITAN_FLAGS)
def test_torchtitan_flags_read_as_its_config_manager_reads_them(flags: str) -> None:
    _needs("torchtitan")
    from torchtitan.config import ConfigManager

    base = ["--module", "trainer_runs", "--config", "llama3_debugmodel_cpu"]
    config = ConfigManager().parse_args([*base, *flags.split()])
    p, t = config.parallelism, config.training
    mine = torchtitan_settings(flags)
    # The keys the flags give (the rest come from the --config function, which only torchtitan runs).
    given = [key for key in mine if f".{key}" in flags]
    assert len(given) >= 3
    for key in given:
        theirs = getattr(p if hasattr(p, key) else t, key)
        if isinstance(theirs, bool):
            assert mine[key] is theirs or str(mine[key]).lower() == str(theirs).lower(), key
        elif isinstance(theirs, int):
            assert int(mine[key]) == theirs, key
        else:
            assert mine[key] == theirs, key
    checkpointing = config.activation_checkpoint
    assert (mine["mode"] == "full") == (checkpointing is not None and "Full" in type(checkpointing).__qualname__)


def test_torchtitan_reads_toml_as_its_flags() -> None:
    toml = """
    [parallelism]
    pipeline_parallel_degree = 2
    pipeline_parallel_schedule = "Interleaved1F1B"
    pipeline_parallel_layers_per_stage = 4
    [training]
    local_batch_size = 4
    disable_cuda_graphs = true
    """
    names = [n.replace("model.", "") if n != "model.embed_tokens" else "tok_embeddings" for n in LLAMA_12]
    assert read_torchtitan(toml, names) == read_torchtitan(TORCHTITAN_FLAGS[0], names)


def test_torchtitan_names_a_layer_no_part_holds() -> None:
    names = ["tok_embeddings", *(f"layers.{i}" for i in range(4)), "norm", "lm_head"]
    flags = "--training.disable_cuda_graphs --parallelism.pipeline_parallel_degree 2 "
    flags += "--parallelism.module_fqns_per_model_part "
    with pytest.raises(ConfigError, match=r"torchtitan would train 6 of the model's 7 units: layers\.2 is on no stage"):
        read_torchtitan(flags + "tok_embeddings,layers.0,layers.1 layers.3,norm,lm_head", names)
    with pytest.raises(ConfigError, match="names 'layers.9', which is no unit"):
        read_torchtitan(flags + "tok_embeddings,layers.0,layers.1,layers.9 layers.2,layers.3,norm,lm_head", names)
    with pytest.raises(ConfigError, match="on stages 0 and 1: torchtitan would build and run it twice"):
        read_torchtitan(flags + "tok_embeddings,layers.0,layers.1 layers.1,layers.2,layers.3,norm,lm_head", names)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B "
            "--parallelism.pipeline_parallel_layers_per_stage 7 --training.disable_cuda_graphs",
            "Multi-stage schedule requires at least 2",
        ),
        (
            "--training.disable_cuda_graphs --parallelism.pipeline_parallel_degree 2 "
            "--parallelism.pipeline_parallel_schedule Fancy",
            "none of torch's",
        ),
        (
            "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_microbatch_size 3 "
            "--training.disable_cuda_graphs",
            "must be divisible by microbatch_size",
        ),
        ("--parallelism.context_parallel_degree 2", "context or expert"),
        ("--parallelism.pipeline_parallel_degree 2", "Set --training.disable_cuda_graphs"),
    ],
)
def test_torchtitan_refusals(flags: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_torchtitan(flags, LLAMA_12)


# --- DeepSpeed --------------------------------------------------------------------------------------------


def test_deepspeed_partitions_are_deepspeeds() -> None:
    _needs("deepspeed")
    from deepspeed.runtime import utils

    rng = random.Random(0)
    for _ in range(60):
        n, parts = rng.randint(1, 24), rng.randint(1, 8)
        weights = [rng.choice([0, 1, rng.randint(0, 1000)]) for _ in range(n)]
        assert partition_uniform(n, parts) == list(utils.partition_uniform(n, parts))
        assert partition_balanced(weights, parts) == [int(x) for x in utils.partition_balanced(weights, parts)]


def test_deepspeed_partition_names_the_ranks_it_leaves_empty() -> None:
    """DeepSpeed #5078's shape: more stages than layers leave the last ranks no layer (``partition_uniform``),
    and ``type:REGEX`` at many stages leaves stages none of the layers it balances."""
    profile = transformer_profile("gpt2", layers=10)  # 14 layers: embeddings, 10 blocks, norm, head
    config = '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16, "pipeline": '
    with pytest.raises(ConfigError, match=r"gives stages 14, 15 of 16 no layers"):
        read_deepspeed(config + '{"stages": 16, "partition_method": "type:GPT2Block"}}', profile.units)
    layout = read_deepspeed(config + '{"stages": 12, "partition_method": "type:gpt2block"}}', profile.units)
    blocks = [sum(u.startswith("transformer.h.") for u in s) for s in layout.stages]
    assert sum(blocks) == 10 and 0 in blocks
    empty = ", ".join(str(s) for s, n in enumerate(blocks) if n == 0)
    assert any(f"stages {empty} hold none of them" in note or f"stage {empty} holds" in note for note in layout.notes)


def test_deepspeed_parameters_partition_balances_parameters() -> None:
    profile = transformer_profile("llama", layers=6)
    layout = read_deepspeed(
        '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": 2}}', profile.units
    )
    counts = [u.param_count + u.tied_param_count for u in profile.units]
    assert [len(s) for s in layout.stages] == [b - a for a, b in itertools.pairwise(partition_balanced(counts, 2))]
    assert (layout.micro_batch_size, layout.num_microbatches, layout.data_parallel) == (2, 4, 1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"train_batch_size": 8, "pipeline": {"stages": 2}}', "Check batch related parameters"),
        (
            '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "pipeline": {"stages": 2}}',
            "ZeRO-2 and ZeRO-3 are incompatible",
        ),
        ('{"train_micro_batch_size_per_gpu": 1}', "the stage count is missing"),
        (
            '{"train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 2, "partition_method": "profile"}}',
            "not implemented",
        ),
        (
            '{"train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 2, "partition_method": "type:Conv"}}',
            "found no valid layers",
        ),
        ("{not json", "cannot read the ds_config"),
    ],
)
def test_deepspeed_refusals(config: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_deepspeed(config, transformer_profile("llama", layers=4).units)


def test_the_export_tests_units_are_read_by_every_reader() -> None:
    for names in (GPT2_TINY, LLAMA_SMALL):
        assert len(read_megatron("--pipeline-model-parallel-size 2 --micro-batch-size 1", names).stages) == 2
