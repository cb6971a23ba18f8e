"""`hcs up` runs the whole stack as a newcomer runs it, and leaves nothing behind."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hcs_bus.natsserver import free_port
from tests.cli.fleets import demo_fleet

# The demo job asks for 8 × A100-80G with substitution allowed: it starts on
# gpu-a, whose device 2 then fails; the replacement must land on gpu-h and
# resume from the job's last checkpoint.
FLEET = demo_fleet(gpu_a_2_fails_at_s=9)


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def _review() -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch:latest",
                    "resources": {"limits": {"ai.compute/vram": "16Gi"}},
                }
            ]
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0e2c1a-up",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
            "dryRun": True,  # a real admission would pledge room the demo job needs
        },
    }
    return json.dumps(review).encode()


def _post_review(url: str, *, ca: Path) -> dict[str, object]:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(
        url, data=_review(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, context=context, timeout=5) as answer:
        return dict(json.load(answer)["response"])


def _wait_for(path: Path, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_hcs_up_runs_every_part_shows_the_fault_and_stops_cleanly(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    state = tmp_path / "state"
    webhook = f"127.0.0.1:{free_port()}"
    extender = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "HCS_TELEMETRY__LOG_LEVEL": "info"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hcs.cli",
            "up",
            "--for",
            "22",
            "--fleet",
            str(fleet),
            "--state-dir",
            str(state),
            "--webhook",
            webhook,
            "--extender",
            extender,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ca = state / "certs" / "ca.crt"
        _wait_for(ca, timeout_s=20)
        answer: dict[str, object] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                answer = _post_review(f"https://{webhook}/mutate", ca=ca)
            except OSError:
                time.sleep(0.5)
                continue
            if answer.get("allowed"):
                break
            time.sleep(0.5)  # the scheduler may not have seen the fleet yet
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert answer.get("allowed") is True, answer
    patch = json.loads(base64.b64decode(str(answer["patch"])))
    assert any(op["path"] == "/spec/affinity" for op in patch)
    table = out[out.rindex("\nNODE") + 1 :]
    a100 = next(line for line in table.splitlines() if line.startswith("gpu-a "))
    assert a100.split()[5] == "1", table  # FAIL column: the Xid 79 device
    assert a100.split()[-1] == "degraded", table  # seven devices stay in service: no taint
    assert "Xid 79" in table
    job = next(line for line in table.splitlines() if line.startswith("demo/llama"))
    assert job.split()[1:3] == ["train-1", "gpu-h"], table
    assert "s3://hcs-demo/llama/step-" in job
    running = [json.loads(line) for line in err.splitlines() if "demo_pod_running" in line]
    assert [r["node"] for r in running] == ["gpu-a", "gpu-h"], running
    assert running[0]["resume_from"] is None
    assert running[1]["resume_from"].startswith("s3://hcs-demo/llama/step-")
    for part in ("agents", "scheduler", "injector", "healer"):
        assert f'"part": "{part}", "code": 0' in err, err[-3000:]
    # it ends by saying what happened: the Xid storm, the healer's word, one move, checkpoints
    said = re.search(
        r"^hcs up: stopped after \d+ s: faults (\d+), verdicts (\d+), actions (\d+), "
        r"moves (\d+), checkpoints (\d+)$",
        out,
        re.M,
    )
    assert said, out[-2000:]
    faults, verdicts, actions, moves, checkpoints = map(int, said.groups())
    assert faults >= 1 and verdicts >= 1 and actions >= 1, said.group(0)
    assert moves == 1 and checkpoints >= 2, said.group(0)
    # nothing of the demo outlives the bus (its trainer once failed after the close)
    assert "Traceback" not in err and "Task was destroyed" not in err, err[-3000:]
    assert not _processes_mentioning(str(fleet)), "an agent process was left behind"
    assert not _processes_mentioning(str(state)), "nats-server was left behind"
