"""The Matrix event schemas under ``schemas/matrix``, each compiled once.

A schema is read from the package data the first time it is asked for and the
compiled validator is kept for the life of the process: the judge runs for
every incoming event, so compiling per call would dominate its cost.

jsonschema walks a schema generically and costs tens of microseconds per
event.  So beside it each schema also gets a *predicate* compiled from the same
document, for the small set of keywords the event schemas use.  The predicate
mirrors jsonschema's semantics for those keywords exactly and only answers
"valid or not"; when it says "valid" the event is valid, otherwise jsonschema
runs (once) to find what is wrong.  A schema using any keyword the predicate
does not mirror gets no predicate and is judged by jsonschema alone, so the
schema file stays the single source of the rules.
"""

from __future__ import annotations

import functools
import json
import numbers
from collections.abc import Callable, Iterator
from typing import Any

from jsonschema.exceptions import ValidationError

from bridge.protocol.patterns import Validator, compiled
from bridge.resources import schema_path

QUESTION = "dev.superpipeline.question.v2"
ANSWER = "dev.superpipeline.question.answer.v2"
OUTCOME = "dev.superpipeline.question.outcome.v1"

Predicate = Callable[[Any], bool]


class SchemaMissing(LookupError):
    """No schema of that event type ships with this installation."""


@functools.cache
def schema(event_type: str) -> dict[str, Any]:
    """The schema document of ``event_type``.

    Not checked against the draft 2020-12 metaschema here: that took 18 ms,
    at the first answer after every start.  The schemas are files of this
    package, checked once by the test suite (``tests/unit/test_judge.py``)."""
    path = schema_path(event_type)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SchemaMissing(f"no schema for {event_type!r} in this installation") from None
    return json.loads(text)


@functools.cache
def validator(event_type: str) -> Any:
    """The compiled jsonschema validator of ``event_type`` (one per process)."""
    return Validator(schema(event_type))


@functools.cache
def predicate(event_type: str) -> Predicate | None:
    """The fast exact validity test of ``event_type``, or None if its schema needs jsonschema."""
    return compile_predicate(schema(event_type))


def iter_errors(event_type: str, instance: Any) -> Iterator[ValidationError]:
    """Every way ``instance`` breaks the schema of ``event_type`` (jsonschema itself)."""
    return validator(event_type).iter_errors(instance)


@functools.cache
def depth(event_type: str) -> int | None:
    """How deep below the root the schema of ``event_type`` looks, or None if unknown."""
    return inspection_depth(schema(event_type))


def errors(event_type: str, instance: Any) -> list[ValidationError]:
    """All errors at once; empty when valid.  jsonschema runs at most once.

    jsonschema puts ``repr(instance)`` into its messages, which overflows the
    stack on deeply nested values.  So it is shown the instance cut off below
    the deepest level its schema looks at: the verdict is the same (nothing
    below that level is inspected) and the repr stays small.
    """
    fast = predicate(event_type)
    if fast is not None and fast(instance):
        return []
    levels = depth(event_type)
    if levels is not None:
        instance = clip(instance, levels)
    return list(iter_errors(event_type, instance))


def is_valid(event_type: str, instance: Any) -> bool:
    fast = predicate(event_type)
    if fast is not None:
        return fast(instance)
    return validator(event_type).is_valid(instance)


def clip(instance: Any, levels: int) -> Any:
    """``instance`` with every container more than ``levels`` below the root emptied.

    Containers keep their type (and objects their keys down to ``levels``),
    so type, required and property checks down to that level see the same thing.
    """
    if isinstance(instance, dict):
        return {k: clip(v, levels - 1) if levels > 0 else _hollow(v) for k, v in instance.items()}
    if isinstance(instance, list):
        return [clip(v, levels - 1) if levels > 0 else _hollow(v) for v in instance]
    return instance


def _hollow(value: Any) -> Any:
    if isinstance(value, dict):
        return {}
    if isinstance(value, list):
        return []
    return value


# --------------------------------------------------------------------------
# the predicate compiler

# Keywords that never affect validity.  `$defs` only matters through `$ref`,
# which is not mirrored (a schema using it falls back to jsonschema).
_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "$defs", "title", "description", "examples", "default"})


def compile_predicate(node: Any) -> Predicate | None:
    """A predicate equal to jsonschema's validity for ``node``, or None if any keyword is not mirrored."""
    if node is True:
        return _always
    if node is False:
        return _never
    if not isinstance(node, dict):
        return None
    checks: list[Predicate] = []
    for keyword, value in node.items():
        if keyword in _ANNOTATIONS:
            continue
        build = _BUILDERS.get(keyword)
        check = build(value) if build is not None else None
        if check is None:
            return None
        checks.append(check)
    return _all_of(checks)


def inspection_depth(node: Any) -> int | None:
    """The deepest level below the instance that ``node`` inspects (for the mirrored keywords), or None."""
    if isinstance(node, bool):
        return 0
    if not isinstance(node, dict):
        return None
    deepest = 0
    for keyword, value in node.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword not in _BUILDERS:
            return None
        if keyword == "properties" and isinstance(value, dict):
            subs, step = list(value.values()), 1
        elif keyword == "anyOf" and isinstance(value, list):
            subs, step = value, 0
        else:
            continue
        for sub in subs:
            below = inspection_depth(sub)
            if below is None:
                return None
            deepest = max(deepest, below + step)
    return deepest


def _always(_: Any) -> bool:
    return True


def _never(_: Any) -> bool:
    return False


def _all_of(checks: list[Predicate]) -> Predicate:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    frozen = tuple(checks)

    def check(instance: Any) -> bool:
        for each in frozen:
            if not each(instance):
                return False
        return True

    return check


# The draft 2020-12 type checker, as jsonschema defines it: bool is not a
# number, and a float with no fraction is an integer.
_TYPE_TESTS: dict[str, Predicate] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": lambda x: not isinstance(x, bool) and isinstance(x, numbers.Number),
    "integer": lambda x: not isinstance(x, bool)
    and (isinstance(x, int) or (isinstance(x, float) and x.is_integer())),
}


def _build_type(value: Any) -> Predicate | None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPE_TESTS for n in names):
        return None
    tests = tuple(_TYPE_TESTS[n] for n in names)
    if len(tests) == 1:
        return tests[0]
    return lambda x: any(t(x) for t in tests)


def _build_required(value: Any) -> Predicate | None:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        return None
    names = tuple(value)
    return lambda x: not isinstance(x, dict) or all(n in x for n in names)


def _build_properties(value: Any) -> Predicate | None:
    if not isinstance(value, dict):
        return None
    compiled: list[tuple[str, Predicate]] = []
    for name, subschema in value.items():
        check = compile_predicate(subschema)
        if check is None:
            return None
        compiled.append((name, check))
    frozen = tuple(compiled)

    def check(instance: Any) -> bool:
        if not isinstance(instance, dict):
            return True
        for name, each in frozen:
            if name in instance and not each(instance[name]):
                return False
        return True

    return check


def _build_const(value: Any) -> Predicate | None:
    # jsonschema's `equal` compares a string with plain ==; other constants
    # need its bool/int and container rules, which are not mirrored.
    if not isinstance(value, str):
        return None
    return lambda x: isinstance(x, str) and x == value


def _build_min_length(value: Any) -> Predicate | None:
    if not _is_count(value):
        return None
    return lambda x: not isinstance(x, str) or len(x) >= value


def _build_max_length(value: Any) -> Predicate | None:
    if not _is_count(value):
        return None
    return lambda x: not isinstance(x, str) or len(x) <= value


def _build_minimum(value: Any) -> Predicate | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = _TYPE_TESTS["number"]
    return lambda x: not number(x) or not x < value


def _build_pattern(value: Any) -> Predicate | None:
    if not isinstance(value, str):
        return None
    regex = compiled(value)  # as jsonschema reads it here: ECMA-262's $
    return lambda x: not isinstance(x, str) or regex.search(x) is not None


def _build_any_of(value: Any) -> Predicate | None:
    if not isinstance(value, list) or not value:
        return None
    compiled = [compile_predicate(sub) for sub in value]
    if any(c is None for c in compiled):
        return None
    frozen = tuple(c for c in compiled if c is not None)
    return lambda x: any(c(x) for c in frozen)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_BUILDERS: dict[str, Callable[[Any], Predicate | None]] = {
    "type": _build_type,
    "required": _build_required,
    "properties": _build_properties,
    "const": _build_const,
    "minLength": _build_min_length,
    "maxLength": _build_max_length,
    "minimum": _build_minimum,
    "pattern": _build_pattern,
    "anyOf": _build_any_of,
}
