"""Severity an agent stamps on an NVIDIA Xid event: the one table in
``hcs_bus.vocabulary`` (``hcs_bus/data/xids.json``), which the healer reads too."""

from __future__ import annotations

from hcs_bus.messages import Severity
from hcs_bus.vocabulary import xid_severity


def severity(code: int) -> Severity:
    return xid_severity(code)
