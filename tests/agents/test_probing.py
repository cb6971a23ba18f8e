"""Kernel probe events map to HealthEvents with the device found by bus id."""

from __future__ import annotations

from agents.probes.events import ProbeEvent
from agents.probing import to_health
from tests.agents.test_changes import dev


def probe(**kw) -> ProbeEvent:
    base = dict(
        v=1,
        source="kmsg",
        kind="xid",
        vendor="nvidia",
        pci_bus_id="0000:0F:00.0",
        device_index=None,
        code=79,
        severity="fatal",
        message="NVRM: Xid (PCI:0000:0f:00): 79, GPU has fallen off the bus.",
        ts_ns=123,
        evidence={"line": "NVRM: Xid 79"},
    )
    base.update(kw)
    return ProbeEvent(**base)


DEVICES = [dev(0, pci_bus_id="0000:07:00.0"), dev(1, pci_bus_id="0000:0f:00.0")]


def test_a_probe_xid_names_the_device_found_through_its_bus_id() -> None:
    event = to_health(probe(), node="gpu-1", devices=DEVICES, now=10.0)
    assert (event.node, event.kind, event.source, event.severity) == (
        "gpu-1",
        "xid",
        "probe",
        "fatal",
    )
    assert (event.device, event.device_uuid, event.code) == (1, "GPU-1", 79)
    assert (
        event.evidence["probe_source"] == "kmsg" and event.evidence["pci_bus_id"] == "0000:0F:00.0"
    )
    assert event.evidence["probe_line"] == "NVRM: Xid 79" and event.time_s == 10.0


def test_fallen_off_bus_becomes_device_lost_and_an_unknown_bus_keeps_the_probe_index() -> None:
    lost = to_health(
        probe(kind="fallen_off_bus", pci_bus_id="0000:99:00.0", device_index=5),
        node="gpu-1",
        devices=DEVICES,
        now=1.0,
    )
    assert (lost.kind, lost.device, lost.device_uuid) == ("device_lost", 5, None)


def test_an_aer_event_without_any_device_stays_node_wide() -> None:
    aer = to_health(
        probe(
            source="sysfs-aer",
            kind="aer_correctable",
            pci_bus_id=None,
            code=None,
            severity="warning",
            vendor=None,
        ),
        node="gpu-1",
        devices=DEVICES,
        now=1.0,
    )
    assert (aer.kind, aer.device, aer.severity) == ("aer_correctable", None, "warning")
