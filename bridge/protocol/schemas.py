"""The Matrix event schemas under ``schemas/matrix``, each compiled once.

A schema is read from the package data the first time it is asked for and the
compiled validator is kept for the life of the process: the judge runs for
every incoming event, so compiling per call would dominate its cost.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from bridge.resources import schema_path

QUESTION = "dev.superpipeline.question.v2"
ANSWER = "dev.superpipeline.question.answer.v2"
OUTCOME = "dev.superpipeline.question.outcome.v1"


class SchemaMissing(LookupError):
    """No schema of that event type ships with this installation."""


@functools.cache
def schema(event_type: str) -> dict[str, Any]:
    """The schema document of ``event_type``, checked against draft 2020-12."""
    path = schema_path(event_type)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SchemaMissing(f"no schema for {event_type!r} in this installation") from None
    document = json.loads(text)
    # A broken schema is a packaging bug: fail loudly at first use rather
    # than judge every event against something meaningless.
    Draft202012Validator.check_schema(document)
    return document


@functools.cache
def validator(event_type: str) -> Draft202012Validator:
    """The compiled validator of ``event_type`` (one per process)."""
    return Draft202012Validator(schema(event_type))


def iter_errors(event_type: str, instance: Any) -> Iterator[ValidationError]:
    """Every way ``instance`` breaks the schema of ``event_type``."""
    return validator(event_type).iter_errors(instance)


def errors(event_type: str, instance: Any) -> list[ValidationError]:
    """All errors at once, so callers run the schema exactly once per event."""
    return list(iter_errors(event_type, instance))


def is_valid(event_type: str, instance: Any) -> bool:
    return validator(event_type).is_valid(instance)
