"""Which event sources to run (pure): decided from the eBPF loader's status.

- loader missing or failed to load (no CAP_BPF, old kernel, no BTF):
  /dev/kmsg + sysfs AER polling;
- loaded but ``ras:aer_event`` missing (no PCIe AER in this kernel):
  eBPF for log lines + sysfs AER polling;
- loaded but ``printk:console`` missing: eBPF for AER + /dev/kmsg;
- everything attached: eBPF only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

AER_TRACEPOINT = "ras:aer_event"
CONSOLE_TRACEPOINT = "printk:console"


@dataclass(frozen=True)
class LoaderStatus:
    """What hcs-probe reported on stderr before serving events."""

    ready: bool
    attached: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourcePlan:
    ebpf: bool
    kmsg: bool
    sysfs_aer: bool
    reason: str


def parse_status_line(line: bytes | str) -> dict[str, Any] | None:
    """A stderr status object of hcs-probe, or None for any other line."""
    try:
        obj = msgspec.json.decode(line.strip())
    except msgspec.DecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("status"), str) else None


def _names(obj: dict[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key)
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def status_from_ready(obj: dict[str, Any], *, errors: tuple[str, ...] = ()) -> LoaderStatus:
    return LoaderStatus(
        ready=True,
        attached=_names(obj, "attached"),
        missing=_names(obj, "missing"),
        failed=_names(obj, "failed"),
        errors=errors,
    )


def describe_error(obj: dict[str, Any]) -> str:
    return f"{obj.get('stage', '?')}: {obj.get('error', '?')} ({obj.get('strerror', '')})"


def plan_sources(status: LoaderStatus | None) -> SourcePlan:
    """The fallback decision; see the module docstring."""
    if status is None or not status.ready or not status.attached:
        why = "; ".join(status.errors) if status and status.errors else "not started"
        return SourcePlan(
            ebpf=False,
            kmsg=True,
            sysfs_aer=True,
            reason=f"eBPF loader unavailable ({why}): /dev/kmsg + sysfs AER",
        )
    logs = CONSOLE_TRACEPOINT in status.attached
    aer = AER_TRACEPOINT in status.attached
    reasons = [
        f"{tp} {'missing' if tp in status.missing else 'not attached'}"
        for tp, ok in ((CONSOLE_TRACEPOINT, logs), (AER_TRACEPOINT, aer))
        if not ok
    ]
    fallbacks = [
        name for name, needed in (("/dev/kmsg", not logs), ("sysfs AER", not aer)) if needed
    ]
    reason = "eBPF" + (f" + {' + '.join(fallbacks)} ({'; '.join(reasons)})" if fallbacks else "")
    return SourcePlan(ebpf=True, kmsg=not logs, sysfs_aer=not aer, reason=reason)
