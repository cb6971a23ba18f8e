"""What ``streams.init`` would change in a stream's configuration. Pure.

Configurations are compared in the server's wire form (``as_dict()``:
durations in nanoseconds, enums as their strings), field by field, over the
fields HCS sets; fields the server adds with its defaults are not ours.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

_NANOS = frozenset({"max_age", "duplicate_window"})
_UNSET: tuple[Any, ...] = (
    None,
    False,
    -1,
    0,
    "",
    [],
    {},
)  # what a server may leave out of its echo


def changes(*, want: Mapping[str, Any], have: Mapping[str, Any]) -> list[str]:
    """Each field of ``want`` that ``have`` holds otherwise, as ``field old → new``."""
    found = []
    for field, wanted in want.items():
        new = _plain(wanted)
        if new is None:
            continue
        if field not in have:
            if new in _UNSET:
                continue
            old = None
        else:
            old = _plain(have[field])
        if old != new:
            found.append(f"{field} {_show(field, old)} → {_show(field, new)}")
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _show(field: str, value: Any) -> str:
    if value is None:
        return "unset"
    if field in _NANOS and isinstance(value, int | float):
        return f"{value / 1e9:g}s"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
