"""The OpenAPI document as the contract, enforced: every request's path
parameters, query and JSON body are checked against its operation in the
document before any handler runs.

Generic over the document: an operation added to openapi.json is checked
as soon as its route exists.  Query and path values arrive as text and are
read as the schema's type (number, integer, boolean) before they are
validated.  A query parameter the operation does not list is refused, as is
one given twice.  A JSON body is parsed and validated (``additionalProperties:
false`` and all); a body of a media type the operation lists that is not
JSON (application/octet-stream) is left to the handler, unread.

Each refusal is a ``BadRequest`` naming the field (``body.questions``,
``query.timeout``, or a part of the address by its name: ``id``): one finding, in the shape of lint's."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from bridge import strictjson
from bridge.agents.errors import BadRequest
from bridge.answers.arrival import parse_time
from bridge.protocol.patterns import Validator

BASE = "urn:askwright:openapi"
# Formats checked: a date-time is what an answers.json's updated is.
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("date-time")(lambda value: not isinstance(value, str) or parse_time(value) is not None)
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


@dataclass
class Parameter:
    name: str
    where: str  # "query" or "path"
    required: bool
    types: tuple[str, ...]
    validator: Any


@dataclass
class Operation:
    method: str
    path: str
    parameters: dict[tuple[str, str], Parameter] = field(default_factory=dict)
    body_required: bool = False
    json_body: Any = None          # the validator of the application/json body, if it has one
    media_types: tuple[str, ...] = ()

    def takes_json(self, content_type: str) -> bool:
        """Whether a body of ``content_type`` is to be read and checked as JSON: a
        JSON operation takes any body as JSON unless it names that other type itself."""
        if self.json_body is None:
            return False
        return content_type.endswith("json") or content_type not in self.media_types


@dataclass
class Checked:
    """What a request carries, as the contract read it."""

    path: dict[str, Any]
    query: dict[str, Any]
    body: Any = None        # the parsed JSON body (None: none, or not JSON)
    raw: bytes | None = None


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


class Contract:
    def __init__(self, document: Mapping[str, Any]):
        self.document = document
        self.registry = Registry().with_resource(BASE, DRAFT202012.create_resource(document))
        self.operations: dict[tuple[str, str], Operation] = {}
        for path, item in document.get("paths", {}).items():
            shared = item.get("parameters", [])
            for method in METHODS:
                if method in item:
                    self.operations[(method.upper(), path)] = self._operation(path, method, item[method], shared)

    def _validator(self, pointer: str) -> Any:
        return Validator({"$ref": f"{BASE}#/{pointer}"}, registry=self.registry, format_checker=FORMATS)

    def _resolve(self, node: Any) -> Any:
        while isinstance(node, dict) and "$ref" in node:
            node = self.registry.resolver(BASE).lookup(node["$ref"]).contents
        return node

    def _operation(self, path: str, method: str, spec: dict[str, Any], shared: list[Any]) -> Operation:
        op = Operation(method.upper(), path)
        listed = [("paths", path, "parameters", str(i), p) for i, p in enumerate(shared)] + \
                 [("paths", path, method, "parameters", str(i), p) for i, p in enumerate(spec.get("parameters", []))]
        for *where, raw in listed:
            param = self._resolve(raw)
            if param.get("in") not in ("query", "path"):
                continue
            schema = self._resolve(param.get("schema", {}))
            kind = schema.get("type", "string")
            types = tuple(kind) if isinstance(kind, list) else (kind,)
            pointer = _pointer(*where) + "/schema" if "$ref" not in raw else None
            validator = self._validator(pointer) if pointer else Validator(
                schema, registry=self.registry, format_checker=FORMATS)
            op.parameters[(param["in"], param["name"])] = Parameter(
                param["name"], param["in"], bool(param.get("required")), types, validator)
        body = self._resolve(spec.get("requestBody")) if spec.get("requestBody") else None
        if body:
            op.body_required = bool(body.get("required"))
            content = body.get("content", {})
            op.media_types = tuple(content)
            for media in content:
                if media.endswith("json"):
                    op.json_body = self._validator(_pointer("paths", path, method, "requestBody", "content", media)
                                                   + "/schema")
                    break
        return op

    def operation(self, method: str, path: str) -> Operation | None:
        return self.operations.get((method.upper(), path))

    # -- checking one request ----------------------------------------------------

    def check_parameters(self, op: Operation, path: Mapping[str, str],
                         query: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """(path values, query values), read as their types; BadRequest naming the first fault."""
        got_path: dict[str, Any] = {}
        for name, text in path.items():
            param = op.parameters.get(("path", name))
            got_path[name] = self._value(param, text, name) if param else text  # an address part: its bare name
        got_query: dict[str, Any] = {}
        for name in query:
            if ("query", name) not in op.parameters:
                raise _refusal(f"query.{name}", "unknown parameter")
            values = query.getall(name) if hasattr(query, "getall") else [query[name]]
            if len(values) > 1:
                raise _refusal(f"query.{name}", "given more than once")
            got_query[name] = self._value(op.parameters[("query", name)], values[0], f"query.{name}")
        for (where, name), param in op.parameters.items():
            if param.required and where == "query" and name not in got_query:
                raise _refusal(f"query.{name}", "required")
        return got_path, got_query

    def _value(self, param: Parameter, text: str, where: str) -> Any:
        value = _typed(text, param.types)
        if value is _WRONG:
            raise _refusal(where, f"must be {' or '.join(param.types)}")
        _raise_first(param.validator, value, where)
        return value

    def check_body(self, op: Operation, raw: bytes) -> Any:
        """The JSON body, parsed and validated; None for an empty optional body."""
        if not raw.strip():
            if op.body_required:
                raise _refusal("body", "required")
            return None
        try:
            value = strictjson.loads(raw, unique_keys=True)
        except strictjson.NotJson as exc:
            raise _refusal("body", str(exc)) from None
        except RecursionError:
            raise _refusal("body", "nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise _refusal("body", f"not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        except ValueError:  # JSON, but an integer of more digits than Python reads
            raise _refusal("body", f"a number has more than {sys.get_int_max_str_digits()} digits, more than "
                                   "can be read") from None
        _raise_first(op.json_body, value, "body")
        return value


_WRONG = object()
# A number as JSON writes one (not Python's 1_000, " 5" or "inf").
_NUMBER = re.compile(r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$")
_INTEGER = re.compile(r"^-?(0|[1-9][0-9]*)$")


def _typed(text: str, types: tuple[str, ...]) -> Any:
    for kind in types:
        if kind == "string":
            return text
        if kind == "number" and _NUMBER.fullmatch(text):
            number = float(text)
            if math.isfinite(number):
                return int(text) if _INTEGER.fullmatch(text) else number
        elif kind == "integer" and _INTEGER.fullmatch(text):
            return int(text)
        elif kind == "boolean" and text in ("true", "false"):
            return text == "true"
    return _WRONG


def _raise_first(validator: Any, value: Any, where: str) -> None:
    try:
        error = best_match(validator.iter_errors(value))
    except RecursionError:
        raise _refusal(where, "nested too deeply") from None
    if error is not None:
        raise _refusal(*_described(error, where))


def _described(error: ValidationError, root: str) -> tuple[str, str]:
    """(where, what) of a schema error: the field at fault named as an agent wrote it."""
    path = [root, *(str(p) for p in error.absolute_path)]
    instance, schema = error.instance, error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = set(schema.get("properties", {}))
        extra = sorted(k for k in instance if k not in known)
        if extra:
            return ".".join([*path, extra[0]]), "unknown field"
    if error.validator == "required" and isinstance(instance, dict):
        missing = [k for k in error.validator_value if k not in instance]
        if missing:
            return ".".join([*path, missing[0]]), "required"
    if error.validator == "type":
        return ".".join(path), f"must be {_kinds(error.validator_value)}, not {_kind_of(instance)}"
    if error.validator in _COUNTED and isinstance(instance, (list, str, dict)):
        return ".".join(path), _COUNTED[error.validator].format(limit=error.validator_value, given=len(instance))
    message, shown = error.message, repr(instance)
    if message.startswith(shown) and len(shown) > _SHOWN:
        # The schema's words quote the value first, and the limit of a
        # message's length would cut the reason off after it.
        message = f"the {_kind_of(instance)}{message[len(shown):]}"
    return ".".join(path), message


# The size limits in words that say the limit (the schema's say "is too long").
_COUNTED = {
    "maxItems": "at most {limit} items, not {given}", "minItems": "at least {limit} items, not {given}",
    "maxLength": "at most {limit} characters, not {given}", "minLength": "at least {limit} characters, not {given}",
    "maxProperties": "at most {limit} fields, not {given}", "minProperties": "at least {limit} fields, not {given}",
}
_SHOWN = 60


def _kinds(value: Any) -> str:
    return " or ".join(value) if isinstance(value, list) else str(value)


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _refusal(where: str, message: str) -> BadRequest:
    if len(message) > 200:  # a schema message quotes the value, which may be megabytes
        message = message[:197] + "..."
    return BadRequest(f"{where}: {message}", findings=[{"where": where, "message": message}])
