"""Follows /dev/kmsg and yields ProbeEvents: the fallback when eBPF can't load.

Opens non-blocking and seeks to the end (only new lines count). A read that
fails with EPIPE means the ring buffer overwrote records we had not read yet:
it is counted and reading goes on from the oldest record still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import weakref
from collections.abc import AsyncGenerator
from pathlib import Path

import structlog

from agents.probes.events import ProbeEvent
from agents.probes.kernel_lines import (
    KmsgRecord,
    classify_kmsg_record,
    parse_kmsg_record,
    split_kmsg_records,
)

_log = structlog.get_logger(__name__)
_READ_SIZE = 16384  # > the longest kmsg record (1 KiB text + dictionary)


class KmsgReader:
    """Non-blocking reader of /dev/kmsg (or of a regular file, for tests)."""

    def __init__(self, path: Path = Path("/dev/kmsg"), *, from_end: bool = True) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._closer = weakref.finalize(self, os.close, self.fd)
        self.is_device = stat.S_ISCHR(os.fstat(self.fd).st_mode)
        self.overwritten = 0
        self._partial = ""
        if from_end:
            with contextlib.suppress(OSError):
                os.lseek(self.fd, 0, os.SEEK_END)

    def close(self) -> None:
        self._closer()

    def _read_chunk(self) -> str | None:
        """One read(); None when nothing is available right now."""
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
                self.overwritten += 1
                continue
            return data.decode("utf-8", "replace") if data else None

    def _records_of(self, chunk: str) -> list[str]:
        if self.is_device:
            return [chunk]
        text, _, self._partial = (self._partial + chunk).rpartition("\n")
        return split_kmsg_records(text)

    def read_available(self) -> list[KmsgRecord]:
        """Every complete record readable without blocking."""
        records: list[KmsgRecord] = []
        while (chunk := self._read_chunk()) is not None:
            for raw in self._records_of(chunk):
                record = parse_kmsg_record(raw)
                if record is not None:
                    records.append(record)
        return records


def _events_of(records: list[KmsgRecord]) -> list[ProbeEvent]:
    return [e for e in (classify_kmsg_record(r) for r in records) if e is not None]


def watch_kmsg(
    *, kmsg_path: Path = Path("/dev/kmsg"), from_end: bool = True, idle_poll_s: float = 0.2
) -> AsyncGenerator[ProbeEvent, None]:
    """Yields a ProbeEvent for each new known fault line in the kernel log.

    The log is opened (and the backlog skipped) now, not at the first
    iteration, so nothing written after this call is missed.
    """
    return _follow(KmsgReader(kmsg_path, from_end=from_end), idle_poll_s=idle_poll_s)


async def _follow(reader: KmsgReader, *, idle_poll_s: float) -> AsyncGenerator[ProbeEvent, None]:
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    watched = False
    if reader.is_device:
        with contextlib.suppress(OSError, ValueError):
            loop.add_reader(reader.fd, wake.set)
            watched = True
    try:
        while True:
            wake.clear()
            for event in _events_of(reader.read_available()):
                yield event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), None if watched else idle_poll_s)
    finally:
        if watched:
            loop.remove_reader(reader.fd)
        if reader.overwritten:
            _log.warning("kmsg_records_overwritten", count=reader.overwritten)
        reader.close()
