"""Leader election through a coordination.k8s.io/v1 Lease (docs/architecture.md#kubernetes-wire-facts),
for any part that runs more than one replica of a process only one may act in
(the healer, the ComputeNode mirror and metering).

As kube-scheduler: lease 15 s, renew deadline 10 s, retry every 2 s
(``LeaseTerms``; the healer takes them from settings.healer). Optimistic concurrency: every write carries the
resourceVersion it read, a 409 means another replica won and we are not
leader. Expiry is judged by the local (event loop) clock from when this
replica last saw the lease record change, as client-go does, so clock skew
between replicas does not matter. Without a cluster the process is leader.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hcs_bus.errors import HcsError, KubeConflict, KubeNotFound
from hcs_bus.kube import Kube
from hcs_bus.telemetry import logger

_log = logger("hcs.leases")


class LeaseSettings(Protocol):
    """Which Lease and how long a term lasts (``HealerSettings`` is one)."""

    @property
    def lease_name(self) -> str: ...
    @property
    def lease_namespace(self) -> str: ...
    @property
    def lease_duration_s(self) -> float: ...
    @property
    def renew_deadline_s(self) -> float: ...
    @property
    def retry_period_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """A ``LeaseSettings`` for a process without a settings group of its own."""

    lease_name: str
    lease_namespace: str = "hcs-system"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def identity() -> str:
    """Lease holder identity: pod name (hostname) and pid, as client-go does."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Observed:
    record: tuple[str, str]  # (holderIdentity, renewTime)
    at: float  # local loop time when this record was first seen


def expired(observed: Observed | None, *, now: float, duration_s: float) -> bool:
    """Pure: has the lease record stayed unchanged for a whole lease duration?"""
    return observed is None or now - observed.at >= duration_s


def lease_body(
    *,
    name: str,
    namespace: str,
    me: str,
    duration_s: float,
    old: dict[str, Any] | None,
    now_iso: str,
) -> dict[str, Any]:
    """The Lease to write: renewal keeps acquireTime, a takeover counts a transition."""
    spec = dict((old or {}).get("spec") or {})
    taking_over = spec.get("holderIdentity") != me
    spec.update(holderIdentity=me, leaseDurationSeconds=int(duration_s), renewTime=now_iso)
    if taking_over:
        spec["acquireTime"] = now_iso
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if old is not None:
        metadata["resourceVersion"] = old["metadata"]["resourceVersion"]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": spec,
    }


class Leader:
    """Keeps trying to hold the lease; ``is_leader`` tells whether this replica may act."""

    def __init__(
        self,
        kube: Kube | None,
        *,
        identity: str,
        settings: LeaseSettings,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.kube = kube
        self.identity = identity
        self.settings = settings
        self.on_change = on_change
        self.is_leader = kube is None
        self.changed = asyncio.Event()
        self._observed: Observed | None = None
        self._renewed_at: float | None = None

    async def run(self) -> None:
        if self.kube is None:
            self._set(True)
            return
        loop = asyncio.get_running_loop()
        while True:
            won = await self._attempt(now=loop.time())
            if not won and self.is_leader and self._deadline_passed(loop.time()):
                self._set(False)
            elif won:
                self._set(True)
            elif not self.is_leader:
                self._set(False)
            await asyncio.sleep(self.settings.retry_period_s)

    async def _attempt(self, *, now: float) -> bool:
        """``try_once``, cut off at the renew deadline while leading (as client-go):
        a renewal still hanging when another replica may take over must not keep
        this one acting as leader."""
        if not self.is_leader or self._renewed_at is None:
            return await self.try_once(now=now)
        left = self.settings.renew_deadline_s - (now - self._renewed_at)
        try:
            async with asyncio.timeout(max(left, 0.0)):
                return await self.try_once(now=now)
        except TimeoutError:
            _log.warning("lease_renew_timed_out", deadline_s=self.settings.renew_deadline_s)
            return False

    def _deadline_passed(self, now: float) -> bool:
        return self._renewed_at is None or now - self._renewed_at >= self.settings.renew_deadline_s

    async def try_once(self, *, now: float) -> bool:
        """One acquire-or-renew attempt; True when we hold the lease after it."""
        assert self.kube is not None
        s = self.settings
        try:
            lease = await self.kube.get_lease(s.lease_namespace, s.lease_name)
        except KubeNotFound:
            return await self._write(None, now=now)
        except HcsError as exc:
            _log.warning("lease_read_failed", error=str(exc))
            return False
        spec = lease.get("spec") or {}
        record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
        if self._observed is None or self._observed.record != record:
            self._observed = Observed(record, now)
        mine = record[0] == self.identity
        free = not record[0] or expired(self._observed, now=now, duration_s=s.lease_duration_s)
        if not mine and not free:
            self._renewed_at = None  # another replica holds a live lease: we lead no more
            return False
        return await self._write(lease, now=now)

    async def _write(self, old: dict[str, Any] | None, *, now: float) -> bool:
        assert self.kube is not None
        s = self.settings
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = lease_body(
            name=s.lease_name,
            namespace=s.lease_namespace,
            me=self.identity,
            duration_s=s.lease_duration_s,
            old=old,
            now_iso=stamp,
        )
        try:
            if old is None:
                await self.kube.create_lease(s.lease_namespace, body)
            else:
                await self.kube.replace_lease(s.lease_namespace, s.lease_name, body)
        except KubeConflict:
            return False
        except HcsError as exc:
            _log.warning("lease_write_failed", error=str(exc))
            return False
        self._renewed_at = now
        return True

    def _set(self, leader: bool) -> None:
        first = not self.changed.is_set()
        self.changed.set()
        if leader == self.is_leader and not first:
            return
        was, self.is_leader = self.is_leader, leader
        _log.info(
            "leadership", leader=leader, identity=self.identity, lease=self.settings.lease_name
        )
        if self.on_change is not None and (leader != was or first):
            self.on_change(leader)
