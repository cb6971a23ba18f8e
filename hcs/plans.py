"""A plan as ``hcs place`` prints it: every reason once. Pure.

The scheduler explains each class it did not choose, and when it refuses it
also folds those explanations into the plan's reason; many classes share one
reason. So the plan's reason keeps only what is not said per class, and the
classes are listed under their reason instead of the reason under each.
"""

from __future__ import annotations

from msgspec import structs

from hcs_bus.messages import Plan
from scheduler.plan.explanations import render_plan


def render(plan: Plan) -> str:
    reason = _without_per_class(plan)
    lines = [render_plan(structs.replace(plan, reason=reason, rejected=()))]
    groups: dict[str, list[str]] = {}
    for r in plan.rejected:
        groups.setdefault(r.reason, []).append(f"{r.vendor}/{r.model}")
    if groups:
        lines.append("  not chosen:")
    for why, classes in groups.items():
        said = "(the reason above)" if why == reason else why
        lines.append(f"    {', '.join(classes)}: {said}")
    return "\n".join(lines)


def _without_per_class(plan: Plan) -> str:
    """The plan's reason less the per-class explanations listed below it."""
    reason = plan.reason
    pieces = [f"{r.vendor}/{r.model}: {r.reason}" for r in plan.rejected]
    if not pieces or not all(piece in reason for piece in pieces):
        return reason
    for piece in pieces:
        reason = reason.replace(piece, "")
    return reason.strip(" :;,") or plan.reason
