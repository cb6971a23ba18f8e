"""The shared pool's queue on a real control plane.

Gangs of two one-device ranks wait behind HCS's gate on the A100s while
single pods (never counted in a share, never reclaimed) hold every device.
Room appears one gang at a time, by deleting one such pod, and the gang that
starts is read off the pods (gate lifted, every rank bound):

* the order follows priority, then the weighted dominant share the
  namespace has once the gang runs (lowest first: a namespace of higher
  weight pays less for the same ask), then age; a gang of a higher
  PriorityClass submitted last starts first, and the gang ``hcs queue``
  prints first is the one that starts next. The namespaces' guarantees are
  below one gang's ask, so no gang is owed a reclaim, and no namespace's
  share stays above a waiting gang's without one of its gangs, so no fair
  reclaim is made: the order alone decides (reclaim: test_pool);
* a ceiling holds under a burst: 20 gangs at once in a namespace whose
  ``spec.hard`` allows three; never more than three gangs' ranks pledged or
  bound at any sample, the others wait with a ``GangWaiting`` Event naming
  the ceiling (``hcs queue`` gives the same reason), the ledger's use is
  exactly the ceiling, and a gang submitted once the ceiling is full queues
  the same way (admitted, waiting).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hcs_bus import vocabulary
from tests.e2e.api import ApiError, wait_for
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import FLEET, clean_namespace
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, fleet_labelled

ONE_DEVICE = {"ai.compute/devices": "1"}
A100 = {"hcs.io/models": "A100-80G"}
A100S, RANKS = 24, 2  # the fleet's A100s (tests/e2e/fleet.yaml); ranks of each gang
GANG_ACU, GANG_VRAM_GI = 100 * RANKS, 80 * RANKS  # one gang's ask on A100-80G
URGENT = 1000  # the value of the test's PriorityClass
CEILING_GANGS, BURST = 3, 20


# -- namespaces ----------------------------------------------------------------
@pytest.fixture
def more_namespaces(stack: Stack, cluster: Cluster) -> Iterator[Callable[[], Workloads]]:
    """Makes further namespaces, cleaned up as the ``namespace`` fixture does."""
    made: list[str] = []

    def make() -> Workloads:
        name = f"e2e-{uuid.uuid4().hex[:8]}"
        cluster.namespace(name)
        made.append(name)
        return Workloads(stack, namespace=name)

    yield make
    clean_namespace(cluster, stack, *made)


@pytest.fixture
def urgent(cluster: Cluster) -> Iterator[str]:
    """A PriorityClass above every other pod of the tier (kube-scheduler
    preempts nothing for it: HCS starts its gang only where room is free)."""
    name = f"e2e-urgent-{uuid.uuid4().hex[:6]}"
    cluster.api.create(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": URGENT,
            "preemptionPolicy": "Never",
        }
    )
    yield name
    cluster.api.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def _quota(work: Workloads, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": "hcs.io/v1alpha1",
        "kind": "ComputeQuota",
        "metadata": {"name": "pool"},
        "spec": spec,
    }
    work.api.create(body, namespace=work.namespace)


# -- gangs ---------------------------------------------------------------------
def _member(work: Workloads, job: str, rank: int, **spec: Any) -> dict[str, Any]:
    """Rank ``rank`` of a gang of ``RANKS`` bare pods (``hcs.io/job`` and its size)."""
    return work.pod(
        f"{job}-{rank}",
        ONE_DEVICE,
        labels={vocabulary.JOB: job},
        annotations={vocabulary.JOB_SIZE: str(RANKS), **A100},
        **spec,
    )


def _gang(work: Workloads, job: str, **spec: Any) -> list[dict[str, Any]]:
    return [_member(work, job, rank, **spec) for rank in range(RANKS)]


def _gated(pod: dict[str, Any]) -> bool:
    gates = [g.get("name") for g in pod["spec"].get("schedulingGates") or []]
    return vocabulary.GANG_GATE in gates


def _by_job(work: Workloads) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in work.pods():
        job = pod["metadata"].get("labels", {}).get(vocabulary.JOB)
        if job and not pod["metadata"].get("deletionTimestamp"):
            out.setdefault(job, []).append(pod)
    return out


def _started(works: list[Workloads]) -> set[str]:
    """The gangs whose ranks are all ungated and bound, as ``namespace/job``."""
    return {
        f"{w.namespace}/{job}"
        for w in works
        for job, pods in _by_job(w).items()
        if len(pods) == RANKS and all(p["spec"].get("nodeName") and not _gated(p) for p in pods)
    }


def _told(work: Workloads, pod: str) -> list[str]:
    events = work.api.items(
        f"/api/v1/namespaces/{work.namespace}/events?fieldSelector=involvedObject.name={pod}"
    )
    return [e.get("message", "") for e in events if e.get("reason") == "GangWaiting"]


def _waits(work: Workloads, job: str) -> None:
    """Every rank of ``job`` gated and holding nothing, its gang told it waits."""
    wait_for(
        lambda: _told(work, f"{job}-0"),
        what=f"a GangWaiting Event on {job}-0",
        timeout_s=30,
        explain=lambda: work.explain(f"{job}-0"),
    )
    pods = _by_job(work)[job]
    assert len(pods) == RANKS and all(_gated(p) and not p["spec"].get("nodeName") for p in pods)


def _hcs_queue(stack: Stack) -> dict[str, Any]:
    """``hcs queue --json`` run as an operator would, as the scheduler's account."""
    kubeconfig = stack.cluster.service_account_kubeconfig("hcs-system", "hcs-scheduler")
    env = {**os.environ, "HCS_KUBE__MODE": "kubeconfig", "HCS_KUBE__KUBECONFIG": str(kubeconfig)}
    hcs = Path(sys.executable).with_name("hcs")
    done = subprocess.run(
        [str(hcs), "queue", "--json", "--nats-url", stack.nats.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _fill_a100s(work: Workloads) -> list[str]:
    """Single pods of two devices on every A100 (bound); their names."""
    names = [f"hold-{i}" for i in range(A100S // 2)]
    for name in names:
        work.pod(name, {"ai.compute/devices": "2"}, annotations=A100)
    for name in names:
        work.running(name)
    return names


def _delete(work: Workloads, name: str) -> None:
    work.api.delete(f"{work.pods_path}/{name}", {"gracePeriodSeconds": 0})


def test_gangs_start_by_priority_then_weighted_dominant_share_then_age_as_hcs_queue_shows(
    stack: Stack, work: Workloads, more_namespaces: Callable[[], Workloads], urgent: str
) -> None:
    fleet_labelled(work, FLEET)
    a, b, c = more_namespaces(), more_namespaces(), more_namespaces()
    for ns, weight, acu in ((a, 1, 20), (b, 2, 40), (c, 4, 60)):  # guarantees under one gang
        _quota(ns, {"guaranteed": {"acu": acu}, "weight": weight})
    holds = _fill_a100s(work)
    label = {a.namespace: "a", b.namespace: "b", c.namespace: "c"}
    works = [a, b, c]
    for ns, job in ((a, "a1"), (a, "a2"), (b, "b1"), (b, "b2"), (c, "c1"), (c, "c2")):
        _gang(ns, job)  # one after the other: oldest first
        _waits(ns, job)

    order: list[str] = []

    def room_for_one() -> str:
        """Delete one holding pod (two A100s: one gang's room); the gang that starts."""
        before = _started(works)
        _delete(work, holds.pop())
        new = wait_for(
            lambda: _started(works) - before,
            what="a waiting gang started on the room of one deleted pod",
            timeout_s=60,
            explain=lambda: str({w.namespace: sorted(_by_job(w)) for w in works}),
        )
        assert len(new) == 1, f"two gangs started on the room of one: {new}"
        ns, job = next(iter(new)).split("/")
        order.append(job)
        assert label[ns] == {"u": "a"}.get(job, job[0]), (ns, job)
        return job

    # the share once each runs (X: one gang's share at weight 1): c's gangs
    # X/4, b's X/2, a's X: c1 first, though younger; then c2 (2X/4) ties
    # with b's (X/2) and the older b1 goes; then c2 (X/2) before b2 (X)
    for _ in range(3):
        room_for_one()
    assert order == ["c1", "b1", "c2"], order
    # held now: c two gangs, b one, a none; weighted dominant shares
    # c = b > a = 0. A gang of a, urgent and newest, goes first.
    _gang(a, "u", priorityClassName=urgent)
    _waits(a, "u")
    queue = _hcs_queue(stack)
    shares = {n["namespace"]: n for n in queue["namespaces"] if n["namespace"] in label}
    assert shares[c.namespace]["weight"] == 4 and shares[c.namespace]["guaranteed"]["acu"] == 60
    by = {label[ns]: row["dominant_share"] for ns, row in shares.items()}
    assert by["c"] == by["b"] > by["a"] == 0, by

    for _ in range(4):  # the gang ``hcs queue`` shows first is the one that starts
        queue = _hcs_queue(stack)
        shown = [  # the gangs waiting whole (not the pledges of pods being bound)
            q
            for q in queue["queue"]
            if q["namespace"] in label and q["reason"].startswith("gang waits")
        ]
        job = room_for_one()
        assert shown[0]["job"].split("/")[1] == job, json.dumps(shown, indent=1)
        if job == "u":
            assert shown[0]["priority"] == URGENT, shown[0]
    # u: priority; then b2 (X once it runs) before the older a1 and a2 (2X
    # once either runs, a holding u)
    assert order == ["c1", "b1", "c2", "u", "b2", "a1", "a2"], order


def test_twenty_gangs_at_once_under_a_ceiling_for_three_never_pledge_past_it(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    ceiling_gi = CEILING_GANGS * GANG_VRAM_GI
    _quota(work, {"hard": {"vram": f"{ceiling_gi}Gi"}})
    jobs = [f"g{i:02d}" for i in range(BURST)]

    def create(job: str) -> list[str]:
        """The gang's members; what admission refused of them."""
        refused = []
        for rank in range(RANKS):
            try:
                _member(work, job, rank)
            except ApiError as exc:
                if exc.status >= 500:
                    raise
                refused.append(f"{job}-{rank}: {exc}")
        return refused

    most = 0  # the most ranks ungated or bound at any sample

    def sample() -> dict[str, list[dict[str, Any]]]:
        nonlocal most
        gangs = _by_job(work)
        going = [p for pods in gangs.values() for p in pods if not _gated(p)]
        most = max(most, len(going))
        assert most <= CEILING_GANGS * RANKS, [p["metadata"]["name"] for p in going]
        return gangs

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        creating = [pool.submit(create, job) for job in jobs]
        while not all(f.done() for f in creating):  # sampled while the burst goes in
            sample()
        refused = [r for f in creating for r in f.result()]
    assert not refused, f"gang members refused at admission: {refused}"

    def waiting(gangs: dict[str, list[dict[str, Any]]]) -> list[str]:
        return [job for job, pods in gangs.items() if all(_gated(p) for p in pods)]

    def settled() -> bool:
        gangs = sample()
        bound = [p for pods in gangs.values() for p in pods if p["spec"].get("nodeName")]
        if len(bound) != CEILING_GANGS * RANKS:
            return False
        left = waiting(gangs)
        return len(left) == BURST - CEILING_GANGS and all(
            any("at its ceiling" in m for m in _told(work, f"{job}-0")) for job in left
        )

    wait_for(
        settled,
        what=f"{CEILING_GANGS} gangs bound and the other {BURST - CEILING_GANGS} told of "
        "the ceiling",
        timeout_s=60,
        explain=lambda: str(
            {
                j: [(_gated(p), p["spec"].get("nodeName")) for p in ps]
                for j, ps in _by_job(work).items()
            }
        ),
    )
    assert most == CEILING_GANGS * RANKS
    said = _told(work, waiting(_by_job(work))[0] + "-0")
    assert any(re.search(rf"ceiling {ceiling_gi} GiB", m) for m in said), said

    def used() -> dict[str, Any] | None:
        cq = work.api.get(f"/apis/hcs.io/v1alpha1/namespaces/{work.namespace}/computequotas/pool")
        found = (cq.get("status") or {}).get("used") or {}
        return found if found.get("devices") == CEILING_GANGS * RANKS else None

    found = wait_for(used, what="ComputeQuota status.used from the ledger", timeout_s=60)
    assert found["vram"] == f"{ceiling_gi}Gi", found
    queue = _hcs_queue(stack)
    queued = [q for q in queue["queue"] if q["namespace"] == work.namespace]
    assert len(queued) == BURST - CEILING_GANGS, json.dumps(queue, indent=1)
    assert all("at its ceiling" in q["reason"] for q in queued), json.dumps(queued, indent=1)

    # a gang submitted once the ceiling is full queues as well: admitted, waiting
    late = create("late")
    assert not late, f"a gang past a full ceiling was refused at admission, not queued: {late}"
    wait_for(
        lambda: any("at its ceiling" in m for m in _told(work, "late-0")),
        what="a GangWaiting Event naming the ceiling on the late gang",
        timeout_s=30,
        explain=lambda: work.explain("late-0"),
    )
