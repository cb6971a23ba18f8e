"""Leader election: a leader that cannot renew in time, or sees another live
holder, stops leading before another replica can take over (no split brain)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from hcs_bus import tasks
from hcs_bus.errors import KubeConflict, KubeNotFound
from hcs_bus.settings import HealerSettings
from healer.leading import Leader


class FakeLeases:
    """Just the Lease calls of ``hcs_bus.kube.Kube``, with switches for trouble."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.hang = asyncio.Event()  # set: every call hangs
        self.stolen_by: str | None = None  # set: another replica renews the lease

    async def _trouble(self) -> None:
        if self.hang.is_set():
            await asyncio.Event().wait()

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        await self._trouble()
        if self.lease is None:
            raise KubeNotFound("lease not found")
        if self.stolen_by is not None:  # the other replica renewed since we looked
            self.version += 1
            spec = {"holderIdentity": self.stolen_by, "renewTime": f"t{self.version}"}
            self.lease = {"metadata": {"resourceVersion": str(self.version)}, "spec": spec}
        return self.lease

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._trouble()
        return self._store(body)

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> Any:
        await self._trouble()
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise KubeConflict("stale resourceVersion")
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": str(self.version)},
        }
        return self.lease


def settings(*, renew_deadline_s: float) -> HealerSettings:
    return HealerSettings(
        lease_duration_s=renew_deadline_s * 1.5,
        renew_deadline_s=renew_deadline_s,
        retry_period_s=0.02,
    )


async def wait_until(cond: Callable[[], bool], *, timeout_s: float) -> float:
    started = time.monotonic()
    while not cond():
        if time.monotonic() - started > timeout_s:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_a_leader_whose_renewal_hangs_steps_down_by_its_renew_deadline() -> None:
    api = FakeLeases()
    leader = Leader(api, identity="a", settings=settings(renew_deadline_s=0.3))  # type: ignore[arg-type]
    task = tasks.start(leader.run(), name="test:leader")
    try:
        await wait_until(lambda: leader.is_leader, timeout_s=2.0)
        api.hang.set()  # the API server stops answering (the calls hang, no error)
        took = await wait_until(lambda: not leader.is_leader, timeout_s=2.0)
        assert took < 0.45  # the renew deadline (0.3 s), before the lease (0.45 s) expires
    finally:
        await tasks.stop(task)


async def test_a_leader_that_sees_another_live_holder_steps_down_at_once() -> None:
    api = FakeLeases()
    leader = Leader(api, identity="a", settings=settings(renew_deadline_s=5.0))  # type: ignore[arg-type]
    task = tasks.start(leader.run(), name="test:leader")
    try:
        await wait_until(lambda: leader.is_leader, timeout_s=2.0)
        api.stolen_by = "b"
        took = await wait_until(lambda: not leader.is_leader, timeout_s=2.0)
        assert took < 1.0  # not after the 5 s renew deadline
    finally:
        await tasks.stop(task)
