"""The profile file format: round trip, and every kind of bad file is a one-line ProfileError."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.errors import ProfileError
from profiles.format import (
    DeviceInfo,
    LossMemory,
    ModelInfo,
    PieceOverhead,
    Profile,
    TensorFlow,
    UnitProfile,
    WholeModel,
    load_profile,
    profile_from_dict,
    save_profile,
)


def _unit(name: str, scale: float) -> UnitProfile:
    return UnitProfile(
        name=name,
        type="Linear",
        param_count=72,
        param_bytes=288,
        forward_s=(0.001 * scale, 0.002 * scale),
        backward_s=(0.002 * scale, 0.004 * scale),
        flops=(64, 128),
        output_bytes=(32, 64),
        saved_bytes=(48, 96),
    )


@pytest.fixture()
def profile() -> Profile:
    return Profile(
        model=ModelInfo("toy", "ab" * 32, 144, 576),
        device=DeviceInfo("cpu", "test CPU", 8 * 2**30, "float32", "2.13.0"),
        micro_batch_sizes=(1, 2),
        units=(_unit("a", 1.0), UnitProfile(**{**_unit("b", 2.0).__dict__, "tied_params": ("a.weight",)})),
        tensors=(
            TensorFlow(-1, (0,), (16, 32), "float32", False, "input0"),
            TensorFlow(0, (1,), (32, 64), "float32", True, "a:out0"),
        ),
        whole_model=WholeModel((0.0028, 0.0055), (0.0058, 0.011)),
        settings={"repeats": 1, "capture": "export"},
    )


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "p.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_round_trip_is_equal(profile: Profile, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded == profile
    assert loaded.settings == profile.settings
    assert loaded.units[1].tied_params == ("a.weight",)
    assert loaded.unit_sum_s(1) == pytest.approx(0.002 + 0.004 + 0.004 + 0.008)


def test_the_unit_sum_error_is_the_rounds_paired_ratio_where_recorded(profile: Profile) -> None:
    from profiles.report import unit_sum_line

    # medians apart: units 0.003 + 0.006 = 0.009 s at b=1 against a whole model of 0.0086 s
    assert profile.unit_sum_error(0) == pytest.approx(0.009 / 0.0086 - 1)
    measured = {"unit_sum_ratio": [0.98, 1.01], "unit_sum_ratio_error": [0.012, 0.02], "repeats_used": [5, 8]}
    paired = replace(profile, settings={**profile.settings, **measured})
    assert [paired.unit_sum_error(j) for j in (0, 1)] == pytest.approx([-0.02, 0.01])
    assert unit_sum_line(paired, 0) == (
        "b=1: unit sum 9.00 ms vs whole model 8.60 ms: -2.0% (paired in each round over 5 rounds, +-1.2%; the "
        "medians apart +4.7%)"
    )


def test_saved_file_names_format_and_version(profile: Profile, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    save_profile(profile, path)
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("pipeplan.profile", 1)


def _mutate(profile: Profile, change) -> dict:
    data = json.loads(json.dumps(profile.to_dict()))
    change(data)
    return data


def _drop_units_field(d: dict) -> None:
    del d["units"][0]["forward_s"]


def _negative(d: dict) -> None:
    d["units"][1]["backward_s"][0] = -0.5


def _wrong_format(d: dict) -> None:
    d["format"] = "pipeplan.plan"


def _wrong_version(d: dict) -> None:
    d["version"] = 2


def _misaligned(d: dict) -> None:
    d["units"][0]["flops"] = [64]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_drop_units_field, r"invalid profile at \$\.units\[0\]: 'forward_s' is a required property"),
        (_negative, r"invalid profile at \$\.units\[1\]\.backward_s\[0\]: -0\.5 is less than the minimum of 0"),
        (_wrong_format, r"not a pipeplan profile: format is 'pipeplan.plan'"),
        (_wrong_version, r"unsupported profile version 2: this pipeplan reads version 1"),
        (_misaligned, r"units\[0\]\.flops has 1 values, micro_batch_sizes has 2"),
    ],
    ids=["missing-field", "negative", "wrong-format", "wrong-version", "misaligned"],
)
def test_invalid_profiles_are_rejected(profile: Profile, tmp_path: Path, change, message: str) -> None:
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(_write(tmp_path, _mutate(profile, change)))
    assert "\n" not in str(info.value)


def test_nan_is_rejected(profile: Profile, tmp_path: Path) -> None:
    text = json.dumps(profile.to_dict()).replace("0.0028", "NaN", 1)
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(_write(tmp_path, text))
    data = _mutate(profile, lambda d: None)
    data["whole_model"]["forward_s"][0] = float("nan")
    with pytest.raises(ProfileError, match=r"\$\.whole_model\.forward_s\[0\] is nan: numbers must be finite"):
        profile_from_dict(data)


def test_truncated_file_is_rejected(profile: Profile, tmp_path: Path) -> None:
    text = json.dumps(profile.to_dict())
    with pytest.raises(ProfileError, match=r"is not valid JSON \(truncated\?\)"):
        load_profile(_write(tmp_path, text[: len(text) // 2]))


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="profile file not found"):
        load_profile(tmp_path / "absent.json")


def test_consumer_before_producer_is_rejected(profile: Profile) -> None:
    data = _mutate(profile, lambda d: d["tensors"][1].update(consumers=[0]))
    with pytest.raises(ProfileError, match=r"tensors\[1\] is produced by unit 0 but consumed by unit 0"):
        profile_from_dict(data)


def test_piece_overhead_is_optional_and_round_trips(profile: Profile, tmp_path: Path) -> None:
    assert "piece_overhead" not in profile.to_dict()  # absent, as in profiles made before the field
    assert profile.overhead_s(0) == 0.0
    with_overhead = replace(profile, piece_overhead=PieceOverhead((1e-4, 2e-4), (5e-5, 6e-5)))
    path = tmp_path / "p.json"
    save_profile(with_overhead, path)
    loaded = load_profile(path)
    assert loaded.piece_overhead == with_overhead.piece_overhead
    assert loaded.overhead_s(1) == pytest.approx(2e-4 + 6e-5)


def test_misaligned_piece_overhead_is_rejected(profile: Profile) -> None:
    data = _mutate(replace(profile, piece_overhead=PieceOverhead((1e-4,), (5e-5,))), lambda d: None)
    with pytest.raises(ProfileError, match=r"piece_overhead\.forward_s is not aligned with micro_batch_sizes"):
        profile_from_dict(data)


def test_the_loss_block_is_optional_aligned_and_round_trips(profile: Profile, tmp_path: Path) -> None:
    assert "loss" not in profile.to_dict()  # absent, as in profiles made before it: the model leaves it out
    with_loss = replace(profile, loss=LossMemory(target_bytes=(12288, 24576), kept_bytes=(12288, 24576)))
    save_profile(with_loss, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").loss == with_loss.loss
    data = _mutate(replace(profile, loss=LossMemory((8,), (4,))), lambda d: None)
    with pytest.raises(ProfileError, match=r"loss\.target_bytes is not aligned with micro_batch_sizes"):
        profile_from_dict(data)


def test_a_profile_at_the_threads_each_rank_gets() -> None:
    from dataclasses import replace

    from profiles.format import ThreadScaling
    from synthetic import make_profile

    base = make_profile([1.0, 2.0], sizes=(1, 2))
    scaling = ThreadScaling((8, 4, 1), factor=((1.0, 1.0), (1.5, 1.2), (3.0, 2.0)), reference_s=(1.0, 1.4, 2.0))
    profile = replace(base, thread_scaling=scaling, settings={**base.settings, "threads": 8, "reference_s": 1.0})
    assert profile.at_threads(8) is profile
    four = profile.for_ranks(2)  # 8 cores // 2 ranks
    assert four.threads == 4 and four.settings["reference_s"] == 1.4 and four.settings["timed_threads"] == 8
    assert four.units[1].forward_s == (2.0 * 1.5, 4.0 * 1.2)
    whole = base.whole_model.forward_s
    assert four.whole_model.forward_s == (whole[0] * 1.5, whole[1] * 1.2)
    two = profile.at_threads(2)  # between 1 and 4 threads: a third of the way from 1's factors to 4's
    assert two.units[0].forward_s == pytest.approx((1.0 * 2.5, 2.0 * (2.0 - 0.8 / 3)))
    assert two.settings["reference_s"] == pytest.approx(2.0 - 0.6 / 3)
    assert profile.for_ranks(64).threads == 1 and profile.for_ranks(64).units[0].backward_s == (2.0 * 3.0, 4.0 * 2.0)
    again = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.thread_scaling == scaling and again.for_ranks(2).units == four.units


def test_a_profile_that_did_not_time_a_single_ranks_threads_takes_them_as_profiled() -> None:
    from dataclasses import replace

    from profiles.format import ThreadScaling
    from synthetic import make_profile

    # 8 cores, timed at 4 threads (2 ranks) and at 2 and 1: one rank's 8 threads were not timed.
    base = make_profile([1.0, 2.0], sizes=(1, 2))
    scaling = ThreadScaling((4, 2, 1), ((1.0, 1.0), (1.5, 1.2), (3.0, 2.0)), (1.0, 1.4, 2.0), cores=8)
    profile = replace(base, thread_scaling=scaling, settings={**base.settings, "threads": 4, "reference_s": 1.0})
    assert profile.for_ranks(4).threads == 2 and profile.for_ranks(4).units[1].forward_s == (2.0 * 1.5, 4.0 * 1.2)
    assert not profile.timed_for_ranks(1) and profile.timed_for_ranks(2) and profile.timed_for_ranks(64)
    one = profile.for_ranks(1)
    assert one.units == base.units and one.threads == 8  # the profiled times, at the rank's own count
    again = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.thread_scaling == scaling and again.to_dict()["thread_scaling"]["cores"] == 8
    assert "cores" not in replace(profile, thread_scaling=replace(scaling, cores=None)).to_dict()["thread_scaling"]
    data = json.loads(json.dumps(profile.to_dict()))
    data["thread_scaling"]["cores"] = 3
    with pytest.raises(ProfileError, match=r"thread_scaling\.cores must be at least every count"):
        profile_from_dict(data)
