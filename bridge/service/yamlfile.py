"""YAML as an operator's file is read: a key written twice in one mapping is
refused, not silently taken as its last value (two ``rooms:`` sections, the
first one's ``sets`` lost without a word)."""

from __future__ import annotations

from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"  # ``<<: *defaults``: its keys may be overridden, that is its point


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _value in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                continue
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is written twice in one mapping (first at line "
                                f"{first.start_mark.line + 1}); keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``text`` read as yaml.safe_load reads it, a key written twice refused (``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
