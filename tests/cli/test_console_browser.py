"""The web console in a real browser (Debian's chromium, headless, driven by
Playwright) against the real stack of `hcs up`: the page shows the fleet, and
when a device falls off the bus it updates in place, without a reload. The
fault is published by the test, as the node's agent does (Xid 79 on
``hcs.health.gpu-a``), once the page is drawn: no race with a schedule. A
gang waiting whole (its pinned record in KV ``hcs_alloc``) shows in the
Queue panel."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hcs_bus import streams, subjects
from hcs_bus.bus import connect
from hcs_bus.messages import HealthEvent, Requests
from hcs_bus.natsserver import free_port
from hcs_bus.settings import BusSettings
from scheduler.plan import gang_records
from tests.cli.fleets import demo_fleet

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (pip install -e .[test])")

FLEET = demo_fleet()
# more A100s than the fleet has: it waits whole, holding nothing
WAITING = gang_records.GangRecord(namespace="ml", job="waits", run="r1", size=64, vendor="nvidia",
                                  model="A100-80G", time_s=time.time(),
                                  requests=Requests(devices=1))  # fmt: skip


def _said(out: Path, proc: subprocess.Popen[str], prefix: str, *, timeout_s: float) -> str:
    """The word after ``prefix`` on the first line of `hcs up`'s output that starts with it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in out.read_text().splitlines():
            if line.startswith(prefix):
                return line.removeprefix(prefix).split()[0]
        assert proc.poll() is None, f"hcs up exited: {out.read_text()[-2000:]}"
        time.sleep(0.2)
    raise AssertionError(f"hcs up never printed {prefix!r}: {out.read_text()[-2000:]}")


def _fail_device(nats_url: str, *, node: str, device: int) -> None:
    """Publish what the node's agent publishes when a GPU falls off the bus."""

    async def publish() -> None:
        bus = await connect(BusSettings(url=nats_url, name="test-console-fault"))
        try:
            event = HealthEvent(node=node, kind="xid", severity="fatal", source="agent",
                                time_s=time.time(), device=device, code=79,
                                message="GPU has fallen off the bus")  # fmt: skip
            await bus.publish(subjects.health(node), event, msg_id=f"test-xid-{time.time_ns()}")
        finally:
            await bus.nc.close()

    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's loop
        thread.submit(asyncio.run, publish()).result(timeout=20)


def _pin_gang(nats_url: str) -> None:
    """Write the record of a gang waiting whole, as the admission of its first member does."""

    async def put() -> None:
        bus = await connect(BusSettings(url=nats_url, name="test-console-gang"))
        try:
            kv = await bus.js.key_value(streams.KV_ALLOC)
            await kv.put(WAITING.key, gang_records.ENCODER.encode(WAITING))
        finally:
            await bus.nc.close()

    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, put()).result(timeout=20)


def _wait_answering(url: str, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                assert answer.status == 200
                return
        except OSError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.2)


@pytest.mark.timeout(150)
@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium)"
)
def test_the_console_shows_the_fleet_and_a_failing_device_without_reload(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    out = tmp_path / "up.out"
    argv = [sys.executable, "-m", "hcs.cli", "up", "--for", "90", "--fleet", str(fleet)]
    argv += ["--state-dir", str(tmp_path / "state"), "--webhook", f"127.0.0.1:{free_port()}"]
    argv += ["--extender", f"127.0.0.1:{free_port()}", "--console", f"127.0.0.1:{free_port()}"]
    with out.open("w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "TERM": "dumb"})  # fmt: skip
    try:
        nats_url = _said(out, proc, "hcs up: NATS ", timeout_s=30)
        url = _said(out, proc, "hcs up: console ", timeout_s=30)  # with this run's token
        assert "?token=" in url, url
        _wait_answering(url, timeout_s=30)  # the scheduler starts after the URL is printed
        _pin_gang(nats_url)
        _screenshot(url, chromium=CHROMIUM, out=tmp_path / "console.png")
        _drive(url, chromium=CHROMIUM, fail=lambda: _fail_device(nats_url, node="gpu-a", device=2))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)


def _screenshot(url: str, *, chromium: str, out: Path) -> None:
    """A headless browser's screenshot finishes: the live feed, which never
    ends, does not hold the page's load open."""
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={out}"]
    argv += ["--window-size=1280,900", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.exists() and out.stat().st_size > 0, done.stderr[-2000:]


def _drive(url: str, *, chromium: str, fail: Callable[[], None]) -> None:
    origin = url.split("/console/")[0]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on(
                "response",
                lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None,
            )
            elsewhere: list[str] = []
            page.on(
                "request", lambda r: None if r.url.startswith(origin) else elsewhere.append(r.url)
            )
            page.goto(url, wait_until="networkidle", timeout=20_000)
            page.screenshot(timeout=10_000)
            _shows_the_fleet(page)
            _shows_the_queue(page)
            devices = page.locator('[data-total="devices"] .big')
            assert devices.text_content() == "20/20 healthy", devices.text_content()
            page.evaluate("window.__sameDocument = true")
            fail()
            failed = '[data-device="gpu-a/2"][data-health="failed"]'
            page.wait_for_selector(failed, timeout=30_000)
            assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
            alert = page.locator('#alerts tr[data-severity="fatal"][data-alert-node="gpu-a"]')
            alert.first.wait_for(timeout=10_000)
            assert "79" in (alert.first.text_content() or "")
            failed_count = page.locator('#classes tr[data-class="nvidia/A100-80G"] td').nth(4)
            assert failed_count.text_content() == "1"
            # the fleet's health as hcs top and its screen say it
            page.wait_for_function(
                "document.querySelector('[data-total=\"devices\"] .big').textContent"
                " === '19/20 healthy, worst: failed'",
                timeout=10_000,
            )
            acu = page.locator('[data-total="acu"] .sub').nth(1).text_content() or ""
            assert re.fullmatch(r"of \d{1,3}(,\d{3})* ACU · \d{1,3}(,\d{3})* out", acu), acu
            assert page.locator("#plot-health canvas").count() >= 1
            assert not problems, problems
            assert not elsewhere, f"the console reached outside its origin: {elsewhere}"
        finally:
            browser.close()


def _shows_the_fleet(page: sync_api.Page) -> None:
    page.wait_for_selector('#feed[data-state="live"]', timeout=20_000)
    for node in ("gpu-a", "gpu-h", "npu-b"):
        page.wait_for_selector(f'.node[data-node="{node}"]', timeout=20_000)
    names = page.locator(".node .name").all_text_contents()
    assert sorted(names) == ["gpu-a", "gpu-h", "npu-b"], names
    classes = page.locator("#classes tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.class)"
    )
    assert classes == ["huawei/Ascend910B2", "nvidia/A100-80G", "nvidia/H100-SXM"], classes
    cells = page.locator('[data-device^="gpu-a/"]')
    assert cells.count() == 8
    # drawn before the fault: the device that will fail is healthy now
    assert page.get_attribute('[data-device="gpu-a/2"]', "data-health") == "healthy"


def _shows_the_queue(page: sync_api.Page) -> None:
    row = page.locator('#queue tr[data-job="ml/waits/r1"]')
    row.wait_for(timeout=15_000)  # the panel reads /api/queue every few seconds
    cells = row.locator("td").all_text_contents()
    jobs = page.locator("#queue tr[data-job]").evaluate_all("rows => rows.map(r => r.dataset.job)")
    position = jobs.index("ml/waits/r1") + 1  # behind smaller asks of the demo's gangs
    assert cells[:4] == [str(position), "ml/waits/r1", "ml", "0"], cells
    assert re.fullmatch(r"\d{1,3}(,\d{3})* s", cells[4]), cells
    assert cells[5].startswith("gang waits whole, holding nothing"), cells
    share = page.locator('#pool-shares tr[data-namespace="ml"] td').all_text_contents()
    assert share[0] == "ml" and share[3] == "0 ACU · 0 GiB", share  # used: nothing held
