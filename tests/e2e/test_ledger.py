"""Crash-safe booking on a real cluster: ``kill -9`` of the scheduler in the
middle of a burst of bindings, a restart with a short reserve TTL, and then
no device over-committed and every bound pod holding a reservation — read
from the pods' ``hcs.io/*`` annotations and from KV ``hcs_alloc`` alike,
and by ``hcs check`` at the end. Whether the kill lands between a Binding
and its mark is chance, so while the scheduler is down the test also leaves
in KV exactly what such a crash leaves (and what the old expiry left).

Then two replicas binding at once (kube-scheduler reaches both through one
``tests.e2e.front``, as through a Service), each killed mid-burst and
restarted in turn: the same checks, and no pod held on two nodes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents import fleet as fleet_file
from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeReservations
from scheduler.ledger import audit_store as checking
from tests.e2e.api import ApiError, wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, fleet_labelled

pytestmark = pytest.mark.faults

# 32 GiB slices of A100-80G: two per device, 48 on the fleet's three A100 nodes
SLICE = {"ai.compute/vram": "32Gi"}
SLICE_MIB = 32 * 1024
ON_A100 = {"hcs.io/models": "A100-80G"}
FIRST, EXTRA = 40, 4
TTL_S = 5
REPLICA_A, REPLICA_B = "scheduler", "scheduler-b"


def _bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


def _ledger(stack: Stack) -> dict[str, NodeReservations]:
    return stack.on_bus(checking.read_ledger)


def _hcs_check(stack: Stack) -> tuple[int, list[str]]:
    """``hcs check`` run as an operator would, as the scheduler's account."""
    kubeconfig = stack.cluster.service_account_kubeconfig("hcs-system", "hcs-scheduler")
    env = {**os.environ, "HCS_KUBE__MODE": "kubeconfig", "HCS_KUBE__KUBECONFIG": str(kubeconfig)}
    hcs = Path(sys.executable).with_name("hcs")
    done = subprocess.run(
        [str(hcs), "check", "--nats-url", stack.nats.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


def _no_reserved_left(stack: Stack) -> bool:
    return all(r.state == "bound" for doc in _ledger(stack).values() for r in doc.reservations)


def _crash_leftovers(stack: Stack, pods: list[dict[str, Any]]) -> tuple[str, str]:
    """Leave in KV what a crash leaves (the scheduler is down): one bound pod's
    reservation still ``reserved`` since long ago (killed between the Binding
    and the mark), another's gone (freed by an expiry that did not look at the
    pod). Returns the two pods' names."""
    stuck, lost = pods[0], pods[1]

    async def crash(bus: Bus) -> None:
        kv = await bus.js.key_value(streams.KV_ALLOC)
        for pod in (stuck, lost):
            node, name = pod["spec"]["nodeName"], pod["metadata"]["name"]
            doc = (await checking.read_ledger(bus))[node]
            kept = []
            for r in doc.reservations:
                if r.pod.name != name:
                    kept.append(r)
                elif pod is stuck:
                    kept.append(msgspec.structs.replace(r, state="reserved", time_s=1.0))
            fresh = NodeReservations(node=node, reservations=tuple(kept))
            await kv.put(subjects.alloc_key(node), messages.encode(fresh))

    stack.on_bus(crash)
    return stuck["metadata"]["name"], lost["metadata"]["name"]


def _slots(stack: Stack) -> int:
    """32 GiB slices the fleet's A100 devices hold at once."""
    nodes = [n.name for n in fleet_file.load(FLEET).nodes if n.name.startswith("gpu-a100")]
    return sum(
        d.vram_usable_mib // SLICE_MIB
        for node in nodes
        for d in stack.fingerprint(node).devices
        if d.error is None
    )


def _vram_mib(quota: str) -> list[int]:
    return [int(part.split(":")[1].removesuffix("Mi")) for part in quota.split(",")]


def test_a_scheduler_killed_mid_burst_leaves_no_double_booking_and_no_pod_without_reservation(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    slots = _slots(stack)
    for i in range(FIRST):
        work.pod(f"burst-{i}", SLICE, annotations=ON_A100)
    wait_for(
        lambda: len(_bound(work.pods())) >= 2,
        what="the burst binding",
        timeout_s=60,
        explain=lambda: work.explain("burst-0"),
    )
    scheduler = stack.parts["scheduler"]
    scheduler.kill()  # kill -9 while kube-scheduler is still binding the burst
    stuck, lost = _crash_leftovers(stack, _bound(work.pods()))
    restarted = stack.start_part(
        "scheduler", scheduler.argv, HCS_SCHEDULER__RESERVE_TTL_S=str(TTL_S)
    )
    restarted.wait_until(stack._extender_ready, what="ready again", timeout_s=60)
    started = time.monotonic()
    wait_for(
        lambda: _no_reserved_left(stack) and time.monotonic() - started > TTL_S * 1.5,
        what=f"every reservation bound or expired past the {TTL_S} s reserve TTL",
        timeout_s=90,
        explain=lambda: str(_ledger(stack)),
    )
    # more pods than room: every slot is contested, so one freed by mistake
    # would be handed out again and show as an over-commit
    for i in range(slots - len(_bound(work.pods())) + EXTRA):
        work.pod(f"after-{i}", SLICE, annotations=ON_A100)
    wait_for(  # a bound pod's mark rides its node's next write, or comes a second later
        lambda: len(_bound(work.pods())) >= slots and _no_reserved_left(stack),
        what=f"all {slots} slices of the A100 nodes bound, every reservation marked",
        timeout_s=120,
        explain=lambda: work.explain("after-0"),
    )

    pods = _bound(work.pods())
    assert {stuck, lost} <= {p["metadata"]["name"] for p in pods}
    _assert_ledger_agrees(stack, work, pods)
    assert len(pods) == slots
    status, lines = _hcs_check(stack)
    assert status == 0, "\n".join(lines)


def test_both_scheduler_replicas_killed_in_turn_mid_burst_leave_no_double_booking(
    stack: Stack, work: Workloads
) -> None:
    """Two replicas behind one front bind at once; each is killed with
    ``kill -9`` while a burst is binding, and restarted, in turn."""
    fleet_labelled(work, FLEET)
    slots = _slots(stack)
    ttl = {"HCS_SCHEDULER__RESERVE_TTL_S": str(TTL_S)}
    other = stack.start_replica(REPLICA_B, **ttl)
    other.wait_until(lambda: stack.replica_ready(REPLICA_B), what="ready", timeout_s=60)
    try:
        front = stack.front_replicas([REPLICA_A, REPLICA_B])
        first = slots // 2
        _burst_killing(stack, work, wave="wave1", count=first, room=slots, kill=REPLICA_A, **ttl)
        # more pods than room: every slot is contested (one freed by mistake
        # would be handed out again and show as an over-commit)
        second = slots - first + EXTRA
        _burst_killing(stack, work, wave="wave2", count=second, room=slots, kill=REPLICA_B, **ttl)
        restarted = time.monotonic()
        wait_for(
            lambda: (
                len(_bound(work.pods())) >= slots
                and _no_reserved_left(stack)
                and time.monotonic() - restarted > TTL_S * 1.5
            ),
            what=f"all {slots} slices bound and no reservation left reserved past the TTL",
            timeout_s=90,
            explain=lambda: f"{len(_bound(work.pods()))} bound; {_ledger(stack)}",
        )
        pods = _bound(work.pods())
        assert len(pods) == slots
        _assert_ledger_agrees(stack, work, pods)
        binds = {
            n: front.served[(stack.extender_ports[n], "/bind")] for n in (REPLICA_A, REPLICA_B)
        }
        assert all(binds.values()), f"one replica answered every bind: {binds}"
        wait_for(
            lambda: all(p["status"].get("phase") == "Running" for p in _bound(work.pods())),
            what="every bound pod Running",
            timeout_s=60,
            explain=lambda: str([work.explain(p["metadata"]["name"]) for p in pods][:3]),
        )
        status, lines = _hcs_check(stack)
        assert status == 0, "\n".join(lines)
    finally:
        stack.one_replica_again()


def _burst_killing(
    stack: Stack, work: Workloads, *, wave: str, count: int, room: int, kill: str, **env: str
) -> None:
    """Create ``count`` pods at once and ``kill -9`` the replica ``kill`` as
    soon as one is bound while others that fit are not (kube-scheduler is
    binding through both replicas); restart it, ready again."""
    before = len(work.pods())
    fits = min(room, before + count)

    def binding() -> bool:
        pods = work.pods()
        ours = [p for p in pods if p["metadata"]["name"].startswith(f"{wave}-")]
        return bool(_bound(ours)) and len(_bound(pods)) < fits

    with ThreadPoolExecutor(max_workers=8) as pool:
        made = [pool.submit(_create, work, f"{wave}-{i}") for i in range(count)]
        deadline = time.monotonic() + 60
        while not binding():  # a tight poll: a burst can bind within a second
            assert time.monotonic() < deadline, f"no pod of {wave} bound within 60 s"
            time.sleep(0.02)
        stack.parts[kill].kill()
        restarted = stack.start_replica(kill, **env)
        for done in made:
            done.result()
    restarted.wait_until(lambda: stack.replica_ready(kill), what="ready again", timeout_s=60)


def _create(work: Workloads, name: str) -> None:
    """One pod of a burst, asked again as a controller would when refused with
    503 (fail-closed: a placement request lost with a killed replica)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            work.pod(name, SLICE, annotations=ON_A100)
            return
        except ApiError as exc:
            if exc.status != 503 or time.monotonic() > deadline:
                raise


def _assert_ledger_agrees(stack: Stack, work: Workloads, pods: list[dict[str, Any]]) -> None:
    """Each bound pod holds one ``bound`` reservation, on its node and on no
    other; no device holds more than it has; nothing of the namespace is held
    by a pod that is not bound."""
    ledger = _ledger(stack)
    held: dict[tuple[str, str], int] = defaultdict(int)
    nodes_of: dict[str, set[str]] = defaultdict(set)
    for node_doc in ledger.values():
        for r in node_doc.reservations:
            if r.pod.namespace == work.namespace:
                nodes_of[r.pod.name].add(node_doc.node)
    for pod in pods:
        meta, node = pod["metadata"], pod["spec"]["nodeName"]
        notes = meta.get("annotations", {})
        ids = notes["hcs.io/devices"].split(",")
        for device, mib in zip(ids, _vram_mib(notes["hcs.io/vram-quota"]), strict=True):
            held[(node, device)] += mib
        doc = ledger.get(node)
        mine = [
            r
            for r in (doc.reservations if doc else ())
            if (r.pod.namespace, r.pod.name) == (work.namespace, meta["name"])
        ]
        assert [r.state for r in mine] == ["bound"], (meta["name"], node, mine)
        assert mine[0].pod.uid == meta["uid"]
        assert nodes_of[meta["name"]] == {node}, f"{meta['name']} held on {nodes_of[meta['name']]}"
    totals = {
        (node, d.uuid): d.vram_usable_mib
        for node in {n for n, _ in held}
        for d in stack.fingerprint(node).devices
    }
    over = {k: v for k, v in held.items() if v > totals[k]}
    assert not over, f"devices over-committed (MiB handed out): {over}"
    names = {p["metadata"]["name"] for p in pods}
    assert set(nodes_of) <= names, f"held by pods not bound: {set(nodes_of) - names}"
