"""Pipeline-parallel inference with accelerate (1.x), split where a pipeplan plan cuts.

    pipeplan profile gpt2-tiny --out gpt2-tiny.profile.json
    pipeplan plan gpt2-tiny.profile.json --stages 2 --global-batch 8 --out gpt2-tiny.plan.json
    pipeplan export gpt2-tiny.plan.json --to accelerate --out gpt2_accelerate.py
    torchrun --nproc-per-node 2 examples/accelerate/infer.py --export gpt2_accelerate.py --model gpt2-tiny

accelerate's pipelining is inference only (forward, torch's ScheduleGPipe) and runs micro-batch 1:
``prepare_pippy`` traces ``example_input`` as one chunk, so it is one sample, and each call of the prepared
model takes exactly ``NUM_CHUNKS`` samples (accelerate pads another count, which then splits unevenly). The
last process gets the output. The plan's split carries over; its training schedule and prediction do not.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from profiles.workload import load_workload  # noqa: E402


def prepared(export_path: str | Path, model: nn.Module, example_input: Any) -> tuple[nn.Module, int]:
    """The export run as written on ``model`` with ``example_input`` (one sample): the model
    ``prepare_pippy`` returns, and the samples each call takes (``NUM_CHUNKS``)."""
    scope = runpy.run_path(str(export_path), init_globals={"model": model, "example_input": example_input})
    return scope["model"], scope["NUM_CHUNKS"]


def main() -> None:
    from accelerate import PartialState

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", required=True, help="the file `pipeplan export --to accelerate --out` wrote")
    parser.add_argument("--model", required=True, help="MODEL spec (the plan's model)")
    args = parser.parse_args()

    state = PartialState(cpu=not torch.cuda.is_available())  # before prepare_pippy: it reads the processes
    work = load_workload(args.model)
    work.model.eval()
    example, _ = work.make_batch(1)
    model, chunks = prepared(args.export, work.model, example)
    inputs, _ = work.make_batch(chunks)
    with torch.no_grad():
        output = model(inputs)
    if state.is_last_process:
        print(f"output of {chunks} samples: {tuple(output.shape)}", flush=True)


if __name__ == "__main__":
    main()
