import json

import pytest

from planner.cost import MemoryBreakdown
from planner.errors import PlanFormatError
from planner.plan import BaselinePlan, Plan, Prediction, SolverInfo, StagePlan, load_plan, plan_from_dict, save_plan
from planner.schedule.orders import Schedule
from planner.schedule.simulate import RuntimeTerms

FINGERPRINT = "cd" * 32


def sample_plan() -> Plan:
    memory = MemoryBreakdown(params=400, grads=400, optimizer=800, activations=1000, transient=64, peak=2664)
    stages = (
        StagePlan(0, 0, ("layers.0", "layers.1"), False, 0.5, 1.0, 4096, 2, memory),
        StagePlan(1, 1, ("layers.2",), True, 0.25, 0.75, 0, 1, memory),
    )
    return Plan(
        model_name="synthetic",
        model_fingerprint=FINGERPRINT,
        profile_sha256="ef" * 32,
        num_stages=2,
        num_ranks=2,
        schedule=Schedule.ONE_F_ONE_B,
        virtual_stages=1,
        micro_batch_size=2,
        num_microbatches=4,
        global_batch_size=8,
        stages=stages,
        split_points=("layers.2",),
        predicted=Prediction(
            7.0, 7.5, 0.2, 8 / 7.0, 0, (6.0, 4.0), (0.01,), (0.01,), runtime=RuntimeTerms(tail_groups=((0, 1),))
        ),
        solver=SolverInfo("dp", "objective", True, None, 0.0, 12),
        constraints={"num_ranks": 2},
        baselines=(BaselinePlan("uniform-by-count", ("layers.1",), 8.0, True, 3000),),
    )


def test_round_trip_is_exact_and_byte_identical(tmp_path):
    plan = sample_plan()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_plan(plan, a)
    save_plan(load_plan(a), b)
    assert load_plan(a) == plan
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("speed_factor", [None, 1.25])
def test_a_measured_block_round_trips_with_and_without_its_speed_factor(tmp_path, speed_factor):
    from dataclasses import replace

    from planner.plan import Measurement

    measured = Measurement("processes", 6.5, (0.5, 0.25), (1.0, 0.75), 40, -7.1, speed_factor)
    plan = replace(sample_plan(), measured=measured, device={"kind": "cpu", "reference_s": 0.006})
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan and load_plan(path).profile_reference_s == 0.006
    written = json.loads(path.read_text())["measured"]
    assert ("speed_factor" in written) == (speed_factor is not None)  # absent when not measured, as before
    written["speed_factor"] = 0.0
    with pytest.raises(PlanFormatError, match="speed_factor"):
        plan_from_dict({**json.loads(path.read_text()), "measured": written})


def test_the_resume_curve_round_trips_and_is_absent_when_empty(tmp_path):
    from dataclasses import replace

    curve = ((0.001, 0.0002, 0.0001), (0.01, 0.0007, 0.0006))
    plan = replace(sample_plan(), predicted=replace(sample_plan().predicted, runtime=RuntimeTerms(resume=curve)))
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan and load_plan(path).predicted.runtime.resume == curve
    assert json.loads(path.read_text())["predicted"]["resume"] == [list(p) for p in curve]
    save_plan(sample_plan(), path)
    assert "resume" not in json.loads(path.read_text())["predicted"]  # as plans made before it


def test_the_bytes_a_transfer_costs_in_compute_round_trip_and_reach_the_simulator(tmp_path):
    from dataclasses import replace

    plain = sample_plan()
    stages = (plain.stages[0], replace(plain.stages[1], send_grad_bytes=1024))
    terms = RuntimeTerms(transfer_compute_s_per_byte=1e-6)
    plan = replace(plain, stages=stages, predicted=replace(plain.predicted, runtime=terms))
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    pipe = load_plan(path).pipeline()
    assert (pipe.cut_forward_bytes, pipe.cut_backward_bytes) == ((4096,), (1024,))
    # Without the gradient's bytes (plans made before them), the cut's activations stand for them.
    assert replace(plan, stages=plain.stages).pipeline().cut_backward_bytes == (4096,)
    save_plan(plain, path)
    written = json.loads(path.read_text())
    assert "send_grad_bytes" not in written["stages"][1] and "transfer_compute_s_per_byte" not in written["predicted"]


def _dict():
    return json.loads(json.dumps(sample_plan().to_dict()))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="pipeplan.profile"), "not a pipeplan plan"),
        (lambda d: d.update(version=2), "unsupported plan version 2"),
        (lambda d: d.pop("stages"), "'stages' is a required property"),
        (lambda d: d["stages"][0].update(forward_s=-1.0), "stages"),
        (lambda d: d.update(split_points=["layers.1"]), r"split_points \['layers.1'\] must be the first unit"),
        (lambda d: d.update(num_microbatches=3), "global_batch_size"),
        (lambda d: d["stages"][1].update(rank=5), "stage 1 is on rank 5, but schedule 1f1b places it on rank 1"),
        (lambda d: d.update(num_stages=3), "num_stages is 3 but 2 stages"),
        (lambda d: d["predicted"].update(tail_groups=[[0, 2]]), "tail_groups names rank 2, but ranks are 0..1"),
        (lambda d: d["predicted"].update(tail_groups=[[0]]), "tail_groups"),
        (lambda d: d["predicted"].update(resume=[[0.01, 0.1, 0.1], [0.001, 0.1, 0.1]]), "resume.*increasing"),
        (lambda d: d["predicted"].update(resume=[[0.01, 0.1]]), "resume"),
    ],
)
def test_invalid_plans_are_rejected(mutate, message):
    data = _dict()
    mutate(data)
    with pytest.raises(PlanFormatError, match=message):
        plan_from_dict(data)


def test_truncated_and_missing_files(tmp_path):
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    path.write_text(path.read_text()[:100])
    with pytest.raises(PlanFormatError, match="not valid JSON"):
        load_plan(path)
    with pytest.raises(PlanFormatError, match="not found"):
        load_plan(tmp_path / "missing.json")


def test_nan_is_rejected(tmp_path):
    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    path.write_text(path.read_text().replace('"iteration_s": 7.0', '"iteration_s": NaN'))
    with pytest.raises(PlanFormatError, match="NaN"):
        load_plan(path)


def test_written_files_get_the_usual_permissions(tmp_path):
    import os
    import stat

    path = tmp_path / "plan.json"
    save_plan(sample_plan(), path)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
