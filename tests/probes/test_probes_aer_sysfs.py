"""sysfs AER counter polling on a fake /sys tree."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agents.probes.aer_counters import increases, parse_counters
from agents.probes.aer_sysfs import AerPoller, discover, watch_aer
from tests.probes.helpers import FakeSysfs

NVIDIA = 0x10DE


def _gpu_behind_port(fake: FakeSysfs) -> tuple[Path, Path]:
    port = fake.add("0000:3a:00.0")
    gpu = fake.add("0000:3a:00.0", "0000:3b:00.0", vendor=NVIDIA)
    return port, gpu


def _poller(fake: FakeSysfs) -> AerPoller:
    return AerPoller(sysfs_root=fake.root, clock_ns=lambda: 777)


def test_first_poll_is_a_baseline_without_events(fake_sysfs: FakeSysfs) -> None:
    _, gpu = _gpu_behind_port(fake_sysfs)
    fake_sysfs.set(gpu, "aer_dev_correctable", RxErr=5)
    assert _poller(fake_sysfs).poll() == []


def test_correctable_counter_increase_yields_info_event_with_bus_id(fake_sysfs: FakeSysfs) -> None:
    _, gpu = _gpu_behind_port(fake_sysfs)
    poller = _poller(fake_sysfs)
    poller.poll()
    fake_sysfs.set(gpu, "aer_dev_correctable", RxErr=3)
    [event] = poller.poll()
    assert (event.kind, event.severity, event.source) == ("aer_correctable", "info", "sysfs-aer")
    assert (event.pci_bus_id, event.vendor, event.ts_ns) == ("0000:3b:00.0", "nvidia", 777)
    assert event.evidence == {
        "file": "aer_dev_correctable",
        "counter": "RxErr",
        "delta": 3,
        "count": 3,
        "role": "device",
    }
    assert poller.poll() == [], "no new increase, no new event"


def test_nonfatal_and_fatal_increases_carry_their_severities(fake_sysfs: FakeSysfs) -> None:
    _, gpu = _gpu_behind_port(fake_sysfs)
    poller = _poller(fake_sysfs)
    poller.poll()
    fake_sysfs.set(gpu, "aer_dev_nonfatal", CmpltTO=1)
    fake_sysfs.set(gpu, "aer_dev_fatal", DLP=2, MalfTLP=1)
    events = poller.poll()
    assert sorted((e.kind, e.severity, e.evidence["counter"]) for e in events) == [
        ("aer_fatal", "fatal", "DLP"),
        ("aer_fatal", "fatal", "MalfTLP"),
        ("aer_nonfatal", "critical", "CmpltTO"),
    ]


def test_link_partner_counter_increase_is_reported_as_the_gpus_link(fake_sysfs: FakeSysfs) -> None:
    port, _ = _gpu_behind_port(fake_sysfs)
    poller = _poller(fake_sysfs)
    poller.poll()
    fake_sysfs.set(port, "aer_dev_correctable", BadTLP=7)
    [event] = poller.poll()
    assert event.pci_bus_id == "0000:3a:00.0"
    assert event.evidence["role"] == "link_partner"
    assert event.evidence["partner_of"] == "0000:3b:00.0"
    assert event.vendor == "nvidia"
    assert "link partner of 0000:3b:00.0" in event.message


def test_non_accelerator_devices_without_accelerators_below_are_ignored(
    fake_sysfs: FakeSysfs,
) -> None:
    _gpu_behind_port(fake_sysfs)
    nic = fake_sysfs.add("0000:00:1c.0", "0000:02:00.0", vendor=0x15B3)
    watched = {d.bdf for d in discover(sysfs_root=fake_sysfs.root, vendor_ids=frozenset({NVIDIA}))}
    assert watched == {"0000:3b:00.0", "0000:3a:00.0"}
    poller = _poller(fake_sysfs)
    poller.poll()
    fake_sysfs.set(nic, "aer_dev_fatal", DLP=1)
    assert poller.poll() == []


def test_counter_going_down_is_a_new_baseline_not_an_event(fake_sysfs: FakeSysfs) -> None:
    _, gpu = _gpu_behind_port(fake_sysfs)
    fake_sysfs.set(gpu, "aer_dev_correctable", RxErr=9)
    poller = _poller(fake_sysfs)
    poller.poll()
    fake_sysfs.set(gpu, "aer_dev_correctable", RxErr=0)
    assert poller.poll() == []
    fake_sysfs.set(gpu, "aer_dev_correctable", RxErr=1)
    assert [e.evidence["delta"] for e in poller.poll()] == [1]


def test_device_without_aer_files_but_with_aer_port_still_watches_the_port(
    fake_sysfs: FakeSysfs,
) -> None:
    fake_sysfs.add("0000:80:01.0")
    fake_sysfs.add("0000:80:01.0", "0000:81:00.0", vendor=0x19E5, aer=False)
    refs = discover(sysfs_root=fake_sysfs.root, vendor_ids=frozenset({0x19E5}))
    assert [(r.bdf, r.vendor, r.partner_of) for r in refs] == [
        ("0000:80:01.0", "huawei", "0000:81:00.0")
    ]


def test_missing_sysfs_tree_yields_nothing(tmp_path: Path) -> None:
    assert AerPoller(sysfs_root=tmp_path / "absent").poll() == []


def test_parse_counters_skips_malformed_lines() -> None:
    assert parse_counters("RxErr 3\nBadTLP x\n\nTOTAL_ERR_COR 3\njunk\nA 1 2\nB \u0663\n") == {
        "RxErr": 3,
        "TOTAL_ERR_COR": 3,
    }


def test_total_only_increase_is_reported_when_no_named_counter_explains_it() -> None:
    assert increases({"TOTAL_ERR_COR": 1}, {"TOTAL_ERR_COR": 2}) == {"TOTAL_ERR_COR": (1, 2)}
    assert increases({"RxErr": 0, "TOTAL_ERR_COR": 0}, {"RxErr": 1, "TOTAL_ERR_COR": 1}) == {
        "RxErr": (1, 1)
    }


async def test_watch_aer_yields_an_event_after_a_counter_increase(fake_sysfs: FakeSysfs) -> None:
    _, gpu = _gpu_behind_port(fake_sysfs)
    stream = watch_aer(sysfs_root=fake_sysfs.root, poll_interval_s=0.01)

    async def bump_later() -> None:
        await asyncio.sleep(0.1)
        fake_sysfs.set(gpu, "aer_dev_fatal", SDES=1)

    bump = asyncio.create_task(bump_later())
    event = await asyncio.wait_for(anext(stream), 5)
    await bump
    await stream.aclose()
    assert (event.kind, event.pci_bus_id, event.evidence["counter"]) == (
        "aer_fatal",
        "0000:3b:00.0",
        "SDES",
    )
