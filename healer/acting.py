"""Applying the healer's decisions to Kubernetes (through ``hcs_bus.kube`` only).

* Taint ``hcs.io/unhealthy`` by read-modify-write of the node's whole taint
  list (``Kube.update_node_taints``), never clobbering other taints; remove
  only ours on recovery.
* Node condition ``HCSHealthy`` (True/False, reason, message) by strategic merge;
  ``lastTransitionTime`` moves only when the status changes (the actor keeps the
  status and transition time it last applied, or adopted from the Node when a
  new leader took over), ``lastHeartbeatTime`` on every patch.
* Evictions through the Eviction API: a PodDisruptionBudget refusal (429) is
  retried in the background with backoff until allowed or the pod is gone.
* Dry run (or no cluster): nothing is applied; every action is published as a
  HealthEvent ``kind="action"`` with ``dry_run`` in its evidence.

API errors are retried with backoff and logged; they never crash the healer.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

from hcs_bus import subjects, tasks, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.errors import (
    HcsError,
    KubeConflict,
    KubeError,
    KubeInvalid,
    KubeNotFound,
    KubeTooManyRequests,
)
from hcs_bus.kube import Kube
from hcs_bus.messages import HealthEvent
from hcs_bus.telemetry import logger, meter
from healer.bindings import Binding

TAINT_KEY = vocabulary.UNHEALTHY_TAINT
CONDITION = "HCSHealthy"

_log = logger("hcs.healer.acting")
_meter = meter("hcs.healer")
ACTIONS = _meter.create_counter("hcs_healer_actions", description="actions applied or dry-run")

Taints = list[dict[str, Any]]


def with_taint(taints: Taints, *, effect: str, value: str, now_iso: str) -> Taints:
    """Our taint set to ``effect``/``value``; every other taint kept as it was."""
    others = [t for t in taints if t.get("key") != TAINT_KEY]
    ours = [t for t in taints if t.get("key") == TAINT_KEY]
    if len(ours) == 1 and ours[0].get("effect") == effect and ours[0].get("value") == value:
        return taints
    taint: dict[str, Any] = {"key": TAINT_KEY, "value": value, "effect": effect}
    if effect == "NoExecute":
        taint["timeAdded"] = now_iso
    return [*others, taint]


def without_taint(taints: Taints) -> Taints:
    return [t for t in taints if t.get("key") != TAINT_KEY]


def taint_value(reason: str) -> str:
    """A label-value-safe summary of a reason (taint values are ≤ 63 chars)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in reason.lower())
    return cleaned.strip("-_.")[:63].strip("-_.") or "unhealthy"


def our_taint(node: dict[str, Any]) -> dict[str, Any] | None:
    """Our ``hcs.io/unhealthy`` taint on a Node object, if it carries one."""
    taints = (node.get("spec") or {}).get("taints") or []
    return next((t for t in taints if t.get("key") == TAINT_KEY), None)


def our_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    """The ``HCSHealthy`` condition on a Node object, if it carries one."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == CONDITION), None)


def transition_time(previous: tuple[str, str] | None, *, status: str, now_iso: str) -> str:
    """The condition's lastTransitionTime: kept while the status stays the same."""
    if previous is not None and previous[0] == status and previous[1]:
        return previous[1]
    return now_iso


def _now_iso() -> str:
    # A wire timestamp for Kubernetes objects, not a decision input.
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Actor:
    """Applies (or, in dry run, announces) taints, conditions and evictions."""

    def __init__(
        self,
        *,
        bus: Bus,
        kube: Kube | None,
        dry_run: bool,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        attempts: int = 6,
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.dry_run = dry_run or kube is None
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.attempts = attempts
        self.evicted: list[str] = []
        self.conditions: dict[str, tuple[str, str]] = {}  # node → (status, lastTransitionTime)
        self._evictions: dict[str, asyncio.Task[None]] = {}
        self._seq = 0

    async def taint(self, node: str, *, effect: str, reason: str, pods: list[str]) -> bool:
        """Set our taint; False when the API never accepted it (the caller retries later)."""
        value = taint_value(reason)
        if self.dry_run:
            await self._announce(
                node,
                action="taint",
                taint=f"{TAINT_KEY}={value}:{effect}",
                pods=pods,
                reason=reason,
            )
            return True
        kube = self._kube()
        stamp = _now_iso()
        if not await self._retrying(
            f"taint {node}",
            lambda: kube.update_node_taints(
                node, lambda ts: with_taint(ts, effect=effect, value=value, now_iso=stamp)
            ),
        ):
            return False
        await self._condition(node, healthy=False, reason=_camel(value), message=reason)
        ACTIONS.add(1, {"action": "taint", "effect": effect})
        _log.info("node_tainted", node=node, effect=effect, reason=reason)
        return True

    async def untaint(self, node: str, *, reason: str) -> bool:
        """Remove our taint; False when the API never accepted it (the caller retries later)."""
        if self.dry_run:
            await self._announce(node, action="untaint", taint=TAINT_KEY, pods=[], reason=reason)
            return True
        kube = self._kube()
        if not await self._retrying(
            f"untaint {node}", lambda: kube.update_node_taints(node, without_taint)
        ):
            return False
        await self._condition(node, healthy=True, reason="Healthy", message=reason)
        ACTIONS.add(1, {"action": "untaint"})
        _log.info("node_untainted", node=node, reason=reason)
        return True

    async def evict(self, pods: list[Binding], *, reason: str) -> None:
        """Evict each pod; a PDB refusal keeps retrying in the background."""
        if not pods:
            return
        if self.dry_run:
            await self._announce(
                pods[0].node, action="evict", taint="", pods=[p.key for p in pods], reason=reason
            )
            return
        for pod in pods:
            if pod.key in self._evictions and not self._evictions[pod.key].done():
                continue
            self._evictions[pod.key] = tasks.start(
                self._evict_until_allowed(pod, reason=reason), name=f"evict:{pod.key}"
            )

    async def wait_evictions(self) -> None:
        await asyncio.gather(*self._evictions.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop acting (leadership lost): what we applied is read again next term."""
        await tasks.stop(*self._evictions.values())
        self.conditions.clear()

    def adopt_condition(self, node: str, condition: dict[str, Any]) -> None:
        """Remember a condition found on the Node (set by a previous leader), unless
        this actor applied one itself since."""
        status = str(condition.get("status") or "")
        stamp = str(condition.get("lastTransitionTime") or "")
        self.conditions.setdefault(node, (status, stamp))

    async def _evict_until_allowed(self, pod: Binding, *, reason: str) -> None:
        kube = self._kube()
        delay = self.retry_initial_s
        while True:
            try:
                await kube.evict_pod(pod.namespace, pod.name, uid=pod.uid or None)
            except KubeNotFound:
                _log.info("evict_gone", pod=pod.key)
                return
            except KubeConflict:  # the uid precondition: a same-named replacement now
                _log.info("evict_replaced", pod=pod.key, uid=pod.uid)
                return
            except KubeTooManyRequests:
                _log.info("evict_refused_by_pdb", pod=pod.key, retry_s=delay)
            except KubeError as exc:
                _log.warning("evict_failed", pod=pod.key, error=str(exc), retry_s=delay)
            else:
                self.evicted.append(pod.key)
                ACTIONS.add(1, {"action": "evict"})
                _log.info("pod_evicted", pod=pod.key, node=pod.node, reason=reason)
                return
            await asyncio.sleep(delay * (1 + 0.2 * random.random()))
            delay = min(delay * 2, self.retry_max_s)

    async def _condition(self, node: str, *, healthy: bool, reason: str, message: str) -> None:
        kube = self._kube()
        stamp = _now_iso()
        status = "True" if healthy else "False"
        since = transition_time(self.conditions.get(node), status=status, now_iso=stamp)
        condition = {
            "type": CONDITION,
            "status": status,
            "reason": reason,
            "message": message[:1000],
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": since,
        }
        if await self._retrying(
            f"condition {node}", lambda: kube.patch_node_condition(node, condition)
        ):
            self.conditions[node] = (status, since)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Any]]) -> bool:
        """Run an API call with backoff; False (logged) when it never succeeded."""
        delay = self.retry_initial_s
        for attempt in range(1, self.attempts + 1):
            try:
                await call()
                return True
            except (KubeNotFound, KubeInvalid) as exc:
                _log.error("kube_action_refused", what=what, error=str(exc))
                return False
            except (TimeoutError, HcsError, OSError) as exc:
                _log.warning("kube_action_retry", what=what, attempt=attempt, error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)
        _log.error("kube_action_gave_up", what=what, attempts=self.attempts)
        return False

    async def _announce(
        self, node: str, *, action: str, taint: str, pods: list[str], reason: str
    ) -> None:
        self._seq += 1
        event = HealthEvent(
            node=node,
            kind="action",
            severity="info",
            source="healer",
            time_s=_wall(),
            evidence={
                "action": action,
                "taint": taint,
                "pods": ",".join(pods),
                "dry_run": True,
                "reason": reason[:500],
            },
            message=_announced(action, node=node, pods=pods, no_cluster=self.kube is None),
        )
        ACTIONS.add(1, {"action": action, "dry_run": "true"})
        _log.info("dry_run_action", node=node, action=action, taint=taint, pods=pods)
        try:
            await self.bus.publish(
                subjects.healer_health(node),
                event,
                msg_id=f"healer:action:{node}:{action}:{_wall()}:{self._seq}",
            )
        except HcsError as exc:
            _log.warning("dry_run_publish_failed", node=node, error=str(exc))

    def _kube(self) -> Kube:
        assert self.kube is not None, "no cluster: the actor runs in dry run"
        return self.kube


def _announced(action: str, *, node: str, pods: list[str], no_cluster: bool) -> str:
    """What an action not applied here says: a dry run the operator chose
    ("would"), or no cluster at all (a stand-in, such as ``hcs up``'s demo,
    may carry it out)."""
    what = f"{action} {', '.join(pods)} on {node}" if pods else f"{action} {node}"
    if no_cluster:
        return f"{what} (no cluster here: announced for whoever runs the pods)"
    return f"dry run: would {what} (not applied)"


def _camel(value: str) -> str:
    """A condition reason (``^[A-Za-z][A-Za-z0-9_,:]*$``) from a taint value."""
    parts = re.split(r"[^A-Za-z0-9]+", value)
    camel = "".join(p[:1].upper() + p[1:] for p in parts if p)
    return camel if camel[:1].isalpha() else f"Unhealthy{camel}"


def _wall() -> float:
    # Producer timestamp on an outgoing event (messages carry Unix seconds), not a decision.
    return datetime.datetime.now(datetime.UTC).timestamp()
