"""Change detection and the bounded outbox (pure)."""

from __future__ import annotations

import msgspec
import pytest

from agents.changes import health_changes, reason_to_publish
from agents.outbox import Item, Outbox
from hcs_bus.messages import Compute, DeviceFingerprint, HealthEvent, Telemetry


def dev(index: int, **kw) -> DeviceFingerprint:
    base = dict(
        index=index,
        uuid=f"GPU-{index}",
        vendor="nvidia",
        model="A100-80G",
        vram_total_mib=81920,
        vram_free_mib=80000,
        compute=Compute(acu_profile=100, tflops_fp16_profile=312),
    )
    base.update(kw)
    return DeviceFingerprint(**base)


@pytest.mark.parametrize(
    ("after", "reason"),
    [
        ([dev(0), dev(1, vram_free_mib=79500)], None),  # noise under the threshold
        ([dev(0), dev(1, telemetry=Telemetry(temperature_c=80))], None),  # telemetry only
        ([dev(0)], "device_set"),
        ([dev(0), dev(1, health_score=40)], "health"),
        ([dev(0), dev(1, error="nvml: GPU is lost")], "health"),
        ([dev(0), dev(1, vram_free_mib=10000)], "vram"),
        (
            [
                dev(0),
                dev(1, compute=Compute(acu_profile=100, tflops_fp16_profile=312, acu_measured=61)),
            ],
            "compute",
        ),
    ],
)
def test_only_material_changes_publish_early(after, reason) -> None:
    before = [dev(0), dev(1)]
    assert reason_to_publish(before, after, vram_threshold_mib=1024) == reason
    assert reason_to_publish(None, after, vram_threshold_mib=1024) == "first"


def test_discrete_device_changes_become_health_events() -> None:
    before = [dev(0), dev(1), dev(2)]
    hot = Telemetry(throttle_reasons=("hw_thermal_slowdown",), remap_pending=True)
    after = [dev(0, telemetry=hot), dev(1, error="npu-smi: bad row"), dev(3)]
    events = health_changes(before, after, node="n1", now=5.0)
    got = {(e.kind, e.device, e.severity) for e in events}
    assert got == {
        ("device_lost", 2, "fatal"),
        ("device_added", 3, "info"),
        ("device_unreadable", 1, "warning"),
        ("row_remap_pending", 0, "warning"),
        ("thermal_throttle", 0, "warning"),
    }
    assert all(e.source == "agent" and e.time_s == 5.0 for e in events)
    assert health_changes(after, after, node="n1", now=6.0) == []
    assert health_changes(None, after, node="n1", now=6.0) == []


def _fp(n: int) -> Item:
    return Item("hcs.fp.n", msgspec.Struct(), f"n:b:{n}", "fingerprint")


def _h(n: int) -> Item:
    ev = HealthEvent(node="n", kind="xid", severity="fatal", source="agent", time_s=0)
    return Item("hcs.health.n", ev, f"n:b:h{n}", "health")


def test_a_full_outbox_drops_the_oldest_fingerprint_before_any_health_event() -> None:
    box = Outbox(3)
    for item in (_h(1), _fp(1), _h(2)):
        box.put(item)
    assert box.put(_fp(2)) == _fp(1)
    assert box.put(_h(3)) == _fp(2)
    assert [i.msg_id for i in box.items] == ["n:b:h1", "n:b:h2", "n:b:h3"]
    assert box.put(_h(4)).msg_id == "n:b:h1"  # only health left: oldest goes
    assert box.dropped == {"fingerprint": 2, "health": 1}
    assert [box.pop().msg_id for _ in range(3)] == ["n:b:h2", "n:b:h3", "n:b:h4"]
