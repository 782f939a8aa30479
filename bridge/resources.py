"""Where the run-time data (schemas, bundled examples) is found.

In a wheel the data sits inside the package (``bridge/_data``); in a source
checkout it sits at the top of the repository.  Both layouts are tried so the
same code runs from either.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled data folder {name!r} is missing from this installation")


def schema_path(event_type: str) -> Path:
    return data_dir("schemas") / "matrix" / f"{event_type}.json"


def examples_dir() -> Path:
    return data_dir("examples")
