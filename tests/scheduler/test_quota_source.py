"""Quota limits never hold plans up behind a slow API server."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus.errors import KubeUnavailable
from hcs_bus.messages import AllocState, DeviceSlice, PodRef, Reservation
from scheduler.ledger.pledge_rules import Held
from scheduler.plan import rules as planning
from scheduler.quota.source import QuotaSource, Used, used_by_namespace
from scheduler.view.state import NodeView
from tests.scheduler.helpers import node_fp, state_of

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


def _held(name: str, state: AllocState, *, index: int, namespace: str = "ml") -> Reservation:
    return Reservation(
        pod=PodRef(namespace=namespace, name=name, uid=f"uid-{name}"),
        devices=(DeviceSlice(index=index, uuid=f"GPU-{index}", vram_mib=16384),),
        state=state,
        time_s=1.0,
        vendor="nvidia",
        model="A100-80G",
        acu=25.0,
    )


def test_only_reserved_and_bound_reservations_count_against_a_quota_in_plans_and_status() -> None:
    held = [
        _held("a", "reserved", index=0),
        _held("b", "bound", index=1),
        _held("c", "released", index=2),
        _held("d", "expired", index=3),
        _held("e", "bound", index=4, namespace="team-b"),
    ]
    assert planning.namespace_usage(held) == {
        "ml": planning.Usage(vram_mib=32768, acu=50.0, devices=2),
        "team-b": planning.Usage(vram_mib=16384, acu=25.0, devices=1),
    }
    # the plans' summary: a node part counts what the quota status counts
    view = state_of(node_fp("gpu-1")).nodes["gpu-1"]
    node = NodeView(
        name=view.name,
        fingerprint=view.fingerprint,
        seen_at=view.seen_at,
        devices=view.devices,
        reservations={r.pod.name: r for r in held},
    )
    summary = planning.merged([(planning.node_part(node), True)])
    assert summary.usage == {"ml": (32768, 50.0), "team-b": (16384, 25.0)}
    quota = planning.QuotaLimits(vram_mib=40960)
    ask = planning.Sizing(1, 16384, False, 0.0, 0.0, "")
    verdict = planning.check_quota("ml", sizing=ask, summary=summary, quota=quota)
    assert not verdict.ok and verdict.vram_mib_used == 32768
    # status.used: the same sum, plus the pledges
    pledged = {"ml": (Held(devices=1, vram_mib=8192, acu=10.0), 1)}
    assert used_by_namespace(planning.namespace_usage(held), pledged) == {
        "ml": Used(vram_mib=40960, acu=60.0, devices=3, pledges=1),
        "team-b": Used(vram_mib=16384, acu=25.0, devices=1),
    }
