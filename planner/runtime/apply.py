"""Apply a plan in training code: split the model, build this rank's stages and torch's schedule.

The model is cut at the plan's split points into stages that relay the values later stages read
(:mod:`planner.runtime.stages`); each stage of this rank is then a manual ``PipelineStage``, which runs
every schedule of torch's on gloo.

Typical use (every rank runs the same lines)::

    run = apply_plan(plan, model, example_inputs, loss_fn, device=torch.device("cpu"))
    optimizer = torch.optim.SGD(run.parameters(), lr=1e-3)
    for inputs, target in batches:
        optimizer.zero_grad()
        loss = run.step(inputs, target)   # schedule.step + sync_tied_grads; loss on the last stage's rank
        optimizer.step()
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import ModelMismatchError, ScheduleError
from planner.plan import Plan
from planner.runtime.failure import mark_stage
from planner.runtime.mesh_groups import MeshPlace, mesh_place, pipelines, replicated
from planner.runtime.stages import StageModule, split_stages
from planner.runtime.tensor_parallel import (
    TensorParallelLayout,
    TpPlanHook,
    as_dtensor,
    check_runtime_layout,
    local_shapes,
    original_gradient,
    shard_stage,
    tp_layout,
)
from planner.schedule.orders import TORCH_SCHEDULE_CLASS, Schedule, stage_to_rank
from profiles.allocator import keep_freed_memory
from profiles.fingerprint import model_fingerprint
from profiles.weight_groups import made_from_weights_alone, mend_split_backward
from profiles.workload import as_tuple

__all__ = [
    "TiedCopies",
    "PipelineRun",
    "apply_plan",
    "check_fingerprint",
    "tied_parameter_groups",
    "microbatch_inputs",
    "schedule_microbatches",
    "stage_io_examples",
    "backward_whole",
]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of an FSDP DTensor, a plain tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def tied_parameter_groups(model: nn.Module) -> list[tuple[str, ...]]:
    """Names that share one Parameter (e.g. GPT-2's ``transformer.wte.weight`` and ``lm_head.weight``)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return sorted(tuple(names) for names in by_id.values() if len(names) > 1)


def check_fingerprint(plan: Plan, model: nn.Module) -> None:
    """Raise :class:`ModelMismatchError`, saying as precisely as possible what differs."""
    actual = model_fingerprint(model)
    if actual == plan.model_fingerprint:
        return
    modules = dict(model.named_modules())
    plan_units = [u for s in plan.stages for u in s.units]
    missing = [u for u in plan_units if u not in modules]
    detail = (
        f"units {missing[:3]}{' ...' if len(missing) > 3 else ''} of the plan are not modules of this model"
        if missing
        else f"the model has the plan's {len(plan_units)} units, so a parameter shape or module type differs"
    )
    n_params = sum(p.numel() for p in model.parameters())
    raise ModelMismatchError(
        f"the model's fingerprint {actual[:12]}.. differs from the plan's {plan.model_fingerprint[:12]}..: "
        f"the plan was made for model {plan.model_name!r}; {detail} (this model: {n_params} parameters); "
        "profile and plan this model again"
    )


def schedule_microbatches(plan: Plan) -> int:
    """Micro-batches the torch schedule runs: 1 for ``naive``, else the plan's count."""
    return 1 if plan.schedule is Schedule.NAIVE else plan.num_microbatches


def microbatch_inputs(plan: Plan, example_inputs: Any) -> tuple[torch.Tensor, ...]:
    """One micro-batch of ``example_inputs`` (a whole batch or a micro-batch) for tracing."""
    inputs = as_tuple(example_inputs)
    mb = plan.global_batch_size // schedule_microbatches(plan)
    lead = inputs[0].shape[0]
    if lead == mb:
        return inputs
    if lead == plan.global_batch_size or (plan.mesh is not None and lead == plan.mesh.global_batch_size):
        return tuple(t[:mb] for t in inputs)
    raise ModelMismatchError(
        f"example inputs have batch size {lead}; the plan runs batches of {plan.global_batch_size} "
        f"in micro-batches of {mb}: pass a batch of either size"
    )


@dataclass(frozen=True)
class TiedCopies:
    """The copies of one tied parameter after the split: ``(stage index, parameter)`` for this rank."""

    names: tuple[str, ...]
    local: tuple[nn.Parameter, ...]
    group: Any
    """Process group of the ranks holding a copy (None: all copies are on this rank)."""


def _sum_across(total: torch.Tensor, group: Any) -> None:
    """Sum ``total`` over ``group`` in place, as ``all_reduce`` does. Two ranks (a weight tied between the
    first and last stage) swap their tensors instead: each posts its send and receive as soon as it gets
    here, so the rank that arrives last finds the other's gradient waiting. On the development VM, for
    gpt2-tiny's 256 KiB embedding with the ranks 2 ms apart, the late rank spent 338-473 us (median) in
    gloo's all-reduce, over 1 ms in 15-21 of 70 steps, and 183-206 us swapping, never over 1 ms
    (``python benchmarks/bench_runtime_probes.py --only tied``; docs/BENCHMARKS.md, "Fidelity").
    Both add the two tensors, whose sum does not depend on the order: the copies stay bitwise equal."""
    if dist.get_world_size(group) != 2:
        dist.all_reduce(total, group=group)
        return
    other = 1 - dist.get_rank(group)
    peer = other if group is None else dist.get_global_rank(group, other)
    theirs = torch.empty_like(total)
    ops = [dist.P2POp(dist.isend, total, peer, group), dist.P2POp(dist.irecv, theirs, peer, group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    total.add_(theirs)


@dataclass(frozen=True)
class PipelineRun:
    """This rank's share of a pipelined model and the torch schedule that drives it."""

    plan: Plan
    rank: int
    world_size: int
    stage_indices: tuple[int, ...]
    stage_modules: tuple[StageModule, ...]
    stages: tuple[Any, ...]
    """torch ``PipelineStage`` objects, one per stage of this rank."""
    schedule: Any
    """The torch schedule object, ready for ``.step``."""
    tied: tuple[TiedCopies, ...] = ()
    replica: int = 0
    """Which data-parallel replica this rank belongs to (cluster plans; 0 otherwise)."""
    replica_group: Any = None
    """Process group of this pipeline rank's replicas (None: one replica): where gradients are reduced."""
    tp_layout: TensorParallelLayout | None = None
    """The linears sharded over this pipeline rank's tensor-parallel group (None: no tensor parallelism)."""
    tp_rank: int = 0
    """This process's place in its tensor-parallel group."""

    @property
    def is_first(self) -> bool:
        return 0 in self.stage_indices

    @property
    def is_last(self) -> bool:
        return self.plan.num_stages - 1 in self.stage_indices

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the original model's FQNs (a tied one may appear per stage)."""
        for module in self.stage_modules:
            yield from module.original_named_parameters()

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """This rank's gradients by FQN as whole plain CPU tensors in the unsharded model's layout: sharded ones
        (FSDP2, tensor parallelism) gathered with ``full_tensor()`` (a collective: every rank of the mesh must
        call it), a tensor-parallel linear's put back as the model keeps it (tensor_parallel.original_gradient)."""
        from torch.distributed.tensor import DTensor

        out = {}
        for name, p in self.named_parameters():
            if p.grad is None:
                continue
            grad = as_dtensor(p.grad, spec_of=p)  # a local shard under DDP (tensor_parallel.local_parameters)
            whole = grad.full_tensor() if isinstance(grad, DTensor) else grad
            out[name] = original_gradient(self.tp_layout, name, whole).detach().cpu().clone()
        return out

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once: what the optimizer takes."""
        seen: dict[int, nn.Parameter] = {}
        for _, p in self.named_parameters():
            seen.setdefault(id(p), p)
        return list(seen.values())

    def sync_tied_grads(self) -> None:
        """Sum the gradients of every tied parameter's copies across stages and ranks.

        Call after the schedule's ``step`` and before ``optimizer.step()`` (``step`` below does it),
        so every copy gets the single-device gradient and the copies stay equal.
        """
        for tie in self.tied:
            if not tie.local:
                continue  # no copy on this rank: it is not in the group either (see _tied_copies)
            # On this rank's shards when FSDP shards the copies (alike over the replicas, so they add up).
            # Summed into the first copy's gradient in place: a vocabulary-sized weight's gradient is
            # 150 MB (GPT-2), and fresh buffers for the sum cost their page faults every step.
            for p in tie.local:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            total, *others = [_local(p.grad) for p in tie.local]
            for grad in others:
                total.add_(grad)
            if tie.group is not None:
                _sum_across(total, tie.group)
            for grad in others:
                grad.copy_(total)

    def step(self, inputs: Any = None, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """One training step: ``schedule.step`` then :meth:`sync_tied_grads`.

        Every rank may pass the whole batch; only the first stage's rank uses ``inputs`` and only the
        last stage's rank uses ``target``. Under a cluster plan the whole batch is the step's, and each
        replica takes its own slice (:meth:`replica_slice`); its gradients are reduced over the replicas.
        Returns the loss averaged over micro-batches on the last stage's rank, else None.
        """
        loss = self.schedule_step(inputs, target)
        self.sync_tied_grads()
        return loss

    def replica_slice(self, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """This replica's share of a whole step's batch (cluster plans); anything else as it is."""
        mesh = self.plan.mesh
        if mesh is None or not values or values[0].shape[0] != mesh.global_batch_size:
            return values
        size = self.plan.global_batch_size
        return tuple(v[self.replica * size : (self.replica + 1) * size] for v in values)

    def schedule_step(self, inputs: Any = None, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """:meth:`step` without the tied-gradient sync (for timing the two apart)."""
        args = self.replica_slice(as_tuple(inputs)) if self.is_first else ()
        if target is not None:
            target = self.replica_slice((target,))[0]
        losses: list[torch.Tensor] = []
        # The merged output is not what a training step needs: asked for (torch's default), the last stage keeps
        # every micro-batch's output (an LM's logits) until the next step and concatenates them at the end.
        keep = {"return_outputs": False} if _takes_return_outputs(self.schedule) else {}
        if self.is_last:
            if target is None:
                raise ScheduleError(f"rank {self.rank} holds the last stage: step() needs the target")
            self.schedule.step(*args, target=target, losses=losses, **keep)
        else:
            self.schedule.step(*args, **keep)
        return torch.stack([loss.detach() for loss in losses]).mean() if self.is_last else None


def _takes_return_outputs(schedule: Any) -> bool:
    """Whether this torch's ``schedule.step`` has ``return_outputs`` (torch 2.7 on); older ones pass unknown
    keywords on to the model."""
    return "return_outputs" in inspect.signature(schedule.step).parameters


def _tied_copies(
    plan: Plan, model: nn.Module, modules: Sequence[StageModule], rank: int, group: Any, row: int = 0
) -> tuple[TiedCopies, ...]:
    out = []
    for names in tied_parameter_groups(model):
        holders: dict[int, list[nn.Parameter]] = {}
        for s, module in enumerate(modules):
            found = {id(p): p for n, p in module.inner.named_parameters(remove_duplicate=False) if n in names}
            if found:  # a rank with no copy of this group takes no part in its all-reduce
                holders.setdefault(plan.stages[s].rank, []).extend(found.values())
        ranks = sorted(holders)
        sub = None
        if len(ranks) > 1:
            # new_group must be entered by every process of the world, in the same order: under a
            # cluster plan each one makes every pipeline's group (replicas x tensor-parallel ranks; tied
            # weights are not sharded, so each tensor-parallel rank sums its own copies) and keeps its own.
            for k, pipeline in enumerate(pipelines(plan, group)):
                made = dist.new_group([pipeline[r] for r in ranks])
                sub = made if k == row else sub
        out.append(TiedCopies(names, tuple(holders.get(rank, ())), sub if rank in ranks else None))
    return tuple(out)


def _name_failures(stage: Any, index: int, units: Sequence[str], module: StageModule) -> None:
    """Make an error raised in ``stage``'s compute say which stage it was (:mod:`planner.runtime.failure`).

    Wrapped on the instance, like verify's timers: torch's schedules call these three methods by name.
    """
    for method in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        original = getattr(stage, method, None)
        if original is None:
            continue

        def named(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            try:
                return _original(*args, **kwargs)
            except BaseException as exc:
                mark_stage(exc, index, units, module)
                raise

        setattr(stage, method, named)


def stage_io_examples(
    modules: Sequence[StageModule], mb_inputs: tuple[torch.Tensor, ...]
) -> tuple[list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]], list[bool]]:
    """Each stage's (inputs, outputs) on one real micro-batch, detached with their requires_grad kept; and whether
    each has an output made from its weights alone (:func:`~profiles.weight_groups.made_from_weights_alone`).

    Handing these to ``PipelineStage`` puts torch in its static-metadata mode. Without them torch infers
    shapes by running each stage on empty tensors, which feeds garbage to a stage whose input is an
    index (GPT-2's position ids, when a cut falls between ``wte`` and ``wpe``) and fails there.
    """

    def detached(values: Any) -> tuple[torch.Tensor, ...]:
        values = values if isinstance(values, tuple) else (values,)
        return tuple(v.detach().requires_grad_(v.requires_grad) for v in values)

    examples, weights_alone = [], []
    inputs = detached(mb_inputs)
    with torch.enable_grad():
        for module in modules:
            outputs = module(*inputs)
            weights_alone.append(made_from_weights_alone(outputs, inputs))
            examples.append((inputs, detached(outputs)))
            inputs = examples[-1][1]
    return examples, weights_alone


def _check_placement(plan: Plan) -> Schedule:
    sched = plan.schedule
    # Looped (stage s on rank s % R) or, for zbv/dualpipev, V (rank r: stages r and 2R-1-r): torch's
    # classes derive the placement from the schedule, so the plan's must be the same.
    expected = stage_to_rank(sched, plan.num_stages, plan.num_ranks)
    actual = tuple(s.rank for s in plan.stages)
    if actual != expected:
        where = "in a V" if sched.v_shape else f"stage s on rank s % {plan.num_ranks}"
        raise ScheduleError(
            f"plan places stages on ranks {list(actual)}; torch's {sched.value} schedule needs {where}: "
            f"{list(expected)}"
        )
    return sched


def _whole_backward() -> Any:
    """A weight-gradient runner with nothing left to do: the stage's input-gradient action ran it all."""
    return lambda: None


def backward_whole(plan: Plan, stage: int, module: nn.Module, weights_alone: bool) -> bool:
    """Whether a stage runs its whole backward in the input-gradient action (I) and nothing in W.

    So does a stage past the first under a split-backward schedule with an output made from its weights alone
    (``weights_alone``: torch's groups would miss that output's gradient, profiles/weight_groups.py), and a
    recomputing one: torch's split (``stage_backward_weight``) runs autograd once per parameter group, and a
    checkpointed stage re-materialises its forward for each of them and keeps it: two GPT-2 blocks of gpt2-tiny
    (b = 2) peaked at 10.2 MB in W recomputing, 2.2 MB without. With a ``dw_builder`` torch's I runs the full
    backward (its ``backward_one_chunk``) and W calls the builder's runner. Not under DDP, whose gradients torch
    reduces in the last W only (``backward_maybe_with_nosync``): there the split stays torch's.

    Raises:
        ScheduleError: a DDP stage with an output made from its weights alone, whose split would leave those
            weights' gradients short.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not plan.schedule.splits_backward:
        return False
    alone = weights_alone and stage > 0
    if isinstance(module, DistributedDataParallel):
        if alone:
            raise ScheduleError(
                f"stage {stage} passes on an output made from its weights alone, whose gradient torch's split "
                f"backward ({plan.schedule.value}) leaves out under DDP: plan it with a schedule that runs the "
                "backward whole (gpipe, 1f1b, interleaved-1f1b, looped-bfs) or shard it (--shard full)"
            )
        return False
    return plan.stages[stage].recompute or alone


def apply_plan(
    plan: Plan,
    model: nn.Module,
    example_inputs: Any,
    loss_fn: Any,
    *,
    device: torch.device | str,
    rank: int | None = None,
    world_size: int | None = None,
    group: Any = None,
    tp_plan: TpPlanHook | None = None,
) -> PipelineRun:
    """Turn ``plan`` into this rank's stage(s) and the torch schedule, ready for ``.step(...)``.

    Args:
        plan: the plan (``load_plan``); its fingerprint must match ``model``.
        model: the whole model, same weights on every rank (same seed); it is traced, not changed.
        example_inputs: inputs of a whole batch or of one micro-batch (shapes matter, not values).
        loss_fn: ``loss_fn(output, target)``, averaged over the micro-batch (the schedule averages over
            micro-batches by scaling gradients by ``1 / num_microbatches``).
        device: where this rank's stages run.
        rank, world_size: default to the process group's.
        group: the process group (default: the world).
        tp_plan: a plan with tensor parallelism (``mesh.tp`` > 1) on a model with no built-in layout: the
            Workload's ``tp_plan`` hook (planner/runtime/tensor_parallel.py).

    On CPU it also sets this process's allocator as the profiler's (glibc: every block from the heap,
    freed memory kept), without which large blocks page-fault on every step.

    Raises:
        ModelMismatchError: the model is not the plan's. ScheduleError: the placement is not looped.
        UsageError: the plan models a tensor-parallel layout this runtime does not run (Megatron's).
        TensorParallelError: the plan's tensor parallelism has no layout for this model.
    """
    check_fingerprint(plan, model)
    check_runtime_layout(plan)
    sched = _check_placement(plan)
    device = torch.device(device)
    if device.type == "cpu":
        # The profile was measured with freed memory kept in the process; a training rank that runs the
        # plan must allocate the same way for the plan's times to hold (profiles/allocator.py).
        keep_freed_memory()
    place = mesh_place(plan, device) if plan.mesh is not None and group is None else None
    if place is not None:
        assert plan.mesh is not None
        rank, group, world_size = place.pp_rank, place.pp_group, plan.mesh.pp
    layout = _tp_layout(plan, model, place, tp_plan)
    rank = dist.get_rank(group) if rank is None else rank
    world_size = dist.get_world_size(group) if world_size is None else world_size
    if world_size != plan.num_ranks:
        raise ScheduleError(f"the plan needs {plan.num_ranks} ranks but the process group has {world_size}")
    mb_inputs = microbatch_inputs(plan, example_inputs)
    # A tensor-parallel stage is traced as its rank computes it (tensor_parallel.local_shapes): its shapes and
    # its example inputs and outputs are the rank's.
    tp_rank = place.tp_rank if place is not None else 0
    with local_shapes(model, layout, tp_rank) if layout is not None else contextlib.nullcontext():
        modules = split_stages(model, mb_inputs, plan.split_points, [s.recompute for s in plan.stages])
        io, weights_alone = stage_io_examples(modules, mb_inputs)
    mine = tuple(s.index for s in plan.stages_of_rank(rank))
    local, runs = _local_modules(plan, model, modules, mine, io, device, layout, place)
    # After the replicas' wrapping: FSDP2 replaces a stage's parameters with sharded ones.
    tied = _tied_copies(plan, model, modules, rank, group, place.pipeline_row(plan.mesh.tp) if place else 0)
    stages = _pipeline_stages(plan, modules, runs, mine, io, device, group, weights_alone)
    schedule = _torch_schedule(plan, sched, stages, loss_fn)
    dp = plan.mesh.dp if plan.mesh is not None else 1
    group_of_replicas = place.replicas.get_group() if place is not None and dp > 1 else None
    replica = place.replica if place is not None else 0
    return PipelineRun(
        plan, rank, world_size, mine, local, stages, schedule, tied, replica, group_of_replicas, layout, tp_rank
    )


def _local_modules(
    plan: Plan,
    model: nn.Module,
    modules: Sequence[StageModule],
    mine: tuple[int, ...],
    io: Sequence[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]],
    device: torch.device,
    layout: TensorParallelLayout | None,
    place: MeshPlace | None,
) -> tuple[tuple[StageModule, ...], tuple[nn.Module, ...]]:
    """This rank's stages on its device, sharded over its tensor-parallel group; and what the schedule runs of
    them: the same, or each wrapped for its replicas (DDP or FSDP2) where there are several."""
    local = tuple(modules[s].to(device) for s in mine)
    if layout is not None:
        assert place is not None
        for m in local:
            shard_stage(m.inner, model, layout, place.tp_mesh)
    # One replica has no gradients to reduce: no DDP or FSDP2 around its stages.
    if place is None or plan.mesh is None or plan.mesh.dp <= 1:
        return local, local
    runs = tuple(
        replicated(m, plan, place.replicas, tuple(t.to(device) for t in io[s][0]))
        for m, s in zip(local, mine, strict=True)
    )
    return local, runs


def _pipeline_stages(
    plan: Plan,
    modules: Sequence[StageModule],
    runs: Sequence[nn.Module],
    mine: tuple[int, ...],
    io: Sequence[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]],
    device: torch.device,
    group: Any,
    weights_alone: Sequence[bool],
) -> tuple[Any, ...]:
    """torch's ``PipelineStage`` for each of this rank's stages, its errors naming the stage."""
    from torch.distributed import pipelining

    stages = tuple(
        pipelining.PipelineStage(
            m,
            s,
            plan.num_stages,
            device,
            input_args=tuple(t.to(device) for t in io[s][0]),
            output_args=tuple(t.to(device) for t in io[s][1]),
            group=group,
            dw_builder=_whole_backward if backward_whole(plan, s, m, weights_alone[s]) else None,
        )
        for m, s in zip(runs, mine, strict=True)
    )
    for stage, s in zip(stages, mine, strict=True):
        mend_split_backward(stage)
        _name_failures(stage, s, plan.stages[s].units, modules[s])
    return stages


def _torch_schedule(plan: Plan, sched: Schedule, stages: tuple[Any, ...], loss_fn: Any) -> Any:
    """torch's schedule object for the plan's schedule, over this rank's stages."""
    from torch.distributed import pipelining

    cls = getattr(pipelining, TORCH_SCHEDULE_CLASS[sched])
    n_mb = schedule_microbatches(plan)
    if sched.multi_stage:
        return cls(list(stages), n_microbatches=n_mb, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=n_mb, loss_fn=loss_fn)


def _tp_layout(
    plan: Plan, model: nn.Module, place: MeshPlace | None, hook: TpPlanHook | None
) -> TensorParallelLayout | None:
    """The plan's tensor-parallel layout of ``model``; None without tensor parallelism."""
    tp = plan.mesh.tp if plan.mesh is not None else 1
    if tp == 1:
        return None
    if place is None:
        raise ScheduleError(
            f"the plan shards stages over tensor parallelism {tp}: apply it on the world process group "
            "(no group=), which must hold the plan's whole mesh"
        )
    return tp_layout(model, tp, hook)
