"""The compiled schema predicate (planner/schema_check.py) says what jsonschema says, keyword by keyword and on
mutated copies of every kind of document pipeplan reads."""

from __future__ import annotations

import copy
import json
import random
from importlib import resources
from typing import Any

import pytest

from planner.calibration import shipped_calibration
from planner.errors import PlanFormatError, ProfileError
from planner.fileio import _strict_validator, check_document
from planner.request import PlanRequest
from planner.schema_check import compile_check
from planner.search import make_plan
from profiles.device_model import device_model
from profiles.format import profile_from_dict
from profiles.modelled import TransformerShape, modelled_profile
from tests.synthetic import transformer_profile

NOT_COMPILED = object()


def _both(schema: dict[str, Any]) -> tuple[Any, Any]:
    """The predicate (every node compiled: a fallback fails the test) and jsonschema's validator."""

    def fallback(node: Any) -> Any:
        raise AssertionError(f"not compiled: {node}")

    return compile_check(schema, fallback), _strict_validator(schema)


CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"type": "integer"}, [1, 1.0, True, -3, "1", None, 2**60]),
    ({"type": "number"}, [1, 1.5, True, "x", None, [1]]),
    ({"type": ["string", "null"]}, ["a", None, 0, False]),
    ({"type": "array"}, [[], (1,), {}, "ab"]),
    ({"type": "object"}, [{}, [], None]),
    ({"type": "boolean"}, [True, 0, None]),
    ({"minimum": 0, "maximum": 2}, [-1, 0, 2, 2.5, True, "5", None]),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, [0, 0.5, 1, False, "x"]),
    ({"minItems": 1, "maxItems": 2}, [[], [1], [1, 2, 3], "abc", {}]),
    ({"minLength": 1, "maxLength": 2}, ["", "a", "abc", 5, []]),
    ({"minProperties": 1}, [{}, {"a": 1}, [], 3]),
    ({"required": ["a", "b"]}, [{"a": 1}, {"a": 1, "b": 2}, [], "ab"]),
    (
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        [{"a": 1}, {"a": "x"}, {"b": 1}, {}, [1]],
    ),
    ({"additionalProperties": {"type": "string"}}, [{"a": "x"}, {"a": 1}, {}, 3]),
    ({"properties": {"a": {}}, "additionalProperties": {"type": "string"}}, [{"a": 1, "b": "x"}, {"b": 2}]),
    ({"items": {"type": "integer"}}, [[1, 2], [1, "x"], [], {"a": "x"}]),
    ({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, [["a", 1], ["a", 1, 2], [1], []]),
    ({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}, [["a", 1, 2], ["a", "b"], [2]]),
    ({"propertyNames": {"pattern": "^[a-z]+$"}}, [{"ab": 1}, {"A": 1}, {}, []]),
    ({"pattern": "b+"}, ["abc", "ac", 3]),
    ({"enum": ["x", "y"]}, ["x", "z", 1, None, ["x"]]),
    ({"const": 1}, [1, 1.0, True, "1", [1], 2]),
    ({"const": "a"}, ["a", "b", None]),
    ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, [1, -1, 0.5, -0.5, "s"]),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, [1, "s", None]),
    ({"allOf": [{"minimum": 0}, {"maximum": 1}]}, [0.5, 2, -1]),
    (
        {"$defs": {"p": {"type": "array", "items": {"exclusiveMinimum": 0}}}, "$ref": "#/$defs/p", "minItems": 1},
        [[1], [], [0], "x"],
    ),
    (True, [1, None]),
    (False, [1, None]),
]


@pytest.mark.parametrize(("schema", "instances"), CASES)
def test_each_keyword_as_jsonschema_applies_it(schema: Any, instances: list[Any]) -> None:
    if isinstance(schema, bool):
        check = compile_check(schema, lambda node: pytest.fail(f"not compiled: {node}"))
        assert [check(v) for v in instances] == [schema] * len(instances)
        return
    check, validator = _both(schema)
    verdicts = [check(v) for v in instances]
    assert verdicts == [validator.is_valid(v) for v in instances]
    assert True in verdicts and False in verdicts  # every case tells something apart


def test_what_it_does_not_compile_goes_to_the_fallback() -> None:
    asked: list[Any] = []

    def fallback(node: Any) -> Any:
        asked.append(node)
        return lambda v: v == 7

    check = compile_check({"properties": {"a": {"multipleOf": 7}, "b": {"enum": [1.5]}}}, fallback)
    assert asked == [{"multipleOf": 7}, {"enum": [1.5]}]
    assert check({"a": 7, "b": 7}) and not check({"a": 8})


def _documents() -> list[tuple[str, dict[str, Any]]]:
    shape = TransformerShape("t", "llama", 2, 64, 4, 2, 128, 256, 32, False)
    modelled = modelled_profile(shape, device_model("h100-80gb"), (1, 2), recompute="op")
    profile = transformer_profile(layers=4, sizes=(1, 2))
    plan = make_plan(profile, PlanRequest(num_ranks=2, global_batch_size=8), sha256="0" * 64)
    return [
        ("profile", json.loads(json.dumps(profile.to_dict()))),
        ("profile", json.loads(json.dumps(modelled.to_dict()))),
        ("plan", json.loads(json.dumps(plan.to_dict()))),
        ("calibration", json.loads(json.dumps(shipped_calibration("cpu").to_dict()))),
    ]


SCHEMAS = {
    "profile": ("profiles", "profile.schema.json"),
    "plan": ("planner", "plan.schema.json"),
    "calibration": ("planner", "calibration.schema.json"),
}

REPLACEMENTS: list[Any] = [None, True, 0, -1, 1.5, 2**40, "", "x", [], [1], {}, {"a": 1}]


def _mutated(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``doc`` with one value replaced, one key removed or one key added, somewhere in it."""
    out = copy.deepcopy(doc)
    node: Any = out
    while True:  # walk down to a random container, stopping a level early now and then
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        key, child = rng.choice(children) if children else (None, None)
        if key is None or not isinstance(child, (dict, list)) or rng.random() < 0.25:
            break
        node = child
    action = rng.random()
    if key is None or action < 0.15:
        if isinstance(node, dict):
            node[rng.choice(["extra", "name", "units"])] = rng.choice(REPLACEMENTS)
        else:
            node.append(rng.choice(REPLACEMENTS))
    elif action < 0.3 and isinstance(node, dict):
        del node[key]
    else:
        node[key] = rng.choice(REPLACEMENTS)
    return out


def test_mutated_documents_get_jsonschemas_verdict() -> None:
    rng = random.Random(1234)
    verdicts: dict[bool, int] = {True: 0, False: 0}
    for kind, doc in _documents():
        package, name = SCHEMAS[kind]
        schema = json.loads(resources.files(package).joinpath(name).read_text())
        check, validator = _both(schema)
        assert check(doc) and validator.is_valid(doc)
        for _ in range(300):
            mutated = _mutated(doc, rng)
            verdict = check(mutated)
            assert verdict == validator.is_valid(mutated), (kind, json.dumps(mutated)[:300])
            verdicts[verdict] += 1
    assert verdicts[True] > 100 and verdicts[False] > 300  # both verdicts were tested many times


def test_a_refused_document_still_gets_jsonschemas_message() -> None:
    (_, profile), _, (_, plan), _ = _documents()
    profile["units"][1]["forward_s"] = "fast"
    with pytest.raises(ProfileError, match=r"^invalid profile at \$\.units\[1\]\.forward_s: 'fast' is not of type"):
        profile_from_dict(profile)
    plan["stages"] = []
    schema = json.loads(resources.files("planner").joinpath("plan.schema.json").read_text())
    with pytest.raises(PlanFormatError, match=r"^invalid plan at \$\.stages: \[\] should be non-empty"):
        check_document(plan, schema, error=PlanFormatError, kind="plan", fmt=plan["format"], version=plan["version"])
