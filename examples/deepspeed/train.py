"""Train with DeepSpeed's pipeline engine (deepspeed 0.19), cut where a pipeplan plan cuts.

    pipeplan profile examples/custom_model.py:workload --out custom.profile.json
    pipeplan plan custom.profile.json --stages 2 --global-batch 16 --out custom.plan.json
    pipeplan export custom.plan.json --to deepspeed --out custom_deepspeed.py
    torchrun --nproc-per-node 2 examples/deepspeed/train.py --export custom_deepspeed.py --steps 3

The export holds the plan's numbers (``PLAN_UNITS``, ``PLAN_PARTS``, ``PLAN_TOPOLOGY``, ``PLAN_DS_CONFIG``) and
a ``PipelineModule`` subclass that cuts at ``PLAN_PARTS``. What it cannot hold is the model as DeepSpeed takes
it, a flat list of layers, one per plan unit: :func:`planned_module` makes it from a model whose units are
modules called one after the other on one tensor (``examples/custom_model.py``: embed, blocks.N, norm, head).
A model that passes more between its units (GPT-2's attention mask, a tied head) needs layers written for
DeepSpeed (``LayerSpec``, ``TiedLayerSpec``) in the order of ``PLAN_UNITS``.

Launch with as many processes as the export's comments say (pp, or pp x dp for a cluster plan). On a CPU,
DeepSpeed first compiles its shared-memory collectives (C++, a minute or two, once per machine).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from profiles.workload import load_workload  # noqa: E402


def planned_module(export: dict[str, Any], model: nn.Module, loss_fn: Any) -> nn.Module:
    """The export's ``PlannedPipelineModule`` over ``model``'s modules named ``PLAN_UNITS``, in that order."""
    modules = dict(model.named_modules())
    missing = [unit for unit in export["PLAN_UNITS"] if unit not in modules]
    if missing:
        raise SystemExit(f"the model has no module {missing[0]!r}, a unit of the plan: map names with --rename")
    return export["PlannedPipelineModule"](
        layers=[modules[unit] for unit in export["PLAN_UNITS"]],
        topology=export["PLAN_TOPOLOGY"],
        loss_fn=loss_fn,
        activation_checkpoint_interval=export["PLAN_ACTIVATION_CHECKPOINT_INTERVAL"],
    )


def replica_batches(export: dict[str, Any], make_batch: Any, replica: int) -> list[tuple[Any, Any]]:
    """This replica's micro-batches of one step: its slice of ``make_batch(train_batch_size)``."""
    ds = export["PLAN_DS_CONFIG"]
    micro, steps = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    inputs, target = make_batch(ds["train_batch_size"])
    start = replica * micro * steps
    return [
        (inputs[start + i * micro : start + (i + 1) * micro], target[start + i * micro : start + (i + 1) * micro])
        for i in range(steps)
    ]


def main() -> None:
    import deepspeed

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", required=True, help="the file `pipeplan export --to deepspeed --out` wrote")
    parser.add_argument("--model", default="examples/custom_model.py:workload", help="MODEL spec")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    export = runpy.run_path(args.export)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    work = load_workload(args.model)
    module = planned_module(export, work.model, work.loss_fn)
    optimizer = torch.optim.AdamW(module.parameters(), lr=args.lr)
    # Your ds_config under the plan's entries; a torch optimizer under ZeRO-1 is "untested" to DeepSpeed.
    config = {"zero_allow_untested_optimizer": True, "steps_per_print": 1, **export["PLAN_DS_CONFIG"]}
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    replica = export["PLAN_TOPOLOGY"].get_coord(int(os.environ["RANK"])).data
    batches = replica_batches(export, work.make_batch, replica)
    for step in range(args.steps):
        loss = engine.train_batch(iter(batches))
        if int(os.environ["RANK"]) == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
