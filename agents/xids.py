"""Severity of NVIDIA Xid codes: one table, shared with the kernel probes
(``agents/probes/xid_severity.json``, after NVIDIA's Xid catalogue)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from hcs_bus.messages import Severity

_TABLE = Path(__file__).parent / "probes" / "xid_severity.json"
_FALLBACK = {
    "default": "warning",
    "fatal": [48, 63, 64, 74, 79, 92, 94, 95, 119, 120],
    "info": [13, 31, 43, 45, 68],
}


@cache
def _table() -> dict[int, Severity]:
    try:
        raw = json.loads(_TABLE.read_text())
    except (OSError, ValueError):
        raw = _FALLBACK
    out: dict[int, Severity] = {}
    for severity in ("fatal", "critical", "info"):
        for code in raw.get(severity, []):
            out[int(code)] = severity  # type: ignore[assignment]
    return out


def severity(code: int) -> Severity:
    return _table().get(code, "warning")
