"""pipeplan: profile a PyTorch model once, plan its pipeline-parallel split exactly, apply the plan with
``torch.distributed.pipelining``.

The front door: what a training script or a notebook uses, one import away (``import planner``); each name
is imported the first time it is used, so ``import planner`` itself imports neither torch nor the solvers.

Profile a model::

    load_workload(spec)              a MODEL spec ("gpt2-small", "path/to/file.py:NAME", "hf:config.json")
                                     resolved into a Workload (model, inputs, loss)
    profile_spec(ProfileOptions(model="gpt2-tiny"))
                                     what ``pipeplan profile`` does: build the model and measure every unit
    profile_model(workload, MeasureSettings(micro_batch_sizes=(1, 2)))
                                     measure a Workload you built yourself
    load_profile(path), save_profile(profile, path)

Plan it::

    plan_profile(profile, PlanOptions(ranks=4, global_batch=16))
                                     the best plan (``.plan``), as ``pipeplan plan`` finds it; with
                                     ClusterOptions(devices=64, ...) a pp x tp x dp mesh (``.cluster``)
    load_plan(path), save_plan(plan, path), format_plan(plan)
    simulate(plan.pipeline())        the iteration in time: bubble, busy time, in-flight micro-batches
    export_plan(plan, "megatron")    the trainer's configuration (``.text()``); also torchtitan, deepspeed,
                                     accelerate
    check_config(profile, "megatron", text, CheckOptions(memory_bytes=80 << 30))
                                     the configuration you run (Megatron-Core arguments, torchtitan overrides or
                                     TOML, DeepSpeed's ds_config) as a plan (``.plan``), each rank's memory
                                     (``.ranks``, ``.fits``) and the best plan under its rules (``.best``,
                                     ``.speedup``), as ``pipeplan check`` prints it: format_check(result)

Run it::

    apply_plan(plan, model, example_inputs, loss_fn)
                                     this rank's stages and torch schedule: ``run.step(inputs, target)``;
                                     with ``record=True`` the steps are timed against the plan:
                                     ``run.report()``, ``run.save_record(path)`` (every rank calls them)
    verify_plan(plan, "gpt2-small", VerifyOptions(steps=3))
                                     run the plan and hold it against its prediction; format_report(report)
    load_calibration(path)           what the runtime costs on a machine (``pipeplan calibrate``)

Every error a user can cause is a :class:`PipeplanError`. The folders below are the rest of the library:
``planner.schedule`` (a schedule in time), ``planner.runtime`` (the runtime on torch), ``planner.export``,
``profiles`` and ``solvers``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each front-door name -> the module that defines it.
_FRONT_DOOR = {
    "load_workload": "profiles.workload",
    "ProfileOptions": "profiles.profile_options",
    "profile_spec": "profiles.from_spec",
    "profile_model": "profiles.profiler",
    "MeasureSettings": "profiles.measure_settings",
    "load_profile": "profiles.format",
    "save_profile": "profiles.format",
    "PlanOptions": "planner.request",
    "ClusterOptions": "planner.request",
    "plan_profile": "planner.planning",
    "load_plan": "planner.plan",
    "save_plan": "planner.plan",
    "format_plan": "planner.report",
    "simulate": "planner.schedule.simulate",
    "export_plan": "planner.export",
    "CheckOptions": "planner.check_options",
    "check_config": "planner.check",
    "format_check": "planner.check",
    "apply_plan": "planner.runtime.recorded_run",
    "VerifyOptions": "planner.runtime.run_options",
    "verify_plan": "planner.runtime.verify",
    "format_report": "planner.runtime.verify_report",
    "load_calibration": "planner.calibration",
    "PipeplanError": "planner.errors",
}

__all__ = sorted(_FRONT_DOOR)


def __getattr__(name: str) -> Any:
    """Import a front-door name on first use (PEP 562) and keep it, so later uses cost nothing."""
    module = _FRONT_DOOR.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
