"""Options declared once: a dataclass field is the flag, its help and default, and the API's keyword."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from planner.commands.options import add_options, flat, options_from
from planner.commands.parser import COMMANDS, build_parser, command_options
from planner.errors import UsageError
from planner.options import check_fields, int_range, option, positive_float
from planner.request import PlanOptions
from planner.runtime.run_options import TuneOptions, VerifyOptions
from profiles.profile_options import ProfileOptions


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Toy:
    name: str = option(positional=True, metavar="NAME", help="a name")
    count: int = option(3, parse=int_range(1, 9), help="how many (default 3)")
    timeout_s: float = option(5.0, flag="--timeout", parse=positive_float, unit="s", help="seconds")
    pins: tuple[str, ...] = option((), flag="--pin", repeat=True, metavar="P", help="repeatable")
    quiet: bool = option(False, help="say less")

    def __post_init__(self) -> None:
        check_fields(self)


def test_the_parser_and_the_dataclass_agree() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, _Toy)
    toy = options_from(parser.parse_args(["x", "--count", "4", "--pin", "a", "--pin", "b", "--quiet"]), _Toy)
    assert toy == _Toy(name="x", count=4, pins=("a", "b"), quiet=True)
    assert options_from(parser.parse_args(["x"]), _Toy) == _Toy(name="x")
    assert "--timeout TIMEOUT" in parser.format_help()  # named by its flag, not by the field's unit suffix


def test_a_bad_value_from_the_api_is_refused_with_the_flags_name() -> None:
    with pytest.raises(UsageError, match=r"--count must be an integer in 1..9, got 0"):
        _Toy(name="x", count=0)
    with pytest.raises(UsageError, match=r"--timeout .* must be a positive finite number"):
        _Toy(name="x", timeout_s=-1.0)
    with pytest.raises(UsageError, match=r"--mode must be one of auto, processes, replay, got 'fast'"):
        VerifyOptions(mode="fast")
    with pytest.raises(UsageError, match=r"--candidates must be an integer in 1..32, got 0"):
        TuneOptions(candidates=0)
    with pytest.raises(UsageError, match=r"--global-batch must be an integer"):
        PlanOptions(global_batch=0)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_defaults_are_its_dataclass_defaults(command: str) -> None:
    required = {
        "profile": ["mlp", "--out", "p.json"],
        "calibrate": ["--out", "c.json"],
        "show": ["f.json"],
        "plan": ["p.json", "--out", "o.json", "--global-batch", "4"],
        "tune": ["p.json", "--model", "mlp", "--out", "o.json", "--global-batch", "4"],
        "export": ["p.json", "--to", "megatron"],
        "simulate": [],
        "verify": ["p.json", "--model", "mlp"],
        "check": ["p.json", "--from", "megatron", "args.txt"],
    }[command]
    options = command_options(build_parser().parse_args([command, *required]))
    assert isinstance(options, COMMANDS[command][0])
    given = {"name", "model", "out", "file", "plan", "profile", "global_batch", "to", "trainer", "config"}
    kinds = [type(options)] + [f.metadata["nested"].kind for f in dataclasses.fields(options) if "nested" in f.metadata]
    defaults = {
        f.name: f.default for kind in kinds for f in dataclasses.fields(kind) if f.default is not dataclasses.MISSING
    }
    for name, value in flat(options).items():
        if name not in given and name in defaults:
            assert value == defaults[name], name


def test_the_api_and_the_command_line_build_the_same_options() -> None:
    parsed = command_options(build_parser().parse_args(["profile", "mlp", "--out", "x.json", "--ranks", "4"]))
    assert parsed == ProfileOptions(model="mlp", out="x.json", ranks=4)


def test_a_field_of_the_api_only_has_no_flag_and_is_still_checked() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Floors:
        steps: int = option(2, parse=int_range(1, 9), help="steps")
        floor_s: float = option(1.0, parse=positive_float, unit="s", cli=False, help="API only")

        def __post_init__(self) -> None:
            check_fields(self)

    parser = argparse.ArgumentParser()
    add_options(parser, Floors)
    assert "--floor" not in parser.format_help()
    assert options_from(parser.parse_args(["--steps", "3"]), Floors) == Floors(steps=3, floor_s=1.0)
    with pytest.raises(UsageError, match=r"^floor_s .* must be a positive finite number"):
        Floors(floor_s=-1.0)


def test_verify_takes_its_time_floors_from_the_api_only() -> None:
    args = build_parser().parse_args(["verify", "p.json", "--model", "mlp"])
    assert not hasattr(args, "min_time_s") and not hasattr(args, "min_warmup_s")
    assert VerifyOptions(min_warmup_s=0.0, min_time_s=0.0).min_time_s == 0.0
    with pytest.raises(UsageError, match=r"^min_time_s .* must be a finite number >= 0"):
        VerifyOptions(min_time_s=-1.0)
