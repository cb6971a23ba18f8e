"""A compromised node cannot hurt the pool, on the real cluster: a plan
request whose reply subject is a JetStream API call changes nothing, and
binds of a placed pod to two other nodes through two scheduler replicas
leave it on its one node, with ``hcs check`` clean after both. (Two binds
racing before either reserves: ``tests/scheduler/test_replicas.py``.)"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from hcs_bus import kvkeys, messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import Plan, PlanRequest, PodRef, Policy, ReleaseRequest, Requests
from scheduler.ledger import audit_store as checking
from tests.e2e.api import wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.test_ledger import _hcs_check
from tests.e2e.workloads import Workloads, fleet_labelled

pytestmark = pytest.mark.faults

SLICE = {"ai.compute/vram": "32Gi"}
ON_A100 = {"hcs.io/models": "A100-80G"}
REPLICA_B = "scheduler-b"


async def _snapshot(bus: Bus) -> dict[str, Any]:
    """Every ledger key and value, and each stream's message count."""
    values = dict(await kvkeys.stored_values(bus, streams.KV_ALLOC))
    counts = {}
    for name in ("HCS_HEALTH", "HCS_ALLOC", "HCS_DLQ", "KV_hcs_alloc", "KV_hcs_ckpt"):
        counts[name] = (await bus.js.stream_info(name)).state.messages
    return {"values": values, "counts": counts}


def test_plan_requests_replying_into_the_jetstream_api_change_nothing_on_the_cluster(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    for i in range(2):
        work.pod(f"held-{i}", SLICE, annotations=ON_A100)
    for i in range(2):
        work.running(f"held-{i}")
    wait_for(  # both marked bound: nothing of theirs changes the ledger any more
        lambda: (
            sum(
                1
                for doc in stack.on_bus(checking.read_ledger).values()
                for r in doc.reservations
                if r.pod.namespace == work.namespace and r.state == "bound"
            )
            == 2
        ),
        what="both reservations bound",
        timeout_s=30,
    )

    async def attack(bus: Bus) -> tuple[dict[str, Any], dict[str, Any], Plan]:
        before = await _snapshot(bus)
        nodes = [k for k in before["values"] if "=" not in k]
        replies = [
            f"$JS.API.STREAM.PURGE.KV_{streams.KV_ALLOC}",
            "$JS.API.STREAM.PURGE.HCS_HEALTH",
            "$JS.API.STREAM.DELETE.HCS_DLQ",
            "$JS.API.STREAM.PURGE.KV_hcs_ckpt",
            *(f"$KV.{streams.KV_ALLOC}.{n}" for n in nodes),
        ]
        plan = PlanRequest(namespace=work.namespace, requests=Requests(vram_mib=1024))
        pledging = PlanRequest(
            namespace=work.namespace,
            requests=Requests(vram_mib=1024),
            policy=Policy(),
            pod_name="ghost",
            admission_uid="forged",
        )
        release = ReleaseRequest(pod=PodRef(namespace=work.namespace, name="held-0"))
        bodies = {
            subjects.PLACE: messages.encode(pledging),
            subjects.PLACE_DRY: messages.encode(
                PlanRequest(namespace=work.namespace, requests=plan.requests, dry_run=True)
            ),
            subjects.RELEASE: messages.encode(release),
        }
        for reply in replies:
            for subject, body in bodies.items():
                await bus.nc.publish(subject, body, reply=reply)
        await bus.nc.flush()
        # answered in order after the forged ones: the service has seen them all
        dry = PlanRequest(namespace=work.namespace, requests=plan.requests, dry_run=True)
        answered = await bus.request(subjects.PLACE_DRY, dry, Plan, timeout_s=10)
        return before, await _snapshot(bus), answered

    before, after, answered = stack.on_bus(attack)
    assert answered.ok, answered.reason
    assert after == before
    assert stack.on_bus(checking.read_ledger)  # the ledger is still there
    status, lines = _hcs_check(stack)
    assert status == 0, "\n".join(lines)


def _bind(url: str, context: ssl.SSLContext, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=30, context=context) as answer:
        found: dict[str, Any] = json.loads(answer.read())
        return found


def test_binds_of_a_bound_pod_to_two_other_nodes_through_two_replicas_leave_it_on_one(
    stack: Stack, work: Workloads
) -> None:
    """A replayed or forged pair of binds (kube-scheduler's certificate, two
    replicas, two other nodes, at once) for a pod HCS already placed: both
    are refused by the pod's claim, the pod keeps its one reservation."""
    fleet_labelled(work, FLEET)
    other = stack.start_replica(REPLICA_B)
    other.wait_until(lambda: stack.replica_ready(REPLICA_B), what="ready", timeout_s=60)
    try:
        work.pod("twice", SLICE, annotations=ON_A100)
        pod = work.running("twice")
        meta, home = pod["metadata"], pod["spec"]["nodeName"]
        elsewhere = [n for n in ("gpu-a100-0", "gpu-a100-1", "gpu-a100-2") if n != home]
        context = stack.tls_context(as_kube_scheduler=True)
        binds = [
            (
                f"https://127.0.0.1:{stack.extender_ports[replica]}/bind",
                {
                    "PodName": meta["name"],
                    "PodNamespace": meta["namespace"],
                    "PodUID": meta["uid"],
                    "Node": node,
                },
            )
            for replica, node in zip(("scheduler", REPLICA_B), elsewhere, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = list(pool.map(lambda b: _bind(b[0], context, b[1]), binds))
        errors = [a.get("Error", "") for a in answers]
        assert all(f"already holds a reservation on node {home}" in e for e in errors), errors
        ledger = stack.on_bus(checking.read_ledger)
        holders = [
            node
            for node, doc in ledger.items()
            for r in doc.reservations
            if r.pod.name == "twice" and r.pod.namespace == work.namespace
        ]
        assert holders == [home], (holders, errors)
        assert work.get("twice")["spec"]["nodeName"] == home
        status, lines = _hcs_check(stack)
        assert status == 0, "\n".join(lines)
    finally:
        stack.one_replica_again()
