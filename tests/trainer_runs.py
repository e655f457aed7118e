"""The trainers' own code run on pipeplan's exports, in processes of their own (tests/planner/test_export_trainers.py).

Every trainer imports far more than pipeplan (torchtitan sets process-wide logging, DeepSpeed builds its
communication backend, Megatron parses ``sys.argv``), so the tests' process imports none of them: the
workers below run in processes of their own on gloo over localhost, with a bounded wait, and hand back plain
values (written as JSON) that the tests compare with the plan. A worker that raises fails the test with
its traceback.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from planner.runtime.launch import free_port, rank_context

__all__ = [
    "spawn",
    "torchtitan_worker",
    "deepspeed_worker",
    "accelerate_worker",
    "megatron_worker",
]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

DEBUGMODEL_LAYERS = 6
"""torchtitan's llama3 ``debugmodel``: 6 decoder layers, dim 256, vocabulary 2,048, untied."""


def _entry(
    index: int,
    fn: Callable[..., Any],
    nprocs: int,
    port: int,
    out: str,
    ranks: Sequence[int],
    environ: dict[str, str],
    args: tuple[Any, ...],
) -> None:
    # The caller's environment as it is now (a fork server's child would have the server's), then what torchrun
    # sets; RANK may be rewritten (``ranks``) as the exports tell a launcher to.
    os.environ.clear()
    os.environ.update(environ)
    rank = ranks[index] if ranks else index
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_RANK=str(index),
        LOCAL_WORLD_SIZE=str(nprocs),
    )
    torch.set_num_threads(1)  # several processes share 2 cores
    result = fn(index, rank, nprocs, *args)
    path = Path(out) / f"{index}.json"
    path.with_suffix(".tmp").write_text(json.dumps(result))
    path.with_suffix(".tmp").replace(path)


def spawn(
    fn: Callable[..., Any], nprocs: int, *args: Any, ranks: Sequence[int] = (), timeout_s: float = 240.0
) -> list[Any]:
    """``fn(device, rank, world, *args)`` in ``nprocs`` new processes; each process's return value, by
    device (spawn index). ``ranks[device]`` is the ``RANK`` a device's process is given (default: the device).

    Raises:
        TimeoutError: the processes did not all end within ``timeout_s`` (they are killed).
        torch.multiprocessing.ProcessRaisedException: a process raised (its traceback is in the message).
    """
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(
            _entry,
            args=(fn, nprocs, free_port(), out, tuple(ranks), dict(os.environ), args),
            nprocs=nprocs,
            join=False,
            # Forked from the fork server pipeplan's ranks start from (planner/runtime/launch.py): torch is
            # imported there once, not by every process.
            start_method=rank_context(fn).get_start_method(),
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{fn.__name__} on {nprocs} processes did not end within {timeout_s:.0f} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(5)
        return [json.loads((Path(out) / f"{i}.json").read_text()) for i in range(nprocs)]


# --- torchtitan 0.3 ---------------------------------------------------------------------------------------


def llama3_debugmodel_cpu():
    """torchtitan's ``llama3_debugmodel`` with its own causal ``ScaledDotProductAttention`` in place of flex
    attention, which has no backward on CPU; for one document per sample the two compute the same. Taken as
    ``--module trainer_runs --config llama3_debugmodel_cpu``, as a user's own config function is."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    for layer in config.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return config


def torchtitan_worker(device: int, rank: int, world: int, cases: Sequence[dict]) -> dict:
    """Each case's ``argv`` through torchtitan's ``ConfigManager`` (on every process); for the cases marked
    ``tying``, the model config's ``update_from_config``, where torchtitan refuses weight tying under a pipeline,
    as given and tied; for those marked ``run``, its ``ParallelDims`` mesh, ``_pipeline_module_split`` and
    ``_build_pipeline_schedule`` on the llama3 debug model, and one step: the modules each stage keeps and the
    loss against the unsplit model."""
    import copy
    import sys

    import torch.distributed as dist
    import torch.nn.functional as F
    import torchtitan.distributed.parallel_dims
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule, _pipeline_module_split

    # torchtitan 0.3 takes "cuda" where it finds no accelerator (tools/utils.py, get_device_info): its mesh is
    # put on the CPU instead; its layout, which is what the test reads, does not depend on the device.
    torchtitan.distributed.parallel_dims.device_type = "cpu"
    sys.path.insert(0, str(EXAMPLES.parent))  # --module examples.torchtitan..., as from the repository's root

    results: list[dict] = []
    initialized = False
    for case in cases:
        config = ConfigManager().parse_args(list(case["argv"]))
        p, t = config.parallelism, config.training
        checkpointing = config.activation_checkpoint  # activation-checkpoint:none leaves None; :full a FullAC.Config
        parsed = {
            "pp": p.pipeline_parallel_degree,
            "schedule": p.pipeline_parallel_schedule,
            "microbatch": p.pipeline_parallel_microbatch_size,
            "parts": p.module_fqns_per_model_part,
            "replicate": p.data_parallel_replicate_degree,
            "shard": p.data_parallel_shard_degree,
            "local_batch": t.local_batch_size,
            "global_batch": t.global_batch_size,
            "cuda_graphs_off": t.disable_cuda_graphs,
            "activation_checkpoint": None if checkpointing is None else type(checkpointing).__qualname__,
            "tp": p.tensor_parallel_degree,
            "sequence_parallel": p.enable_sequence_parallel,
        }
        if case.get("tying"):
            model_config = config.model_spec.model
            model_config.update_from_config(config=config)
            tied = copy.deepcopy(model_config)
            tied.enable_weight_tying = True
            try:
                tied.update_from_config(config=config)
                parsed["tied_refused"] = ""
            except NotImplementedError as exc:
                parsed["tied_refused"] = str(exc)
        if not case.get("run"):
            results.append({"parsed": parsed})
            continue
        if not initialized:
            dist.init_process_group("gloo")
            initialized = True
        dims = ParallelDims.from_config(p, world)
        dims.build_mesh()
        pp_mesh = dims.get_mesh("pp")
        replica = dims.get_mesh("batch").get_local_rank() if dims.dp_replicate * dims.dp_shard > 1 else 0
        model_config = config.model_spec.model
        model_config.update_from_config(config=config)  # where torchtitan refuses weight tying under PP
        torch.manual_seed(0)
        model = model_config.build()
        model.init_states(buffer_device=None)
        stages, parts = _pipeline_module_split(
            model, pp_mesh, p.pipeline_parallel_schedule, torch.device("cpu"), p.module_fqns_per_model_part
        )

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, None]:
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()), None

        schedule = _build_pipeline_schedule(
            parallelism=p, local_batch_size=t.local_batch_size, stages=stages, loss_fn=loss_fn
        )
        # One step. torchtitan 0.3.0's own loop (Trainer.pp_forward_backward_step) calls step(arg_mbs=...,
        # kwarg_mbs=..., target_mbs=...), which torch 2.13's schedules do not take; their step(*args, target,
        # losses) splits the batch itself.
        g = torch.Generator().manual_seed(1000 + replica)
        shape = (t.local_batch_size, t.seq_len)
        tokens = torch.randint(0, model_config.vocab_size, shape, generator=g)
        labels = torch.randint(0, model_config.vocab_size, shape, generator=g)
        first = any(s.is_first for s in stages)
        last = any(s.is_last for s in stages)
        losses: list[torch.Tensor] = []
        if first and last:
            schedule.step(tokens, target=labels, losses=losses)
        elif first:
            schedule.step(tokens)
        elif last:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step()
        out = {
            "parsed": parsed,
            "device": device,
            "rank": rank,
            "pp_rank": pp_mesh.get_local_rank(),
            "replica": replica,
            "holds": {str(s.stage_index): _kept(part) for s, part in zip(stages, parts, strict=True)},
        }
        if last:
            with torch.no_grad():
                reference = loss_fn(model(tokens), labels)[0]
            out["loss"] = float(torch.stack(losses).detach().mean())
            out["reference_loss"] = float(reference)
        results.append(out)
        dist.barrier()
    if initialized:
        dist.destroy_process_group()
    return {"cases": results}


def _kept(part: torch.nn.Module) -> list[str]:
    """The top-level modules, and items of top-level containers, a torchtitan model part still holds."""
    kept = []
    for name, child in part.named_children():
        if child is None:
            continue
        if isinstance(child, torch.nn.ModuleDict | torch.nn.ModuleList):
            kept += [f"{name}.{key}" for key, _ in child.named_children()]
        else:
            kept.append(name)
    return kept


# --- DeepSpeed 0.19 ---------------------------------------------------------------------------------------

DEEPSPEED_MODEL = f"{EXAMPLES / 'custom_model.py'}:workload"
DEEPSPEED_UNITS = ("embed", *(f"blocks.{i}" for i in range(6)), "norm", "head")
"""The units of examples/custom_model.py, which examples/deepspeed/train.py trains: one DeepSpeed layer each."""


def deepspeed_worker(device: int, rank: int, world: int, snippets: Sequence[str]) -> dict:
    """Each export's snippet executed, then what examples/deepspeed/train.py does with it: its
    ``PlannedPipelineModule`` over the model's units on ``PLAN_TOPOLOGY``, ``deepspeed.initialize`` with
    ``PLAN_DS_CONFIG``, and one ``train_batch`` of this replica's batches. Returns the layers this rank holds,
    its (pipe, data) coordinates, and the loss against the unsplit model on every replica's batches."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    import runpy

    import deepspeed
    import deepspeed.ops

    from profiles.workload import load_workload

    example = runpy.run_path(str(EXAMPLES / "deepspeed" / "train.py"))
    # DeepSpeed's CPU backend would first compile its shared-memory collectives (about 90 s of C++ on this
    # machine); without them it uses torch.distributed's, as it does wherever the op is not available.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for text in snippets:
        plan: dict[str, Any] = {}
        exec(compile(text, "<deepspeed export>", "exec"), plan)
        work = load_workload(DEEPSPEED_MODEL)
        model = example["planned_module"](plan, work.model, work.loss_fn)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        config = {"zero_allow_untested_optimizer": True, "steps_per_print": 10**9, **plan["PLAN_DS_CONFIG"]}
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        coord = plan["PLAN_TOPOLOGY"].get_coord(rank)
        loss = engine.train_batch(iter(example["replica_batches"](plan, work.make_batch, coord.data)))
        reference = load_workload(DEEPSPEED_MODEL)
        with torch.no_grad():
            losses = [
                reference.loss_fn(reference.model(x), y)
                for replica in range(plan["PLAN_TOPOLOGY"].get_dim("data"))
                for x, y in example["replica_batches"](plan, reference.make_batch, replica)
            ]
        results.append(
            {
                "rank": rank,
                "pipe": coord.pipe,
                "data": coord.data,
                "holds": list(plan["PLAN_UNITS"][model._local_start : model._local_stop]),
                "loss": float(loss),
                "reference_loss": float(torch.stack(losses).mean()),
                "zero_stage": engine.zero_optimization_stage(),
                "train_batch_size": engine.train_batch_size(),
            }
        )
        torch.distributed.barrier()
    return {"cases": results}


# --- accelerate 1.x ---------------------------------------------------------------------------------------

GPT2_UNITS = (
    "transformer.wte",
    "transformer.wpe",
    *(f"transformer.h.{i}" for i in range(4)),
    "transformer.ln_f",
    "lm_head",
)
"""The units pipeplan profiles transformers' GPT-2 as (4 layers here)."""


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=4,
        n_embd=32,
        n_head=2,
        vocab_size=128,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        # Untied, so that a stage's weights name only its own units: torch's pipeline() would also list a tied
        # head's weight (the embedding's) in the first stage.
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def accelerate_worker(device: int, rank: int, world: int, export_path: str, tokens: int) -> dict:
    """What examples/accelerate/infer.py does with the export: ``PartialState(cpu=True)``, the export run on
    the model with one sample, then one call of ``NUM_CHUNKS`` samples. Returns the units whose weights this
    process's stage holds, and (last process) the logits against the unsplit model's."""
    import runpy

    from accelerate import PartialState

    example = runpy.run_path(str(EXAMPLES / "accelerate" / "infer.py"))
    PartialState(cpu=True)
    ids = torch.randint(0, 128, (64, tokens), generator=torch.Generator().manual_seed(3000))
    model, chunks = example["prepared"](export_path, _gpt2(), ids[:1])
    batch = ids[:chunks]
    stage = model.pippy_stage._stage
    holds = sorted({u for name, _ in stage.submod.named_parameters() for u in GPT2_UNITS if name.startswith(u + ".")})
    with torch.no_grad():
        logits = model(batch)
    out: dict[str, Any] = {"rank": rank, "stage": stage.stage_index, "holds": holds, "num_chunks": chunks}
    if logits is not None:
        with torch.no_grad():
            reference = _gpt2()(batch).logits
        out["max_abs_diff"] = float((logits - reference).abs().max())
        out["shape"] = list(logits.shape)
    return out


# --- Megatron-Core ----------------------------------------------------------------------------------------

MEGATRON_MODEL_FLAGS = (
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--max-position-embeddings",
    "32",
)
"""What Megatron's GPT arguments need beside the export's flags."""


def _flag(words: Sequence[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def megatron_worker(device: int, rank: int, world: int, cases: Sequence[dict], with_training: bool) -> dict:
    """Each export's flags read by Megatron-Core itself: the layout through ``PipelineParallelLayerLayout``
    (``validate_layer_layout``, and the layers ``get_layer_id_list`` gives each (pp rank, virtual stage)), the
    pipeline groups its ``RankGenerator`` makes in the order ``initialize.py`` takes with and without
    ``--use-tp-pp-dp-mapping``, and -- where megatron.training installs -- ``parse_args`` + ``validate_args``
    on ``case["world"]`` processes."""
    import sys

    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    results = []
    for case in cases:
        words = case["words"]
        pp = int(_flag(words, "--pipeline-model-parallel-size"))
        layout = PipelineParallelLayerLayout(_flag(words, "--pipeline-model-parallel-layout"), pp)
        layout.validate_layer_layout(num_layers=int(_flag(words, "--num-layers")), mtp_num_layers=None)
        vpp = layout.virtual_pipeline_model_parallel_size
        # get_layer_id_list reads the virtual size from parallel_state, as a built model has it set.
        parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)
        stages = {}
        for pp_rank in range(pp):
            for vp in range(vpp):
                kinds = layout.layout[pp_rank][vp]
                stages[str(vp * pp + pp_rank)] = {
                    "rank": pp_rank,
                    "layers": layout.get_layer_id_list(vp_stage=vp, pp_rank=pp_rank),
                    "embedding": LayerType.embedding in kinds,
                    "loss": LayerType.loss in kinds,
                }
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
        # megatron/training/initialize.py: order 'tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp' with --use-tp-pp-dp-mapping.
        order = "tp-cp-ep-pp-dp" if "--use-tp-pp-dp-mapping" in words else "tp-cp-ep-dp-pp"
        tp = int(_flag(words, "--tensor-model-parallel-size") or 1)
        generator = parallel_state.RankGenerator(tp=tp, ep=1, dp=case["world"] // (pp * tp), pp=pp, cp=1, order=order)
        results.append({"stages": stages, "vpp": vpp, "pipelines": generator.get_ranks("pp")})
    if with_training:
        from megatron.training.arguments import parse_args, validate_args

        for case, out in zip(cases, results, strict=True):
            os.environ.update(RANK="0", WORLD_SIZE=str(case["world"]))
            sys.argv = ["pretrain_gpt.py", *MEGATRON_MODEL_FLAGS, *case["words"]]
            args = parse_args()
            validate_args(args)
            out["args"] = {
                "pp": args.pipeline_model_parallel_size,
                "vpp": args.virtual_pipeline_model_parallel_size,
                "dp": args.data_parallel_size,
                "global": args.global_batch_size,
                "micro": args.micro_batch_size,
                "num_layers": args.num_layers,
                "layout": args.pipeline_model_parallel_layout,
                "distributed_optimizer": args.use_distributed_optimizer,
                "tp_pp_dp_mapping": args.use_tp_pp_dp_mapping,
                "tp": args.tensor_model_parallel_size,
                "sequence_parallel": args.sequence_parallel,
            }
    return {"cases": results}
