"""Quota limits never hold plans up behind a slow API server."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus.errors import KubeUnavailable
from scheduler.quota.source import QuotaSource

QUOTA = {"metadata": {"name": "budget"}, "spec": {"hard": {"ai.compute/vram": "32Gi"}}}


class _SlowKube:
    """Lists ComputeQuotas only when the test lets it."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.failing = False

    async def list_compute_quotas(self, namespace: str) -> list[dict[str, Any]]:
        self.calls += 1
        await self.gate.wait()
        if self.failing:
            raise KubeUnavailable("list computequotas: API server unreachable")
        return [QUOTA]


async def test_a_burst_of_plans_for_a_new_namespace_shares_one_read() -> None:
    kube = _SlowKube()
    source = QuotaSource(kube=kube, file=None)  # type: ignore[arg-type]
    waiting = [asyncio.create_task(source.limits("ml")) for _ in range(50)]
    await asyncio.sleep(0)  # every plan has asked
    kube.gate.set()
    answers = await asyncio.gather(*waiting)
    assert kube.calls == 1
    assert {a.vram_mib for a in answers if a is not None} == {32 * 1024}
    assert all(a is not None for a in answers)


async def test_a_stale_answer_is_given_at_once_while_one_read_refreshes_it() -> None:
    kube = _SlowKube()
    kube.gate.set()
    source = QuotaSource(kube=kube, file=None, ttl_s=0.0)  # type: ignore[arg-type]
    first = await source.limits("ml")
    kube.gate.clear()  # the API server is now stuck
    async with asyncio.timeout(0.5):  # answered without waiting on it
        again = [await source.limits("ml") for _ in range(20)]
    assert again == [first] * 20
    await asyncio.sleep(0)  # the refresh has started
    assert kube.calls == 2  # one refresh under way, not twenty
    kube.failing = True
    kube.gate.set()
    await asyncio.sleep(0)
    assert await source.limits("ml") == first  # a failed refresh keeps the last answer
    await asyncio.gather(*source._reading.values())
