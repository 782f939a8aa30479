"""matrix-nio without PostgreSQL's driver.

nio keeps its keys through peewee, and peewee probes at import for every
database driver it knows; psycopg, which the bridge installs for its own
PostgreSQL store, is found and loaded whole: about 0.15 s of every start,
for a driver nio never uses.  So peewee is imported with psycopg hidden
(peewee then simply has no PostgreSQL support); psycopg itself is imported
normally by whatever needs it, before or after.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any


class _PeeweeWithoutPsycopg(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> Any:
        if name != "peewee":
            return None
        sys.meta_path.remove(self)  # once: the real finders take it from here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or "psycopg" in sys.modules:
            return spec
        exec_module = spec.loader.exec_module

        def without_psycopg(module: ModuleType) -> None:
            sys.modules["psycopg"] = None  # type: ignore[assignment]  # "import psycopg" raises ImportError
            try:
                exec_module(module)
            finally:
                if sys.modules.get("psycopg", 0) is None:
                    del sys.modules["psycopg"]

        spec.loader.exec_module = without_psycopg  # type: ignore[method-assign]
        return spec


def install() -> None:
    if "peewee" not in sys.modules and not any(isinstance(f, _PeeweeWithoutPsycopg) for f in sys.meta_path):
        sys.meta_path.insert(0, _PeeweeWithoutPsycopg())
