"""``hcs usage`` run as a user does, against a real nats-server whose
``HCS_ALLOC`` holds published AllocationEvents."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from pathlib import Path

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


async def test_usage_splits_each_row_at_the_namespace_guarantee_of_the_quota_file(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  ml: {acu: 1000, guaranteed: {acu: 100}}\n")
    env = {"HCS_SCHEDULER__QUOTA_FILE": str(quotas), "KUBECONFIG": str(tmp_path / "none")}
    now = time.time()
    await publish(
        bus,
        alloc("bound", now - 3600, pod="pair", namespace="ml", devices=2),  # 200 ACU, 80 GiB
        alloc("released", now - 1800, pod="pair", namespace="ml", devices=2),
        alloc("bound", now - 600, pod="live", namespace="cv"),  # cv: no ComputeQuota
    )
    done = await asyncio.to_thread(hcs, "usage", "--json", "--nats-url", nats_url, env=env)
    assert done.code == 0, done.err
    report = json.loads(done.out)
    ml = next(r for r in report["rows"] if r["namespace"] == "ml")
    assert ml["acu_seconds"] == pytest.approx(200 * 1800, abs=1)  # the total, as before
    assert ml["within"]["acu_seconds"] == pytest.approx(100 * 1800, abs=1)
    assert ml["borrowed"]["acu_seconds"] == pytest.approx(100 * 1800, abs=1)
    assert ml["within"]["device_seconds"] == pytest.approx(1800, abs=1)  # half, as its ACU
    assert ml["within"]["vram_gib_seconds"] == 0  # no VRAM guarantee: all borrowed
    assert ml["borrowed"]["vram_gib_seconds"] == pytest.approx(80 * 1800, abs=1)
    cv = next(r for r in report["rows"] if r["namespace"] == "cv")
    assert cv["within"] == {"device_seconds": 0, "acu_seconds": 0, "vram_gib_seconds": 0}
    assert cv["borrowed"]["device_seconds"] == pytest.approx(cv["device_seconds"])
    spaces = {n["namespace"]: n for n in report["namespaces"]}
    assert spaces["ml"]["guaranteed"] == {"acu": 100.0, "vram_mib": None}
    assert spaces["cv"]["guaranteed"] == {"acu": None, "vram_mib": None}
    assert spaces["ml"]["within"] == ml["within"]

    shown = await asyncio.to_thread(
        hcs, "usage", "--namespace", "ml", "--nats-url", nats_url, env=env
    )
    assert shown.code == 0, shown.err
    header, row = shown.out.splitlines()[1:3]
    assert header.split() == [
        *("NAMESPACE", "MODEL", "DEVICE-H", "WITHIN", "BORROWED", "ACU-H", "WITHIN"),
        *("BORROWED", "VRAM-GiB-H", "WITHIN", "BORROWED", "HELD"),
    ]
    assert row.split() == [
        *("ml", "nvidia/A100-80G", "1.00", "0.50", "0.50", "100.0", "50.0", "50.0"),
        *("40.0", "0.0", "40.0", "0"),
    ]


async def test_a_quota_that_cannot_be_read_shows_no_split_and_says_why_once(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  ml: {acu: lots}\n")
    env = {"HCS_SCHEDULER__QUOTA_FILE": str(quotas), "KUBECONFIG": str(tmp_path / "none")}
    now = time.time()
    await publish(bus, alloc("bound", now - 600, pod="live", namespace="ml"))
    done = await asyncio.to_thread(hcs, "usage", "--json", "--nats-url", nats_url, env=env)
    assert done.code == 0, done.err
    (row,) = json.loads(done.out)["rows"]
    assert row["device_seconds"] == pytest.approx(600, abs=60)  # the totals still shown
    assert row["within"] is None and row["borrowed"] is None
    said = [line for line in done.err_lines if "could not be read" in line]
    assert len(said) == 1 and "ml" in said[0] and "quotas.yaml" in said[0], done.err
    table = await asyncio.to_thread(hcs, "usage", "--nats-url", nats_url, env=env)
    assert table.out.splitlines()[2].split()[3:5] == ["-", "-"], table.out
