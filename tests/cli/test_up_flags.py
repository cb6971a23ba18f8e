"""``hcs up`` takes its addresses as a user types them, and the hint it
prints (``hcs watch … --nats-url URL``) is a command that works."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
from pathlib import Path

from hcs_bus.natsserver import free_port
from tests.cli.running import HCS, hcs


def test_up_takes_a_host_name_for_its_webhook_extender_and_console(tmp_path: Path) -> None:
    webhook, extender, console = free_port(), free_port(), free_port()
    done = hcs(
        "up",
        "--for",
        "2",
        "--no-demo-job",
        "--state-dir",
        str(tmp_path),
        "--webhook",
        f"localhost:{webhook}",
        "--extender",
        f"localhost:{extender}",
        "--console",
        f"localhost:{console}",
        timeout_s=120,
    )
    assert done.code == 0, done.err[-3000:]
    assert "Traceback" not in done.err
    assert f"webhook https://127.0.0.1:{webhook}/mutate" in done.out
    assert f"extender https://127.0.0.1:{extender}/" in done.out
    assert re.search(rf"console http://127\.0\.0\.1:{console}/console/\?token=\S+ ", done.out)


def test_the_watch_hint_hcs_up_prints_runs_against_it(tmp_path: Path) -> None:
    up = subprocess.Popen(
        [HCS, "up", "--for", "60", "--no-demo-job", "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert up.stdout is not None
        first = up.stdout.readline()
        hint = re.search(r"alerts: (hcs watch .*)$", first.strip())
        assert hint, first
        argv = shlex.split(hint.group(1))
        assert argv[:3] == ["hcs", "watch", "hcs.health.*"] and argv[3] == "--nats-url", argv
        # The same command shape on the fingerprints, which arrive every report.
        watched = hcs("watch", "hcs.fp.*", "--count", "1", *argv[3:], timeout_s=60)
        assert watched.code == 0, watched.err
        assert json.loads(watched.out.splitlines()[0])["subject"].startswith("hcs.fp.")
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)
    assert up.returncode == 0
