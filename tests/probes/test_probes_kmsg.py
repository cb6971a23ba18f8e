"""/dev/kmsg follower: file-backed records, EPIPE, and the real device."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agents.probes.events import ProbeEvent
from agents.probes.kmsg import KmsgReader, watch_kmsg
from tests.probes.helpers import FIXTURES, write_kmsg

XID_RECORD = (
    "3,9001,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
)


def test_reader_from_start_returns_every_recorded_record(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg"
    dump.write_text((FIXTURES / "kmsg_records.txt").read_text("utf-8"))
    reader = KmsgReader(dump, from_end=False)
    records = reader.read_available()
    reader.close()
    assert [r.seq for r in records] == [1712, 1713, 1714, 1715, 1716, 1717]
    assert records[1].fields["DEVICE"] == "+pci:0000:00:03.1"


def test_reader_from_end_skips_the_backlog_and_sees_new_records(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg"
    dump.write_text((FIXTURES / "kmsg_records.txt").read_text("utf-8"))
    reader = KmsgReader(dump, from_end=True)
    assert reader.read_available() == []
    with dump.open("a") as f:
        f.write(XID_RECORD)
    [record] = reader.read_available()
    reader.close()
    assert record.seq == 9001 and record.level == 3


def test_partial_record_at_end_of_file_waits_for_its_newline(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg"
    dump.write_text(XID_RECORD[:30])
    reader = KmsgReader(dump, from_end=False)
    assert reader.read_available() == []
    with dump.open("a") as f:
        f.write(XID_RECORD[30:])
    assert [r.seq for r in reader.read_available()] == [9001]
    reader.close()


def test_overwritten_records_epipe_are_counted_and_reading_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "kmsg"
    dump.write_text(XID_RECORD)
    reader = KmsgReader(dump, from_end=False)
    real_read = os.read
    calls = {"n": 0}

    def flaky_read(fd: int, n: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EPIPE, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", flaky_read)
    records = reader.read_available()
    reader.close()
    assert reader.overwritten == 1
    assert [r.seq for r in records] == [9001]


async def test_watch_kmsg_on_a_file_yields_classified_events_only(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg"
    dump.write_text("")
    stream = watch_kmsg(kmsg_path=dump, idle_poll_s=0.02)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)
    with dump.open("a") as f:
        f.write("6,1,1,-;systemd[1]: noise\n" + XID_RECORD)
    event = await asyncio.wait_for(pending, 5)
    await stream.aclose()
    assert (event.source, event.kind, event.ts_ns) == ("kmsg", "fallen_off_bus", 5_000_000_000)


async def test_real_dev_kmsg_follower_sees_a_selftest_line(needs_root: None) -> None:
    nonce = uuid.uuid4().hex
    stream = watch_kmsg()
    pending = asyncio.ensure_future(_first_with(stream, nonce))
    await asyncio.sleep(0.2)
    write_kmsg(f"hcs-probe: selftest nonce={nonce}")
    event = await asyncio.wait_for(pending, 10)
    await stream.aclose()
    assert (event.kind, event.source, event.severity) == ("test_probe", "kmsg", "info")
    assert event.evidence["kmsg_level"] == 6


async def _first_with(stream: AsyncIterator[ProbeEvent], needle: str) -> ProbeEvent:
    async for event in stream:
        if needle in event.message:
            return event
    raise AssertionError("stream ended")
