"""``hcs check`` on the pledges: a pledge carried by a pod it is not for, a
bound pod whose pledge is unspent, a spent pledge whose pod is gone, an
unspent pledge the sweep should have dropped, a pod that spent two. Pure
rules first (``scheduler.ledger.pledge_audit_rules``), then the reader on a real bus with
both storage forms (``pledges=<ns>`` documents and ``pledges=<ns>=<id>``)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hcs_bus import streams
from hcs_bus.bus import Bus
from hcs_bus.errors import BadMessage
from hcs_bus.settings import SchedulerSettings
from scheduler.ledger import audit_store as checking
from scheduler.ledger import pledge_audit_rules as pledgecheck
from scheduler.ledger.audit_rules import Problem
from scheduler.ledger.pledge_audit_rules import Limits
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge

NOW = 10_000.0
LIMITS = Limits(ttl_s=600.0, grace_s=60.0, orphan_after_s=30.0, slack_s=10.0)


def _pledge(pid: str, *, for_pod: str = "", age_s: float = 5.0, **kw: Any) -> Pledge:
    return Pledge(
        id=pid,
        vendor="nvidia",
        model="A100-80G",
        devices=1,
        vram_mib_per_device=32768,
        time_s=NOW - age_s,
        name=for_pod,
        **kw,
    )


def _spent(pid: str, *, by: str, uid: str, ago_s: float = 5.0, **kw: Any) -> Pledge:
    return _pledge(pid, for_pod=by, age_s=ago_s + 1, spent_s=NOW - ago_s, uid=uid, pod=by, **kw)


def _pod(name: str, *, pledge: str = "", node: str | None = None, ns: str = "ml") -> dict[str, Any]:
    notes = {"hcs.io/pledge": pledge} if pledge else {}
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "annotations": notes},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def _check(
    *held: Pledge,
    pods: list[dict[str, Any]],
    ns: str = "ml",
    reserved: frozenset[str] = frozenset(),
) -> list[Problem]:
    docs = {ns: NamespacePledges(namespace=ns, pledges=held)}
    return pledgecheck.problems(docs=docs, pods_now=pods, now=NOW, limits=LIMITS, reserved=reserved)


# ------------------------------------------------------------ pure rules --


def test_a_consistent_ledger_of_pledges_reports_nothing() -> None:
    held = (
        _spent("p1", by="bound", uid="uid-bound", ago_s=300),  # its pod is alive
        _pledge("p2", for_pod="pending", age_s=5),  # admitted, not bound yet
        _pledge("p3", generate_name="job-", age_s=45),  # carried by job-x, under the TTL
        _pledge("p4", for_pod="coming", age_s=20),  # no pod yet, inside the orphan window
        _spent("p5", by="deleted", uid="uid-deleted", ago_s=30),  # pod gone, inside the grace
    )
    pods = [
        _pod("bound", pledge="p1", node="gpu-1"),
        _pod("pending", pledge="p2"),
        _pod("job-x", pledge="p3"),
        _pod("plain", node="gpu-1"),  # no pledge: none of this check's business
        _pod("late", pledge="swept-since", node="gpu-1"),  # its spent pledge was swept: fine
    ]
    assert _check(*held, pods=pods) == []


def test_a_pod_carrying_a_pledge_made_for_another_pod_is_a_copied_note() -> None:
    found = _check(
        _pledge("p1", for_pod="owner"), pods=[_pod("owner", pledge="p1"), _pod("copy", pledge="p1")]
    )
    assert [(p.kind, p.pod, p.pledge) for p in found] == [
        ("pledge of another pod", "ml/copy", "p1")
    ]
    assert "made for pod ml/owner" in found[0].detail


def test_a_pod_carrying_a_pledge_spent_by_another_pod_is_a_copied_note() -> None:
    pods = [_pod("owner", pledge="p1", node="gpu-1"), _pod("copy", pledge="p1", node="gpu-2")]
    found = _check(_spent("p1", by="owner", uid="uid-owner"), pods=pods)
    assert [(p.kind, p.node, p.pod) for p in found] == [
        ("pledge of another pod", "gpu-2", "ml/copy")
    ]
    assert "spent by pod ml/owner (uid uid-owner)" in found[0].detail
    assert found[0].line().startswith("pledge of another pod: node gpu-2 ml/copy: pledge p1")


def test_a_pod_of_the_same_name_but_another_uid_does_not_own_the_spent_pledge() -> None:
    replaced = _pod("web", pledge="p1", node="gpu-1")  # uid-web; the pledge was spent by uid-old
    found = _check(_spent("p1", by="web", uid="uid-old", ago_s=5), pods=[replaced])
    assert [p.kind for p in found] == ["pledge of another pod"]


def test_a_bound_pod_whose_pledge_is_unspent_is_reported() -> None:
    found = _check(_pledge("p1", for_pod="fast"), pods=[_pod("fast", pledge="p1", node="gpu-3")])
    assert [(p.kind, p.node, p.pod, p.pledge) for p in found] == [
        ("bound pod with unspent pledge", "gpu-3", "ml/fast", "p1")
    ]


def test_an_unspent_pledge_a_reservation_carries_is_not_reported() -> None:
    """Without a quota bind spends nothing: the reservation carries the id."""
    pods = [_pod("fast", pledge="p1", node="gpu-3")]
    assert _check(_pledge("p1", for_pod="fast"), pods=pods, reserved=frozenset({"p1"})) == []


@pytest.mark.parametrize(("ago_s", "reported"), [(59, False), (61, True)])
def test_a_spent_pledge_whose_pod_is_gone_is_reported_after_the_grace(
    ago_s: float, reported: bool
) -> None:
    found = _check(_spent("p1", by="gone", uid="uid-gone", ago_s=ago_s), pods=[])
    assert [(p.kind, p.pod, p.pledge) for p in found] == (
        [("spent pledge without pod", "ml/gone", "p1")] if reported else []
    )


def test_a_spent_pledge_whose_pod_was_replaced_under_its_name_is_without_pod() -> None:
    newcomer = _pod("web")  # uid-web, carries no pledge
    found = _check(_spent("p1", by="web", uid="uid-old", ago_s=120), pods=[newcomer])
    assert [p.kind for p in found] == ["spent pledge without pod"]
    assert "uid uid-old" in found[0].detail


@pytest.mark.parametrize(("age_s", "reported"), [(609, False), (611, True)])
def test_an_unspent_pledge_past_the_ttl_and_its_slack_is_reported_even_when_carried(
    age_s: float, reported: bool
) -> None:
    found = _check(_pledge("p1", for_pod="stuck", age_s=age_s), pods=[_pod("stuck", pledge="p1")])
    assert [(p.kind, p.pod) for p in found] == (
        [("expired pledge", "ml/stuck")] if reported else []
    )


@pytest.mark.parametrize(("age_s", "reported"), [(39, False), (41, True)])
def test_an_unspent_pledge_no_pod_carries_past_the_orphan_window_is_reported(
    age_s: float, reported: bool
) -> None:
    found = _check(
        _pledge("p1", generate_name="burst-", age_s=age_s), pods=[_pod("other", pledge="p2")]
    )
    assert [(p.kind, p.node, p.pod, p.pledge) for p in found] == (
        [("orphaned pledge", "", "ml/burst-*", "p1")] if reported else []
    )
    if reported:
        assert found[0].line() == (
            "orphaned pledge: ml/burst-*: pledge p1 unspent for 41 s and carried by no pod"
            " (orphans are dropped after 30 s)"
        )


def test_a_pledge_carried_in_another_namespace_is_still_an_orphan() -> None:
    elsewhere = _pod("x", pledge="p1", ns="other")
    found = _check(_pledge("p1", for_pod="x", age_s=100), pods=[elsewhere])
    assert [(p.kind, p.pod) for p in found] == [("orphaned pledge", "ml/x")]


def test_two_pledges_spent_by_one_pod_are_reported_once() -> None:
    held = (
        _spent("p1", by="greedy", uid="uid-greedy"),
        _spent("p2", by="greedy", uid="uid-greedy"),
        _spent("p3", by="fine", uid="uid-fine"),
    )
    pods = [_pod("greedy", pledge="p1", node="gpu-1"), _pod("fine", pledge="p3", node="gpu-1")]
    found = _check(*held, pods=pods)
    assert [(p.kind, p.node, p.pod, p.pledge) for p in found] == [
        ("pod spent two pledges", "gpu-1", "ml/greedy", "p1,p2")
    ]


def test_the_default_ttl_is_the_schedulers_pledge_ttl() -> None:
    assert Limits().ttl_s == SchedulerSettings().pledge_ttl_s
    assert checking.LIMITS.ttl_s == SchedulerSettings().pledge_ttl_s


# ------------------------------------------------------- on a real bus --


async def _put(bus: Bus, key: str, value: bytes) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(key, value)


async def test_pledges_are_read_in_both_forms_and_deleted_ones_are_gone(bus: Bus) -> None:
    doc = NamespacePledges(namespace="team", pledges=(_pledge("q1"), _pledge("q2")))
    await _put(bus, "pledges=team", msgspec.json.encode(doc))
    await _put(bus, "pledges=dev=d1", msgspec.json.encode(_pledge("d1")))
    await _put(bus, "pledges=dev=d2", msgspec.json.encode(_pledge("d2")))
    await _put(bus, "pledges=dev=d3", b"")  # empty value: gone
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.delete("pledges=dev=d2")
    await _put(bus, "pledges=old=o1", msgspec.json.encode(_pledge("o1")))
    await kv.purge("pledges=old=o1")
    found = await checking.read_pledges(bus)
    assert {ns: [p.id for p in d.pledges] for ns, d in found.items()} == {
        "team": ["q1", "q2"],
        "dev": ["d1"],
    }
    assert await checking.read_ledger(bus) == {}  # pledge keys are no node's document


async def test_a_corrupt_pledge_is_named_by_its_key(bus: Bus) -> None:
    await _put(bus, "pledges=dev=bad", b'{"id": 3}')
    with pytest.raises(BadMessage, match="pledges=dev=bad"):
        await checking.read_pledges(bus)


async def test_check_reports_pledge_problems_from_both_forms_and_fails(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    apiserver.add_pod(
        "team", "owner", node="gpu-1", uid="uid-owner", annotations={"hcs.io/pledge": "q1"}
    )
    apiserver.add_pod("team", "copy", uid="uid-copy", annotations={"hcs.io/pledge": "q1"})
    apiserver.add_pod(
        "dev", "fast", node="gpu-2", uid="uid-fast", annotations={"hcs.io/pledge": "d1"}
    )
    team = NamespacePledges(
        namespace="team",
        pledges=(
            _spent("q1", by="owner", uid="uid-owner"),
            _pledge("q2", for_pod="never", age_s=50),
        ),
    )
    await _put(bus, "pledges=team", msgspec.json.encode(team))
    await _put(bus, "pledges=dev=d1", msgspec.json.encode(_pledge("d1", for_pod="fast")))
    gone = _spent("d2", by="deleted", uid="uid-deleted", ago_s=90)
    await _put(bus, "pledges=dev=d2", msgspec.json.encode(gone))
    lines: list[str] = []
    status = await checking.run(
        bus, kube, settle_s=0.05, limits=LIMITS, out=lines.append, clock=lambda: NOW
    )
    assert status == 1
    assert lines[0].splitlines() == [
        "bound pod with unspent pledge: node gpu-2 dev/fast: pledge d1 is unspent and"
        " no reservation carries it",
        "orphaned pledge: team/never: pledge q2 unspent for 50 s and carried by no pod"
        " (orphans are dropped after 30 s)",
        "pledge of another pod: team/copy: pledge q1 was spent by pod team/owner (uid uid-owner)"
        " (a copied plan note)",
        "spent pledge without pod: dev/deleted: pledge d2 spent 90 s ago by a pod that is gone"
        " (uid uid-deleted); it and the pod's reservation should have been released",
        "4 inconsistencies",
    ]


async def test_a_pledge_spent_between_the_two_readings_is_not_reported(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    apiserver.add_pod(
        "dev", "fast", node="gpu-2", uid="uid-fast", annotations={"hcs.io/pledge": "d1"}
    )
    await _put(bus, "pledges=dev=d1", msgspec.json.encode(_pledge("d1", for_pod="fast")))
    readings: list[float] = []

    def clock() -> float:  # the bind's spend lands once the first reading is taken
        readings.append(NOW)
        return NOW

    class Spending:
        async def list_pods(self, **_kw: Any) -> list[dict[str, Any]]:
            pods = await kube.list_pods()
            if len(readings) == 1:
                spent = _spent("d1", by="fast", uid="uid-fast")
                await _put(bus, "pledges=dev=d1", msgspec.json.encode(spent))
            return pods

    first = await checking.inconsistencies(bus, Spending(), limits=LIMITS, clock=clock)  # type: ignore[arg-type]
    assert [p.kind for p in first] == ["bound pod with unspent pledge"]  # the unsettled reading
    await _put(bus, "pledges=dev=d1", msgspec.json.encode(_pledge("d1", for_pod="fast")))
    readings.clear()
    assert await checking.check(bus, Spending(), settle_s=0.01, limits=LIMITS, clock=clock) == []  # type: ignore[arg-type]
