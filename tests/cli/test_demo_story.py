"""``hcs up`` with the shipped demo fleet (``deploy/examples/fleet.yaml``)
tells one story, in this order, on the bus a user watches:

1. the fault: Xid 79 on gpu-a100-0 device 3 (the agent);
2. the verdict: that device failed (the healer, on its own subject), the
   node kept in service with seven devices;
3. the move: the demo job's pod on that device evicted and its replacement
   bound on another node, resuming from the last checkpoint;
4. the breaker: the Ascend device that falls off the bus is not isolated,
   because the circuit breaker is open (10 % of a 6-node fleet).

And nothing on the way contradicts it: no action claims to be a dry run
that nobody carries out, and no verdict claims an isolation the breaker
refused.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.cli.running import HCS


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def _first(events: list[dict[str, Any]], **want: Any) -> int:
    for i, event in enumerate(events):
        if all(_get(event, k) == v for k, v in want.items()):
            return i
    raise AssertionError(f"no event with {want} in {len(events)} events")


def _get(event: dict[str, Any], key: str) -> Any:
    if key == "subject_prefix":
        return next(
            (p for p in ("hcs.health.", "hcs.alloc.") if event["subject"].startswith(p)), None
        )
    value: Any = event
    for part in key.split("__"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def test_the_shipped_demo_tells_fault_verdict_move_breaker_in_order(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HCS_", "NATS_"))}
    up = subprocess.Popen(
        [HCS, "up", "--for", "150", "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    watch: subprocess.Popen[str] | None = None
    seen: list[str] = []
    try:
        assert up.stdout is not None
        hint = re.search(r"alerts: (hcs watch .*)$", up.stdout.readline().strip())
        assert hint, "hcs up printed no watch hint"
        url = shlex.split(hint.group(1))[-1]
        watch = subprocess.Popen(
            [HCS, "watch", "hcs.>", "--nats-url", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert watch.stdout is not None
        deadline = time.monotonic() + 140
        while time.monotonic() < deadline:
            line = watch.stdout.readline()
            if not line:
                break
            if line.startswith('{"subject": "hcs.health.') or line.startswith(
                '{"subject": "hcs.alloc.'
            ):
                seen.append(line)
            if '"kind": "breaker_open"' in line:
                break
    finally:
        if watch is not None:
            watch.send_signal(signal.SIGTERM)
            watch.communicate(timeout=30)
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=60)
    assert up.returncode == 0, err[-3000:]
    events = _events(seen)

    fault = _first(events, subject="hcs.health.gpu-a100-0", kind="xid", code=79)
    verdict = _first(
        events, subject="hcs.health._healer_gpu-a100-0", kind="verdict", device=3, verdict="failed"
    )
    evict = _first(
        events, subject="hcs.health._healer_gpu-a100-0", kind="action", evidence__action="evict"
    )
    moved = next(
        i
        for i, e in enumerate(events)
        if e["subject"].startswith("hcs.alloc.")
        and e["subject"] != "hcs.alloc.gpu-a100-0"
        and e.get("state") == "bound"
        and e["pod"]["name"] == "train-1"
    )
    breaker = _first(events, subject="hcs.health._healer_npu-910b-0", kind="breaker_open")
    assert fault < verdict < evict < moved < breaker, (fault, verdict, evict, moved, breaker)

    # The eviction is said the way it happens, naming the pod it moves.
    said = events[evict]
    assert "demo/train-0" in said["evidence"]["pods"].split(","), said
    assert "would" not in said["message"], said["message"]
    # The device verdict says the node stays in service (one device of eight).
    node = events[
        _first(events, subject="hcs.health._healer_gpu-a100-0", kind="verdict", device=None)
    ]
    assert node["verdict"] != "failed", node
    # Nothing claims npu-910b-0 was isolated: the breaker refused it.
    assert not any(
        e["subject"] == "hcs.health._healer_npu-910b-0" and e.get("kind") == "action"
        for e in events
    )
    running = [json.loads(x) for x in err.splitlines() if '"demo_pod_running"' in x]
    assert [r["node"] for r in running][:1] == ["gpu-a100-0"], running
    assert running[1]["resume_from"].startswith("s3://hcs-demo/llama/step-"), running
