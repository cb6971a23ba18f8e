"""Pledges (``scheduler.pledges``) against the pods, for ``hcs check``. Pure:
pledge documents and API JSON in, ``ledger.Problem`` lines out; no I/O, no
clock (``now`` is passed in, in the pledges' own time: Unix seconds).

What a healthy ledger never shows, once its sweeps had time to run:

* a pod whose ``hcs.io/pledge`` names a pledge made for another pod or spent
  by another pod (a copied plan note that got through);
* a pod bound to a node while its pledge is still unspent (bind spends it
  before it reserves);
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

from hcs_bus import vocabulary
from scheduler import ledger, pledges
from scheduler.ledger import Problem
from scheduler.pledges import NamespacePledges, Pledge

Pods = Mapping[tuple[str, str], Mapping[str, Any]]  # (namespace, name) → pod


@dataclass(frozen=True, slots=True)
class Limits:
    """How long a pledge may look wrong before it is reported (seconds)."""

    ttl_s: float = 600.0  # ``SchedulerSettings.pledge_ttl_s``
    grace_s: float = 60.0  # a spent pledge whose pod is gone
    orphan_after_s: float = 30.0  # ``Pledger.orphan_after_s``
    slack_s: float = 10.0  # the sweep's period and a write on its way


def pledge_of(pod: Mapping[str, Any]) -> str:
    """The pledge id a pod carries (``hcs.io/pledge``), "" for none."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(vocabulary.PLEDGE) or "")


def problems(
    *,
    docs: Mapping[str, NamespacePledges],
    pods_now: Iterable[Mapping[str, Any]],
    now: float,
    limits: Limits,
) -> list[Problem]:
    """Every pledge that disagrees with the pods (``docs``: namespace →
    its pledges, from both storage forms)."""
    live = {(r.namespace, r.name): p for p in pods_now if (r := ledger.ref_of(p)).name}
    out = _carried(docs, live)
    out += _unspent(docs, live, now=now, limits=limits)
    out += _spent_by_gone(docs, live, now=now, limits=limits)
    out += _spent_twice(docs, live)
    return out


def _carried(docs: Mapping[str, NamespacePledges], live: Pods) -> list[Problem]:
    """Pods carrying a pledge that is not theirs, and bound pods whose pledge
    is unspent."""
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
            why = f"pledge {pid} was made for pod {ns}/{_made_for(found)}"
        elif verdict.outcome == "spend" and node:
            why = f"pledge {pid} is unspent; bind spends it before it reserves"
            out.append(Problem("bound pod with unspent pledge", node, why, who, pid))
            continue
        else:
            continue
        out.append(Problem("pledge of another pod", node, why + " (a copied plan note)", who, pid))
    return out


def _unspent(
    docs: Mapping[str, NamespacePledges], live: Pods, *, now: float, limits: Limits
) -> list[Problem]:
    """Unspent pledges the sweep should have dropped: past the TTL, or
    carried by no pod past the orphan window."""
    carried = {(ns, pledge_of(p)) for (ns, _), p in live.items()}
    out: list[Problem] = []
    for ns, doc in sorted(docs.items()):
        for p in doc.pledges:
            if p.spent_s is not None:
                continue
            age = now - p.time_s
            who = f"{ns}/{_made_for(p)}"
            if age > limits.ttl_s + limits.slack_s:
                why = f"pledge {p.id} unspent for {age:.0f} s, past the pledge TTL of {limits.ttl_s:g} s"
                out.append(Problem("expired pledge", "", why, who, p.id))
            elif age > limits.orphan_after_s + limits.slack_s and (ns, p.id) not in carried:
                why = (
                    f"pledge {p.id} unspent for {age:.0f} s and carried by no pod"
                    f" (orphans are dropped after {limits.orphan_after_s:g} s)"
                )
                out.append(Problem("orphaned pledge", "", why, who, p.id))
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


def _made_for(p: Pledge) -> str:
    return p.name or (p.generate_name + "*" if p.generate_name else "?")
