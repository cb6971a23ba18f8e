"""``hcs watch --last N`` replays the newest N messages the bus kept, oldest
first, then says it is waiting for new ones."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from hcs.commands import subject_matches
from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import HealthEvent


async def _hcs(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hcs.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_watch_last_replays_the_newest_alerts_oldest_first(bus: Bus, nats_url: str) -> None:
    for n in range(5):
        event = HealthEvent(node="n1", kind="xid", severity="fatal", source="agent",
                            time_s=float(n), code=n, message=f"alert {n}")  # fmt: skip
        await bus.publish(subjects.health("n1"), event, msg_id=f"last-{n}")
    await bus.publish(subjects.fp("n1"), b"{}", msg_id="fp-between")  # another subject

    code, out, err = await _hcs("--nats-url", nats_url, "watch", "--last", "3", "--count", "3")

    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["message"] for line in lines] == ["alert 2", "alert 3", "alert 4"]
    assert all(line["subject"] == "hcs.health.n1" for line in lines)


async def test_watch_says_it_is_waiting_once_the_replay_is_done(bus: Bus, nats_url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hcs.cli", "--nats-url", nats_url, "watch", "--last", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            line = (await proc.stderr.readline()).decode()
        assert line.strip() == "hcs watch: waiting for messages on hcs.health.* (Ctrl-C stops)"
    finally:
        proc.terminate()
        await proc.wait()


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("hcs.health.*", "hcs.health.n1", True),
        ("hcs.health.*", "hcs.health.n1.x", False),
        ("hcs.>", "hcs.health.n1", True),
        ("hcs.>", "hcs", False),
        ("hcs.fp.n1", "hcs.fp.n2", False),
    ],
)
def test_replayed_subjects_match_as_nats_matches_them(
    pattern: str, subject: str, matches: bool
) -> None:
    assert subject_matches(pattern, subject) is matches
