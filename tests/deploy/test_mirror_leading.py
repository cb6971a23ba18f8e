"""Two mirror replicas elect a leader on a Lease (``hcs_bus.leases``): only the
holder writes ComputeNode status, ComputeQuota usage and usage alerts; when it
dies the other takes over and writes what it followed meanwhile."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from hcs_bus import messages, subjects, tasks
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.leases import Leader, LeaseTerms
from hcs_bus.messages import UsageAlert
from scheduler.report.computenode_loop import Mirror
from scheduler.report.usage_service import Meter
from tests.allocations import allocation, publish
from tests.apiserver import ApiServer
from tests.deploy.test_mirroring import fingerprint, until

TERMS = LeaseTerms(
    lease_name="hcs-mirror", lease_duration_s=1.0, renew_deadline_s=0.6, retry_period_s=0.1
)
T0 = 1_700_000_000.0


async def test_only_the_lease_holder_writes_and_the_other_takes_over_when_it_dies(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    mirrors = [
        Mirror(bus, kube, min_interval_s=0.0, refresh_s=0.0, leading=False) for _ in range(2)
    ]
    leaders = [
        Leader(kube, identity=f"mirror-{i}", settings=TERMS, on_change=m.lead)
        for i, m in enumerate(mirrors)
    ]
    for mirror in mirrors:
        await mirror.start()
    elections = [tasks.start(x.run(), name=f"test:lease-{i}") for i, x in enumerate(leaders)]
    try:
        await until(lambda: any(x.is_leader for x in leaders))
        first = next(i for i, x in enumerate(leaders) if x.is_leader)
        other = 1 - first
        await bus.publish(subjects.fp("gpu-node-a"), fingerprint(seq=1), msg_id="lead:1")
        await until(lambda: mirrors[first].writes >= 1)
        await until(lambda: mirrors[other].fingerprints.get("gpu-node-a") is not None)
        assert mirrors[other].writes == 0 and not leaders[other].is_leader
        assert apiserver.leases[("hcs-system", "hcs-mirror")]["spec"]["holderIdentity"] == (
            f"mirror-{first}"
        )

        await tasks.stop(elections[first])  # the leader dies: no more renewals, no writes
        await mirrors[first].stop()
        await bus.publish(subjects.fp("gpu-node-a"), fingerprint(seq=2), msg_id="lead:2")
        await until(lambda: leaders[other].is_leader, timeout_s=5.0)
        await until(
            lambda: apiserver.computenodes["gpu-node-a"].get("status", {}).get("observedSeq") == 2
        )
        assert mirrors[other].writes >= 1
    finally:
        await tasks.stop(*elections)
        for mirror in mirrors:
            await mirror.stop()


async def test_a_following_meter_neither_writes_usage_nor_alerts_but_keeps_the_crossing(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    apiserver.add_quota("tight", "small", {"hard": {"acu": 400}})
    heard: list[UsageAlert] = []

    async def on_msg(msg: Any) -> None:
        heard.append(messages.decode(msg.data, UsageAlert))

    sub = await bus.nc.subscribe(subjects.USAGE_ALL, cb=on_msg)
    alloc = functools.partial(allocation, devices=4, namespace="tight")
    await publish(bus, alloc("bound", T0, pod="big"))
    meter = Meter(bus, kube, clock=lambda: T0 + 10, interval_s=3600, leading=False)
    await meter.start()
    try:
        await asyncio.wait_for(meter.caught_up.wait(), 5)
        await meter.tick()
        await bus.nc.flush()
        assert meter.writes == 0 and meter.alerts == 0 and not heard
        assert "usage" not in apiserver.quotas[("tight", "small")].get("status", {})
        assert meter.alerting == {"tight"} and meter.totals(now=T0 + 10)  # judged and counted

        meter.lead(True)  # takes over: writes, but the crossing was already alerted
        await meter.tick()
        await bus.nc.flush()
        assert meter.writes == 1 and meter.alerts == 0 and not heard
        assert apiserver.quotas[("tight", "small")]["status"]["usage"]["quotaShare"] == 1.0
    finally:
        await meter.stop()
        await sub.unsubscribe()
