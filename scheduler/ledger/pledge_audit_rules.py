"""Pledges (``scheduler.ledger.pledge_rules``) against the pods, for ``hcs check``. Pure:
pledge documents and API JSON in, ``ledger.Problem`` lines out; no I/O, no
clock (``now`` is passed in, in the pledges' own time: Unix seconds).

What a healthy ledger never shows, once its sweeps had time to run:

* a pod whose ``hcs.io/pledge`` names a pledge made for another pod or spent
  by another pod (a copied plan note that got through);
* a pod bound to a node while its pledge is neither spent nor carried by a
  reservation (bind spends it before it reserves under a quota; without one
  the reservation carrying its id retires it);
* a spent pledge whose pod is gone, ``grace_s`` after it was spent (deleting
  the pod releases its pledge and its reservation);
* an unspent pledge older than the pledge TTL, or one no pod carries for
  longer than the orphan window (the sweep drops both);
* two pledges spent by one pod.

The sweep runs every few seconds, so the windows are given ``slack_s``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.ledger import audit_rules as ledger
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.audit_rules import Problem
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge, pledge_of

Pods = Mapping[tuple[str, str], Mapping[str, Any]]  # (namespace, name) → pod


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a pledge may look wrong before it is reported (seconds)."""

    ttl_s: float = 600.0  # ``SchedulerSettings.pledge_ttl_s``
    grace_s: float = 60.0  # a spent pledge whose pod is gone
    orphan_after_s: float = 30.0  # ``Pledger.orphan_after_s``
    slack_s: float = 10.0  # the sweep's period and a write on its way


def problems(
    *,
    docs: Mapping[str, NamespacePledges],
    pods_now: Iterable[Mapping[str, Any]],
    now: float,
    limits: Limits,
    reserved: Iterable[str] = (),
) -> list[Problem]:
    """Every pledge that disagrees with the pods (``docs``: namespace →
    its pledges, from both storage forms; ``reserved``: the pledge ids the
    ledger's reservations carry)."""
    live = {(r.namespace, r.name): p for p in pods_now if (r := ledger.ref_of(p)).name}
    held = frozenset(reserved)
    out = _carried(docs, live, reserved=held)
    out += _unspent(docs, live, now=now, limits=limits, reserved=held)
    out += _spent_by_gone(docs, live, now=now, limits=limits)
    out += _spent_twice(docs, live)
    return out


def _carried(
    docs: Mapping[str, NamespacePledges], live: Pods, *, reserved: frozenset[str]
) -> list[Problem]:
    """Pods carrying a pledge that is not theirs, and bound pods whose pledge
    is unspent and carried by no reservation."""
    out: list[Problem] = []
    for (ns, name), pod in sorted(live.items()):
        pid = pledge_of(pod)
        if not pid:
            continue
        ref = ledger.ref_of(pod)
        verdict = pledges.spend_verdict(docs.get(ns), pid, ref=ref)
        node = ledger.node_of(pod) or ""
        found, who = verdict.pledge, f"{ns}/{name}"
        if verdict.outcome == "used" and found is not None:
            why = f"pledge {pid} was spent by pod {ns}/{found.pod} (uid {found.uid or '?'})"
        elif verdict.outcome == "foreign" and found is not None:
            why = f"pledge {pid} was made for pod {ns}/{found.made_for}"
        elif verdict.outcome == "spend" and node and pid not in reserved:
            why = f"pledge {pid} is unspent and no reservation carries it"
            out.append(Problem("bound pod with unspent pledge", node, why, who, pid))
            continue
        else:
            continue
        out.append(Problem("pledge of another pod", node, why + " (a copied plan note)", who, pid))
    return out


def _unspent(
    docs: Mapping[str, NamespacePledges],
    live: Pods,
    *,
    now: float,
    limits: Limits,
    reserved: frozenset[str],
) -> list[Problem]:
    """Unspent pledges the sweep should have dropped (``pledges.sweep`` and
    ``pledges.orphans``, given the slack): past the TTL, or carried by no pod
    past the orphan window."""
    out: list[Problem] = []
    for ns, doc in sorted(docs.items()):
        carried = [pledge_of(p) for (pod_ns, _), p in live.items() if pod_ns == ns]
        ttl_s, orphan_s = limits.ttl_s + limits.slack_s, limits.orphan_after_s + limits.slack_s
        expired, _done = pledges.sweep(doc, now=now, ttl_s=ttl_s, grace_s=ttl_s, reserved=reserved)
        for p in expired:
            why = (
                f"pledge {p.id} unspent for {now - p.time_s:.0f} s, past the pledge TTL of "
                f"{limits.ttl_s:g} s"
            )
            out.append(Problem("expired pledge", "", why, f"{ns}/{p.made_for}", p.id))
        gone = {p.id for p in expired}
        for p in pledges.orphans(doc, referenced=carried, now=now, after_s=orphan_s):
            if p.id in gone:
                continue
            why = (
                f"pledge {p.id} unspent for {now - p.time_s:.0f} s and carried by no pod"
                f" (orphans are dropped after {limits.orphan_after_s:g} s)"
            )
            out.append(Problem("orphaned pledge", "", why, f"{ns}/{p.made_for}", p.id))
    return out


def _spent_by_gone(
    docs: Mapping[str, NamespacePledges], live: Pods, *, now: float, limits: Limits
) -> list[Problem]:
    """Spent pledges whose pod is gone (deleted or replaced) past the grace."""
    uids = {ledger.ref_of(p).uid for p in live.values()} - {""}
    out: list[Problem] = []
    for ns, doc in sorted(docs.items()):
        for p in doc.pledges:
            if p.spent_s is None or now - p.spent_s <= limits.grace_s:
                continue
            alive = p.uid in uids if p.uid else (ns, p.pod) in live
            if alive:
                continue
            why = (
                f"pledge {p.id} spent {now - p.spent_s:.0f} s ago by a pod that is gone"
                f" (uid {p.uid or '?'}); it and the pod's reservation should have been released"
            )
            out.append(Problem("spent pledge without pod", "", why, f"{ns}/{p.pod}", p.id))
    return out


def _spent_twice(docs: Mapping[str, NamespacePledges], live: Pods) -> list[Problem]:
    """Pods (by uid) that spent more than one pledge."""
    by_uid: dict[tuple[str, str], list[Pledge]] = {}
    for ns, doc in docs.items():
        for p in doc.pledges:
            if p.spent_s is not None and p.uid:
                by_uid.setdefault((ns, p.uid), []).append(p)
    out: list[Problem] = []
    for (ns, uid), spent in sorted(by_uid.items()):
        if len(spent) < 2:
            continue
        ids = ",".join(sorted(p.id for p in spent))
        name = spent[0].pod
        pod = live.get((ns, name))
        node = (ledger.node_of(pod) or "") if pod is not None else ""
        why = f"pledges {ids} were all spent by uid {uid}; a pledge is spent once per pod"
        out.append(Problem("pod spent two pledges", node, why, f"{ns}/{name}", ids))
    return out
