"""A JSON Schema compiled once into a predicate that says whether a document is valid.

jsonschema walks the schema again for every object it validates: a 2,000-unit profile is about 90,000 steps of
that walk, about half a second of ``pipeplan plan``. The predicate is the same schema turned into nested closures once,
so a document costs one call per constraint. It decides only how fast a valid document passes:
:func:`planner.fileio.check_document` asks jsonschema for the message of any document the predicate refuses, and
accepts a document jsonschema finds valid. Keywords are compiled as jsonschema's Draft 2020-12 applies them
(``integer`` meaning a JSON integer, as :func:`planner.fileio.check_document` redefines it); a schema node with any
other keyword, or an ``enum`` or ``const`` of anything but strings and whole numbers, is checked by jsonschema
itself.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable
from typing import Any

__all__ = ["compile_check"]

Check = Callable[[Any], bool]

IGNORED = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples"})
"""Keywords that constrain nothing by themselves (``$defs`` are compiled where a ``$ref`` names them)."""

COMPILED = frozenset(
    {
        "type",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "prefixItems",
        "propertyNames",
        "pattern",
        "enum",
        "const",
        "oneOf",
        "anyOf",
        "allOf",
    }
)

TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, numbers.Number) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def compile_check(schema: Any, fallback: Callable[[Any], Check]) -> Check:
    """``schema`` as a predicate; ``fallback(node)`` checks a node this module does not compile (jsonschema's
    ``is_valid`` for that node). A ``$ref`` to ``#/$defs/NAME`` is compiled as that definition beside the node's
    other keywords, as Draft 2020-12 applies it."""
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    return _Compiler(fallback, defs).node(schema)


def _ref_name(schema: dict[str, Any]) -> str | None:
    """The definition a node's ``$ref`` names, where it is ``#/$defs/NAME``; else None."""
    ref = schema.get("$ref")
    return ref[len("#/$defs/") :] if isinstance(ref, str) and ref.startswith("#/$defs/") else None


def _equals(constant: str | int) -> Check:
    """Equality as jsonschema's ``equal`` has it for a string or a whole number: ``1.0`` equals 1, ``True`` does
    not, nor does a container."""
    if isinstance(constant, str):
        return lambda v: isinstance(v, str) and v == constant
    return lambda v: not isinstance(v, (str, bool, list, dict)) and v == constant


class _Compiler:
    def __init__(self, fallback: Callable[[Any], Check], defs: dict[str, Any]) -> None:
        self.fallback, self.defs = fallback, defs
        self.following: set[str] = set()
        """The definitions being compiled: one that refers to itself is left to the fallback."""

    def node(self, schema: Any) -> Check:
        if schema is True:
            return lambda v: True
        if schema is False:
            return lambda v: False
        if not isinstance(schema, dict) or not self._compilable(schema):
            return self.fallback(schema)
        checks = [c for key in schema if key in COMPILED for c in self._keyword(key, schema[key], schema)]
        name = _ref_name(schema)
        if name is not None:
            self.following.add(name)
            checks.append(self.node(self.defs[name]))
            self.following.discard(name)
        if len(checks) == 1:
            return checks[0]

        def every(v: Any) -> bool:
            for check in checks:
                if not check(v):
                    return False
            return True

        return every

    def _compilable(self, schema: dict[str, Any]) -> bool:
        if any(key not in COMPILED and key not in IGNORED and key != "$ref" for key in schema):
            return False
        name = _ref_name(schema)
        if "$ref" in schema and (name is None or name not in self.defs or name in self.following):
            return False
        if "additionalProperties" in schema and not isinstance(schema["additionalProperties"], (bool, dict)):
            return False
        if not isinstance(schema.get("enum", []), list):
            return False
        values = [*schema.get("enum", []), *((schema["const"],) if "const" in schema else ())]
        # jsonschema's equality walks containers and tells 1 from True: strings and whole numbers only.
        return all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in values)

    def _keyword(self, key: str, value: Any, schema: dict[str, Any]) -> list[Check]:
        """The checks of one keyword; each passes a value of a type the keyword does not apply to."""
        is_number, is_array, is_object = TYPES["number"], TYPES["array"], TYPES["object"]
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if len(names) == 1:
                return [TYPES[names[0]]]
            preds = [TYPES[n] for n in names]
            return [lambda v: any(p(v) for p in preds)]
        if key == "minimum":
            return [lambda v: not is_number(v) or not v < value]
        if key == "maximum":
            return [lambda v: not is_number(v) or not v > value]
        if key == "exclusiveMinimum":
            return [lambda v: not is_number(v) or not v <= value]
        if key == "exclusiveMaximum":
            return [lambda v: not is_number(v) or not v >= value]
        if key == "minItems":
            return [lambda v: not is_array(v) or len(v) >= value]
        if key == "maxItems":
            return [lambda v: not is_array(v) or len(v) <= value]
        if key == "minLength":
            return [lambda v: not isinstance(v, str) or len(v) >= value]
        if key == "maxLength":
            return [lambda v: not isinstance(v, str) or len(v) <= value]
        if key == "minProperties":
            return [lambda v: not is_object(v) or len(v) >= value]
        if key == "maxProperties":
            return [lambda v: not is_object(v) or len(v) <= value]
        if key == "required":
            return [lambda v: not is_object(v) or all(name in v for name in value)]
        if key == "properties":
            return [self._properties([(name, self.node(sub)) for name, sub in value.items()])]
        if key == "additionalProperties":
            return [self._additional(value, set(schema.get("properties", {})))]
        if key == "items":
            return [self._items(value, len(schema.get("prefixItems", [])))]
        if key == "prefixItems":
            subs = [self.node(sub) for sub in value]
            return [lambda v: not is_array(v) or all(check(item) for check, item in zip(subs, v, strict=False))]
        if key == "propertyNames":
            names = self.node(value)
            return [lambda v: not is_object(v) or all(names(name) for name in v)]
        if key == "pattern":
            compiled = re.compile(value)
            return [lambda v: not isinstance(v, str) or compiled.search(v) is not None]
        if key in ("enum", "const"):
            equals = [_equals(c) for c in (value if key == "enum" else [value])]
            return [lambda v: any(equal(v) for equal in equals)]
        subs = [self.node(sub) for sub in value]  # oneOf, anyOf, allOf
        if key == "oneOf":
            return [lambda v: sum(1 for check in subs if check(v)) == 1]
        if key == "anyOf":
            return [lambda v: any(check(v) for check in subs)]
        return [lambda v: all(check(v) for check in subs)]

    @staticmethod
    def _properties(pairs: list[tuple[str, Check]]) -> Check:
        def properties(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            for name, check in pairs:
                if name in v and not check(v[name]):
                    return False
            return True

        return properties

    def _additional(self, value: bool | dict[str, Any], named: set[str]) -> Check:
        if value is True:
            return lambda v: True
        if value is False:
            return lambda v: not isinstance(v, dict) or all(key in named for key in v)
        extra = self.node(value)
        return lambda v: not isinstance(v, dict) or all(key in named or extra(item) for key, item in v.items())

    def _items(self, value: Any, prefix: int) -> Check:
        if value is False:
            return lambda v: not isinstance(v, list) or len(v) <= prefix
        each = self.node(value)
        if prefix == 0:
            return lambda v: not isinstance(v, list) or all(each(item) for item in v)
        return lambda v: not isinstance(v, list) or all(each(item) for item in v[prefix:])
