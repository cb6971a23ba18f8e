"""Who a bus message is from: the subject (and the NATS user allowed to
publish on it), never the body.

Each agent may publish only its own ``hcs.fp.<node>`` and
``hcs.health.<node>``; only the healer may publish
``hcs.health._healer_<node>``, and only the scheduler ``hcs.alloc.<node>``
(``hcs_bus.permissions``). So the subject says which node a fingerprint,
health event or allocation event is about and whether it is the healer's. ``refusal`` holds a decoded message against its subject; the
consumers (``hcs_bus.consuming``) dead-letter a refused one with the reason
and never hand it on, and core subscribers (``hcs top``, the demo) skip it.
"""

from __future__ import annotations

from hcs_bus import subjects
from hcs_bus.messages import AllocationEvent, HealthEvent, NodeFingerprint


def refusal(subject: str, value: object) -> str:
    """Why ``value`` must not be believed when it came on ``subject``; "" when it may."""
    if isinstance(value, NodeFingerprint):
        return _fingerprint(subject, value)
    if isinstance(value, HealthEvent):
        return _health(subject, value)
    if isinstance(value, AllocationEvent):
        return _allocation(subject, value)
    return ""


def _allocation(subject: str, event: AllocationEvent) -> str:
    if not subject.startswith(subjects.ALLOC_PREFIX):
        return f"allocation event on {subject!r}, not on hcs.alloc.<node>"
    return _same_node(subject, event.node, what="allocation event")


def _fingerprint(subject: str, fp: NodeFingerprint) -> str:
    if not subject.startswith(subjects.FP_PREFIX):
        return f"fingerprint on {subject!r}, not on hcs.fp.<node>"
    return _same_node(subject, fp.node, what="fingerprint")


def _health(subject: str, event: HealthEvent) -> str:
    if not subject.startswith(subjects.HEALTH_PREFIX):
        return f"health event on {subject!r}, not on hcs.health.<node>"
    from_healer = subjects.is_healer_health(subject)
    if event.source == "healer" and not from_healer:
        return f"forged verdict: source healer on {subject!r}, which is not the healer's subject"
    if from_healer and event.source != "healer":
        return f"source {event.source!r} on the healer's subject {subject!r}"
    return _same_node(subject, event.node, what="health event")


def _same_node(subject: str, node: str, *, what: str) -> str:
    try:
        named = subjects.node_of(subject)
    except subjects.SubjectError as exc:
        return f"{what} on {subject!r}: {exc}"
    if node != named:
        return f"{what} body names node {node[:100]!r} but came on {named!r}'s subject"
    return ""
