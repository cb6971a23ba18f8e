"""A plan as text for people (``hcs place``). Pure."""

from __future__ import annotations

from hcs_bus.messages import Plan
from hcs_bus.units import format_mib


def render_plan(plan: Plan) -> str:
    """What was decided, why, and why every other class was not."""
    lines: list[str] = []
    if plan.ok:
        kind = "whole device" if plan.whole_device else "slice"
        lines.append(
            f"PLAN  {plan.devices} × {plan.vendor}/{plan.model} ({kind}), "
            f"{format_mib(plan.vram_mib_per_device)} VRAM per device, "
            f"{plan.acu_per_device:g} ACU per device, runtime {plan.runtime_profile}"
        )
    else:
        lines.append("REFUSED")
    if plan.reason:
        lines.append(f"  why: {plan.reason}")
    if plan.substituted_from:
        lines.append(f"  substituted for: {plan.substituted_from}")
    if plan.offer is not None:
        o = plan.offer
        lines.append(
            f"  offer: {o.devices} × {o.vendor}/{o.model}, {format_mib(o.vram_mib_per_device)}"
            f" each — {o.arithmetic}"
        )
    lines.append(_quota(plan))
    if plan.rejected:
        lines.append("  not chosen:")
        lines.extend(f"    {r.vendor}/{r.model}: {r.reason}" for r in plan.rejected)
    return "\n".join(lines)


def _quota(plan: Plan) -> str:
    q = plan.quota
    if q.vram_mib_hard is None and q.acu_hard is None:
        used = f"{format_mib(q.vram_mib_used)}, {q.acu_used:g} ACU"
        return f"  quota: none set (namespace uses {used})"
    vram = (
        f"{format_mib(q.vram_mib_used)} of {format_mib(q.vram_mib_hard)}"
        if (q.vram_mib_hard is not None)
        else f"{format_mib(q.vram_mib_used)} (no limit)"
    )
    acu = (
        f"{q.acu_used:g} of {q.acu_hard:g} ACU"
        if q.acu_hard is not None
        else (f"{q.acu_used:g} ACU (no limit)")
    )
    state = "ok" if q.ok else f"EXCEEDED — {q.reason}"
    return f"  quota: {state}; VRAM {vram}; {acu}"
