"""``hcs usage`` run as a user does, against a real nats-server whose
``HCS_ALLOC`` holds published AllocationEvents."""

from __future__ import annotations

import asyncio
import functools
import json
import time

import pytest

from hcs_bus.bus import Bus
from tests.allocations import allocation, publish
from tests.cli.running import CEILING_S, hcs

alloc = functools.partial(allocation, vram_mib=40960)  # one 40 GiB device


async def test_usage_prints_each_namespace_and_model_over_the_window(
    bus: Bus, nats_url: str
) -> None:
    now = time.time()
    await publish(
        bus,
        alloc("bound", now - 7200, pod="old", namespace="ml"),  # held 1 h, 2 h ago
        alloc("released", now - 3600, pod="old", namespace="ml"),
        alloc("bound", now - 1800, pod="live", namespace="cv", model="910B"),  # still held
        alloc("bound", now - 90_000, pod="ancient", namespace="ml"),  # ended before 24 h
        alloc("released", now - 88_000, pod="ancient", namespace="ml"),
    )
    done = await asyncio.to_thread(hcs, "usage", "--json", "--nats-url", nats_url)
    assert done.code == 0, done.err
    report = json.loads(done.out)
    by = {(r["namespace"], r["model"]): r for r in report["rows"]}
    assert set(by) == {("ml", "A100-80G"), ("cv", "910B")}
    assert by[("ml", "A100-80G")]["device_seconds"] == pytest.approx(3600, abs=1)
    assert by[("ml", "A100-80G")]["vram_gib_seconds"] == pytest.approx(40 * 3600, abs=40)
    assert by[("cv", "910B")]["device_seconds"] == pytest.approx(1800, abs=60)
    assert by[("cv", "910B")]["held_devices"] == 1 and report["window_s"] == 86400

    narrow = await asyncio.to_thread(
        hcs, "usage", "--namespace", "ml", "--since", "30m", "--nats-url", nats_url
    )
    assert narrow.code == 0 and "no devices were held" in narrow.out, narrow.out
    wide = await asyncio.to_thread(
        hcs, "usage", "--namespace", "ml", "--since", "2d", "--nats-url", nats_url
    )
    assert wide.code == 0, wide.err
    lines = wide.out.splitlines()
    assert lines[1].split()[:2] == ["NAMESPACE", "MODEL"]
    assert [line.split()[:3] for line in lines[2:]] == [["ml", "nvidia/A100-80G", "1.56"]]


@pytest.mark.parametrize("since", ["24", "0h", "yesterday", "-1h"])
def test_a_bad_since_is_one_line_and_exit_2(since: str) -> None:
    done = hcs("usage", f"--since={since}", "--nats-url", "nats://127.0.0.1:1")
    assert done.code == 2, (done.code, done.err)
    assert len(done.err_lines) == 1 and "--since" in done.err and repr(since) in done.err
    assert "Traceback" not in done.err and done.seconds < CEILING_S
