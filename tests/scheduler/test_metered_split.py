"""The metering service on a real nats-server writes a ComputeQuota's usage
split at its guarantee: ``status.usage.withinGuarantee`` and ``.borrowed``
(device-, ACU- and VRAM-GiB-seconds), beside the totals it always wrote."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import yaml

from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from scheduler.report.usage_service import Meter
from tests.allocations import allocation, publish
from tests.apiserver import ApiServer

T0 = 1_700_000_000.0
CRD = Path(__file__).parents[2] / "deploy" / "base" / "crds" / "computequotas.yaml"
alloc = functools.partial(allocation, vram_mib=16384)  # 16 GiB and 100 ACU per device


async def test_usage_within_the_guarantee_and_borrowed_beyond_it_add_up_to_the_totals(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    apiserver.add_quota("ml", "team", {"hard": {"acu": 1000}, "guaranteed": {"acu": 100}})
    apiserver.add_quota("ml", "vram", {"guaranteed": {"vram": "16Gi"}})
    apiserver.add_quota("cv", "cap", {"hard": {"acu": 1000}})  # a ceiling, no guarantee
    await publish(
        bus,
        alloc("bound", T0, pod="a", devices=2),
        alloc("bound", T0 + 50, pod="b"),
        alloc("released", T0 + 100, pod="a", devices=2),
        alloc("bound", T0, pod="c", namespace="cv"),
        alloc("released", T0 + 10, pod="c", namespace="cv"),
    )
    meter = Meter(bus, kube, clock=lambda: T0 + 200, interval_s=3600)
    await meter.start()
    try:
        await asyncio.wait_for(meter.caught_up.wait(), 5)
        await meter.tick()
    finally:
        await meter.stop()
    for name in ("team", "vram"):
        usage = apiserver.quotas[("ml", name)]["status"]["usage"]
        # totals as before: a 2 devices x 100 s, b 1 device x 150 s
        assert (usage["deviceSeconds"], usage["acuSeconds"]) == (350.0, 35_000.0)
        # within 100 ACU and 16 GiB: one device's worth at every moment it held one or more
        assert usage["withinGuarantee"] == {
            "deviceSeconds": 200.0,
            "acuSeconds": 20_000.0,
            "vramGiBSeconds": 3200.0,
        }
        assert usage["borrowed"] == {
            "deviceSeconds": 150.0,
            "acuSeconds": 15_000.0,
            "vramGiBSeconds": 2400.0,
        }
    cv = apiserver.quotas[("cv", "cap")]["status"]["usage"]
    assert cv["withinGuarantee"] == {"deviceSeconds": 0, "acuSeconds": 0, "vramGiBSeconds": 0}
    assert cv["borrowed"] == {
        "deviceSeconds": 10.0,
        "acuSeconds": 1000.0,
        "vramGiBSeconds": 160.0,
    }
    assert set(cv) <= _usage_fields()  # the API server keeps what its schema names


def _usage_fields() -> set[str]:
    """The fields the CRD declares under ``status.usage`` (others are pruned)."""
    crd: dict[str, Any] = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    usage = schema["properties"]["status"]["properties"]["usage"]["properties"]
    for part in ("withinGuarantee", "borrowed"):
        assert set(usage[part]["properties"]) == {"deviceSeconds", "acuSeconds", "vramGiBSeconds"}
    return set(usage)
