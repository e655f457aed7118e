"""The parameter groups of a split backward, mended so that torch's W computes every weight's gradient once.

torch 2.13's split backward (``torch.distributed.pipelining._backward``) has I (``stage_backward_input``) group a
stage's parameters by the nodes where their gradients join the path from the stage's output to its inputs, keep
the gradients reaching those nodes, and has W (``stage_backward_weight``) run one autograd call per group, each
freeing the graph it backs through. Two things go wrong where a tensor made from weights is used at several depths
of a stage, as T5's position bias is (made from block 0's ``relative_attention_bias``, added in every block):

- ``get_param_groups`` merges a parameter's group into an existing one but leaves it under the nodes it was filed
  under before, so a parameter can sit in two groups and have its gradient added twice (T5: off by up to 1e-2);
- a group whose nodes lie one below another backs through the graph between them, which other groups' calls
  free or need: "Trying to backward through the graph a second time".

:func:`weight_groups` merges the groups that share a parameter or a node, and where a group's nodes still lie one
below another makes every group one (a single call backs through each node once). A stage without such a tensor,
GPT-2's for one, keeps torch's groups unchanged, and so W's time.

A third thing no grouping mends: an output no input reaches (:func:`made_from_weights_alone`). Its weights' share
of its gradient is in no group, and such a stage runs its whole backward in I (planner/runtime/apply.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["made_from_weights_alone", "mend_split_backward", "split_input_backward", "weight_groups"]


def weight_groups(groups: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``groups`` (what I returns, its gradients kept) as groups W can run one after another; None stays None."""
    if not groups or _apart(groups):
        return groups
    merged = _merge_sharing(groups)
    if any(_nested(g["intermediates"]) for g in merged if len(g["intermediates"]) > 1):
        return _merge_sharing(merged, everything=True)
    return merged


def split_input_backward(roots: list[Any], grads: list[Any], inputs: list[Any], params: Any) -> Any:
    """torch's I (``stage_backward_input``) and the parameter groups it keeps for W, mended (:func:`weight_groups`)
    as a rank's are by :func:`mend_split_backward`."""
    from torch.distributed.pipelining._backward import stage_backward_input

    return weight_groups(stage_backward_input(roots, grads, inputs, params)[1])


def mend_split_backward(stage: Any) -> None:
    """Have torch's ``PipelineStage`` keep mended groups (:func:`weight_groups`) for its W.

    Wrapped on the instance, as the schedules call ``backward_one_chunk`` by name; W reads what I left in
    ``backward_state``, ``(inputs, groups, outputs, output gradients)``."""
    original = stage.backward_one_chunk

    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        result = original(bwd_chunk_id, *args, **kwargs)
        state = stage.backward_state.get(bwd_chunk_id)
        if state is not None and state[1]:
            stage.backward_state[bwd_chunk_id] = (state[0], weight_groups(state[1]), *state[2:])
        return result

    stage.backward_one_chunk = backward_one_chunk


def made_from_weights_alone(outputs: Any, inputs: Any) -> bool:
    """Whether some output of a stage that needs a gradient is reached from none of its inputs that need one (T5's
    decoder embeddings, made from token ids by a stage that holds the embedding; a position bias passed on).

    torch's I backs from the outputs to the inputs and files each weight under the nodes where its gradient joins
    that path; a weight whose gradient reaches an output by another path is in no group, and W never gives it
    that output's gradient (torch's first stage, whose inputs need none, runs its whole backward for this reason).
    Such a stage runs its whole backward in I."""
    from torch.distributed.pipelining._backward import _get_grad_fn_or_grad_acc

    targets = {_get_grad_fn_or_grad_acc(x) for x in _tensors(inputs) if x.requires_grad}
    return any(out.grad_fn is not None and not _reaches([out.grad_fn], targets) for out in _tensors(outputs))


def _tensors(values: Any) -> list[Any]:
    import torch

    values = values if isinstance(values, (tuple, list)) else (values,)
    return [v for v in values if isinstance(v, torch.Tensor)]


def _apart(groups: list[dict[str, Any]]) -> bool:
    """Whether no two groups share a parameter or a node and each group has one node: torch's groups as they are,
    the common case, checked in one pass."""
    seen: set[Any] = set()
    count = 0
    for group in groups:
        if len(group["intermediates"]) > 1:
            return False
        seen.update(group["params"], group["intermediates"])
        count += len(group["params"]) + len(group["intermediates"])
    return len(seen) == count


def _merge_sharing(groups: list[dict[str, Any]], everything: bool = False) -> list[dict[str, Any]]:
    """Groups sharing a parameter or a node made one (union-find), or all of them made one."""
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Any, int] = {}
    for i, group in enumerate(groups):
        for node in (*group["params"], *group["intermediates"]):
            j = 0 if everything else owner.setdefault(node, i)
            parent[root(i)] = root(j)
    out: dict[int, dict[str, Any]] = {}
    for i, group in enumerate(groups):
        into = out.setdefault(root(i), {"params": set(), "intermediates": [], "grads": []})
        into["params"] |= set(group["params"])
        kept = group.get("grads") or [None] * len(group["intermediates"])  # I's hooks fill it as gradients arrive
        for node, grads in zip(group["intermediates"], kept, strict=True):
            if node not in into["intermediates"]:
                into["intermediates"].append(node)
                into["grads"].append(grads)
    return list(out.values())


def _nested(nodes: list[Any]) -> bool:
    """Whether one of ``nodes`` lies below another in the autograd graph."""
    return _reaches([child for node in nodes for child, _ in node.next_functions if child is not None], set(nodes))


def _reaches(starts: list[Any], targets: set[Any]) -> bool:
    """Whether the autograd graph below ``starts`` (themselves included) holds one of ``targets``."""
    seen: set[Any] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node in targets:
            return True
        if node in seen:
            continue
        seen.add(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return False
