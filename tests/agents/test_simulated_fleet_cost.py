"""A simulated node builds its telemetry only when a fingerprint can go out
(the report is due, a script step fired, its VRAM use moved): what it
publishes is what building at every tick published, and one process can
play thousands of nodes."""

from __future__ import annotations

import pytest

from agents import fleet as fleet_file
from agents import simulating
from agents.outbox import Item
from agents.reporting import Publisher
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeFingerprint

FLEET = """
report_interval_s: 10
nodes:
  - name: sim-0
    devices: {model: nvidia/A100-80G, count: 8}
    failures:
      - {at_s: 4.05, device: 3, kind: fall_off_bus}
"""
TICK_S = 0.1


def _published(publisher: Publisher) -> list[NodeFingerprint]:
    items: list[Item] = []
    while publisher.outbox.peek() is not None:
        items.append(publisher.outbox.pop())
    return [i.message for i in items if isinstance(i.message, NodeFingerprint)]


async def test_telemetry_is_built_only_when_a_fingerprint_can_go_out(
    bus: Bus, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = Publisher(bus, capacity=1000)
    spec = fleet_file.loads(FLEET, db=db)
    node = simulating.build_node(spec.nodes[0], publisher=publisher, db=db, interval_s=10, seed=3)
    built: list[float] = []
    real = simulating.fingerprints

    def counted(n: simulating.SimNode, *, noise_pct: float) -> list:
        built.append(round(t, 2))
        return real(n, noise_pct=noise_pct)

    monkeypatch.setattr(simulating, "fingerprints", counted)
    for tick in range(0, 251):  # 25 s of 0.1 s ticks
        t = tick * TICK_S
        if tick == 150:
            node.used_mib[5] = 40_000  # a pod's use appears between two reports
        simulating.step(node, elapsed_s=t, loop_s=t, now=1000.0 + t, noise_pct=0.5)
    assert built == [0.0, 4.1, 14.1, 15.0, 25.0]
    fingerprints = _published(publisher)
    assert [round(f.time_s - 1000.0, 2) for f in fingerprints] == built
    assert [f.seq for f in fingerprints] == [1, 2, 3, 4, 5]
    lost = fingerprints[1].devices[3]
    assert lost.health_score == 0 and lost.error is not None
    assert (
        fingerprints[3].devices[5].vram_free_mib
        == fingerprints[2].devices[5].vram_total_mib - 40_000
    )
