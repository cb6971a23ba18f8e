"""A JSONPatch (RFC 6902) under construction, with RFC 6901 pointers.

Pointer tokens escape ``~`` as ``~0`` and ``/`` as ``~1``. JSONPatch needs the
parent of every added path to exist, and ``-`` appends only to an existing
array: callers check what the incoming object has and add whole maps/arrays
where it has none.
"""

from __future__ import annotations

from typing import Any


def escape(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape(token) for token in tokens)


class Patch:
    """An ordered list of operations."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []

    def add(self, path: str, value: Any) -> None:
        self.ops.append({"op": "add", "path": path, "value": value})

    def replace(self, path: str, value: Any) -> None:
        self.ops.append({"op": "replace", "path": path, "value": value})

    def set_key(self, parent: str, mapping: Any, key: str, value: Any) -> None:
        """Set ``key`` of the map at ``parent`` (whose current value is ``mapping``),
        creating the map when absent. Nothing when it already holds ``value``."""
        if not isinstance(mapping, dict):
            self.add(parent, {key: value})
        elif mapping.get(key) != value:
            self.add(f"{parent}/{escape(key)}", value)

    def append_all(self, parent: str, array: Any, values: list[Any]) -> None:
        """Append ``values`` to the array at ``parent``, creating it when absent."""
        if not values:
            return
        if not isinstance(array, list):
            self.add(parent, list(values))
            return
        for value in values:
            self.add(f"{parent}/-", value)

    def __bool__(self) -> bool:
        return bool(self.ops)
