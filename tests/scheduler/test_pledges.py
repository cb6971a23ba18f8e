"""Pledges' pure rules (``scheduler.ledger.pledge_rules``) and plans that count them:
never over capacity or quota counting pledges, pledge → spent → reservation
→ gone, expiry, single use."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus.messages import PlanRequest, PodRef, Policy, Requests
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge
from scheduler.plan import rules as planning
from tests.scheduler.helpers import DB, node_fp, state_of

A100 = "nvidia/A100-80G"
T4 = "nvidia/T4"


def _pledge(
    i: int, *, devices: int = 1, vram: int = 81920, whole: bool = True, **kw: object
) -> Pledge:
    fields: dict = {
        "id": f"p{i}",
        "vendor": "nvidia",
        "model": "A100-80G",
        "devices": devices,
        "vram_mib_per_device": vram,
        "whole_device": whole,
        "acu_per_device": 100.0,
        "time_s": 0.0,
        "name": f"pod-{i}",
    }
    fields.update(kw)
    return Pledge(**fields)


def _summary(*fps: object) -> planning.Summary:
    return planning.summarise(state_of(*fps).nodes.values())  # type: ignore[arg-type]


def _charge(summary: planning.Summary, docs: dict[str, NamespacePledges]) -> planning.Summary:
    live = [p for d in docs.values() for p in pledges.outstanding(d, reserved=summary.pledge_ids)]
    return planning.charged(
        summary,
        by_class=pledges.per_class(live),
        by_namespace=pledges.usage_by_namespace(docs, reserved=summary.pledge_ids),
    )


def _plan(
    requests: Requests, summary: planning.Summary, *, ns: str = "ml", quota: object = None
) -> object:
    request = PlanRequest(namespace=ns, requests=requests, policy=Policy())
    return planning.plan(request, summary=summary, profiles=DB, quota=quota)  # type: ignore[arg-type]


def _made(plan: object, i: int) -> Pledge:
    return Pledge(
        id=f"p{i}",
        vendor=plan.vendor,  # type: ignore[attr-defined]
        model=plan.model,  # type: ignore[attr-defined]
        devices=plan.devices,  # type: ignore[attr-defined]
        vram_mib_per_device=plan.vram_mib_per_device,  # type: ignore[attr-defined]
        whole_device=plan.whole_device,  # type: ignore[attr-defined]
        acu_per_device=plan.acu_per_device,  # type: ignore[attr-defined]
        name=f"pod-{i}",
    )


def test_a_burst_spreads_over_classes_once_pledges_fill_the_best_one() -> None:
    # one T4 node with 4 devices, one A100 node: 16 GiB pods fit a T4 best,
    # so the first 4 go there, then the A100s take the rest
    summary = _summary(node_fp("t4-1", T4, count=4), node_fp("a100-1", A100, count=8))
    doc = NamespacePledges(namespace="ml")
    models = []
    for i in range(8):
        plan = _plan(Requests(vram_mib=15000, acu=10), _charge(summary, {"ml": doc}))
        assert plan.ok, plan.reason  # type: ignore[attr-defined]
        models.append(plan.model)  # type: ignore[attr-defined]
        doc = pledges.with_pledge(doc, _made(plan, i), namespace="ml")
    assert models[:4] == ["T4"] * 4
    assert set(models[4:]) == {"A100-80G"}


def test_a_quota_counts_pledges_so_a_burst_stops_at_the_quota() -> None:
    summary = _summary(node_fp("a100-1", A100, count=8))
    quota = planning.QuotaLimits(vram_mib=2 * 81920)
    doc = NamespacePledges(namespace="ml")
    admitted = 0
    for i in range(20):
        plan = _plan(Requests(devices=1), _charge(summary, {"ml": doc}), quota=quota)
        if plan.ok:  # type: ignore[attr-defined]
            admitted += 1
            doc = pledges.with_pledge(doc, _made(plan, i), namespace="ml")
        else:
            assert "quota of namespace ml exceeded" in plan.reason  # type: ignore[attr-defined]
    assert admitted == 2


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from([Requests(devices=1), Requests(devices=2), Requests(vram_mib=20000)]),
        min_size=1,
        max_size=40,
    ),
    nodes=st.integers(min_value=1, max_value=3),
)
def test_pledges_made_while_a_class_has_room_never_exceed_its_capacity(
    sizes: list[Requests], nodes: int
) -> None:
    summary = _summary(*(node_fp(f"a100-{n}", A100, count=4) for n in range(nodes)))
    stats = summary.classes[A100]
    doc = NamespacePledges(namespace="ml")
    for i, req in enumerate(sizes):
        charged = _charge(summary, {"ml": doc})
        plan = _plan(req, charged)
        if not plan.ok or "no node has room now" in plan.reason:  # type: ignore[attr-defined]
            continue
        doc = pledges.with_pledge(doc, _made(plan, i), namespace="ml")
        total = pledges.held(doc.pledges)
        idle, free = pledges.room_left(
            idle_devices=stats.idle_devices,
            free_mib=stats.free_mib,
            vram_mib=stats.vram_mib,
            pledged=total,
        )
        assert idle >= 0 and free >= 0, (total, stats.idle_devices)


@settings(max_examples=60, deadline=None)
@given(
    asks=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=30),
    hard=st.integers(min_value=1, max_value=10),
)
def test_a_quota_is_never_passed_counting_pledges(asks: list[int], hard: int) -> None:
    summary = _summary(node_fp("a100-1", A100, count=8), node_fp("a100-2", A100, count=8))
    quota = planning.QuotaLimits(vram_mib=hard * 81920)
    doc = NamespacePledges(namespace="ml")
    for i, n in enumerate(asks):
        plan = _plan(Requests(devices=n), _charge(summary, {"ml": doc}), quota=quota)
        if plan.ok:  # type: ignore[attr-defined]
            doc = pledges.with_pledge(doc, _made(plan, i), namespace="ml")
    assert pledges.held(doc.pledges).vram_mib <= hard * 81920


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["spend", "reserve", "sweep", "copy", "bind_unquoted"]),
            st.integers(0, 4),
        ),
        max_size=40,
    )
)
def test_pledge_turns_into_a_reservation_once_and_is_counted_once(
    steps: list[tuple[str, int]],
) -> None:
    """Whatever the order of binds, copies, reservations showing up and sweeps:
    a pledge is spent by one pod only, and each promise is counted exactly once
    (as an outstanding pledge or as its reservation) until it is swept. A
    bind without a quota (``bind_unquoted``) spends nothing: its reservation
    carries the pledge id."""
    doc = NamespacePledges(namespace="ml", pledges=tuple(_pledge(i) for i in range(5)))
    reserved: set[str] = set()
    spenders: dict[str, str] = {}
    now = 0.0
    for action, i in steps:
        now += 1.0
        pid = f"p{i}"
        if action in ("spend", "copy"):
            ref = PodRef(
                namespace="ml", name=f"pod-{i}" if action == "spend" else "thief", uid=f"u{i}"
            )
            verdict = pledges.spend_verdict(doc, pid, ref=ref)
            if verdict.outcome == "spend":
                doc = pledges.spent(doc, pid, ref=ref, now=now)
                spenders[pid] = ref.name
            elif verdict.ok:
                assert spenders[pid] == ref.name
            if action == "copy":
                assert verdict.outcome in ("used", "foreign", "missing"), verdict
        elif action == "reserve" and pid in spenders:
            reserved.add(pid)
        elif action == "bind_unquoted" and pledges.find(doc, pid) is not None:
            reserved.add(pid)
        elif action == "sweep":
            expired, done = pledges.sweep(
                doc, now=now, ttl_s=1000.0, grace_s=3.0, reserved=reserved
            )
            assert not expired
            assert all(p.id in reserved for p in done)
            doc = pledges.without(doc, [p.id for p in done])
        counted = {p.id for p in pledges.outstanding(doc, reserved=reserved)}
        assert not counted & reserved  # never both
        assert counted | reserved >= {p.id for p in doc.pledges}
    assert set(spenders.values()) <= {f"pod-{i}" for i in range(5)}


def test_an_unspent_pledge_expires_after_its_ttl_and_a_spent_one_stays_until_reserved() -> None:
    doc = NamespacePledges(
        namespace="ml",
        pledges=(_pledge(1, time_s=0.0), _pledge(2, time_s=0.0, spent_s=5.0, uid="u", pod="pod-2")),
    )
    expired, done = pledges.sweep(doc, now=50.0, ttl_s=100.0, grace_s=10.0)
    assert (expired, done) == ([], [])
    expired, done = pledges.sweep(doc, now=101.0, ttl_s=100.0, grace_s=10.0, reserved={"p2"})
    assert [p.id for p in expired] == ["p1"]
    assert [p.id for p in done] == ["p2"]
    # a spent pledge whose reservation never shows (the Binding failed, the pod left)
    expired, done = pledges.sweep(doc, now=106.0, ttl_s=100.0, grace_s=10.0)
    assert [p.id for p in done] == ["p2"]


def test_a_pledge_no_quota_spends_is_retired_by_its_reservation() -> None:
    doc = NamespacePledges(namespace="ml", pledges=(_pledge(1, time_s=0.0), _pledge(2, time_s=0.0)))
    assert [p.id for p in pledges.outstanding(doc, reserved={"p1"})] == ["p2"]
    expired, done = pledges.sweep(doc, now=5.0, ttl_s=100.0, grace_s=10.0, reserved={"p1"})
    assert (expired, done) == ([], [])  # within the grace: other views catch up first
    expired, done = pledges.sweep(doc, now=11.0, ttl_s=100.0, grace_s=10.0, reserved={"p1"})
    assert expired == [] and [p.id for p in done] == ["p1"]
    expired, done = pledges.sweep(doc, now=101.0, ttl_s=100.0, grace_s=10.0, reserved={"p1"})
    assert [p.id for p in expired] == ["p2"] and [p.id for p in done] == ["p1"]


def test_a_pledge_is_spent_by_the_pod_it_was_made_for_only() -> None:
    doc = NamespacePledges(
        namespace="ml",
        pledges=(_pledge(1), _pledge(2, name="", generate_name="web-")),
    )
    me = PodRef(namespace="ml", name="pod-1", uid="u1")
    assert pledges.spend_verdict(doc, "p1", ref=me).outcome == "spend"
    other = PodRef(namespace="ml", name="pod-9", uid="u9")
    assert pledges.spend_verdict(doc, "p1", ref=other).outcome == "foreign"
    assert pledges.spend_verdict(doc, "p2", ref=PodRef(namespace="ml", name="web-x1")).ok
    assert pledges.spend_verdict(doc, "p2", ref=other).outcome == "foreign"
    after = pledges.spent(doc, "p1", ref=me, now=1.0)
    assert pledges.spend_verdict(after, "p1", ref=me).outcome == "again"
    replaced = msgspec.structs.replace(me, uid="u2")  # same name, a new pod
    assert pledges.spend_verdict(after, "p1", ref=replaced).outcome == "used"
    assert pledges.spend_verdict(after, "nope", ref=me).outcome == "missing"


def test_pledge_documents_never_look_like_node_keys() -> None:
    key = pledges.key_for("ml-team")
    assert pledges.is_pledge_key(key) and "=" in key and "." not in key
    assert pledges.namespace_of(key) == "ml-team"
    own = pledges.key_for("ml-team", "0a1b")
    assert own == "pledges=ml-team=0a1b" and "." not in own
    assert pledges.parse_key(own) == ("ml-team", "0a1b")
    assert pledges.parse_key(key) == ("ml-team", "")


MLU = "cambricon/MLU370-X8"  # 24 GiB a device: one 16 GiB slice each, not one and a half


def _pinned(vendor: str, vram_mib: int) -> PlanRequest:
    return PlanRequest(
        namespace="ml", requests=Requests(vram_mib=vram_mib), policy=Policy(vendors=(vendor,))
    )


def test_slices_pledged_to_a_class_count_what_packing_wastes() -> None:
    # 8 devices of 24 GiB hold 8 slices of 16 GiB (their 192 GiB would hold 12)
    summary = _summary(node_fp("mlu-1", MLU, count=8))
    device_mib = summary.classes[MLU].vram_mib
    assert device_mib // 16384 == 1 and 8 * device_mib // 16384 == 12
    doc = NamespacePledges(namespace="ml")
    made = 0
    for i in range(14):
        request = _pinned("cambricon", 16384)
        plan = planning.plan(
            request, summary=_charge(summary, {"ml": doc}), profiles=DB, quota=None
        )
        if "no node has room now" in plan.reason:
            break
        doc = pledges.with_pledge(doc, _made(plan, i), namespace="ml")
        made += 1
    assert made == 8, made


def test_a_burst_of_slices_spreads_once_the_packed_class_is_full() -> None:
    summary = _summary(node_fp("mlu-1", MLU, count=8), node_fp("a100-1", A100, count=8))
    doc = NamespacePledges(namespace="ml")
    models = []
    for i in range(20):
        plan = _plan(Requests(vram_mib=16384), _charge(summary, {"ml": doc}))
        assert plan.ok, plan.reason  # type: ignore[attr-defined]
        models.append(plan.model)  # type: ignore[attr-defined]
        doc = pledges.with_pledge(doc, _made(plan, i), namespace="ml")
    assert models.count("MLU370-X8") <= 8


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(min_value=1024, max_value=24576),
    devices=st.integers(min_value=1, max_value=8),
    asks=st.integers(min_value=1, max_value=40),
)
def test_pledged_slices_of_one_size_always_pack_and_fill_the_class(
    size: int, devices: int, asks: int
) -> None:
    summary = _summary(node_fp("mlu-1", MLU, count=devices))
    stats = summary.classes[MLU]
    per_device = stats.vram_mib // size
    held = pledges.Held()
    made = 0
    for _ in range(asks):
        charged = replace_pledged(stats, held)
        sizing = planning.Sizing(1, size, False, 0.0, 0.0, "")
        if not planning.has_room(charged, sizing):
            break
        held = held.plus(_pledge(made, vram=size, whole=False, vendor="cambricon", model="x"))
        made += 1
    assert made == min(asks, devices * per_device)


def replace_pledged(stats: planning.ClassStats, held: pledges.Held) -> planning.ClassStats:
    import dataclasses

    return dataclasses.replace(stats, pledged=held)


def test_the_slices_pledged_are_kept_by_size_and_merged() -> None:
    a = pledges.Held().plus(_pledge(1, vram=16384, whole=False))
    b = (
        pledges.Held()
        .plus(_pledge(2, vram=8192, whole=False, devices=2))
        .plus(_pledge(3, vram=16384, whole=False))
    )
    assert a.add(b).slices == ((8192, 2), (16384, 2))
    assert pledges.Held().plus(_pledge(4)).slices == ()  # a whole device is no slice


def test_whole_device_pledges_leave_slices_only_the_devices_they_do_not_take() -> None:
    # 8 devices of 24 GiB: 4 pledged whole and 4 pledged 16 GiB slices leave none;
    # their MiB (96 + 64 of 192) would still show 32 GiB free
    stats = _summary(node_fp("mlu-1", MLU, count=8)).classes[MLU]
    held = pledges.Held()
    for i in range(4):
        held = held.plus(_pledge(i, vram=stats.vram_mib, whole=True))
        held = held.plus(_pledge(10 + i, vram=16384, whole=False))
    assert held.slice_mib == 4 * 16384
    sizing = planning.Sizing(1, 16384, False, 0.0, 0.0, "")
    assert not planning.has_room(replace_pledged(stats, held), sizing)
    fewer = pledges.Held().plus(_pledge(0, vram=stats.vram_mib, whole=True))
    for i in range(6):
        fewer = fewer.plus(_pledge(10 + i, vram=16384, whole=False))
    assert planning.has_room(replace_pledged(stats, fewer), sizing)  # 7 of 8 taken


def test_a_pledge_retired_by_its_reservation_going_leaves_the_tally_uncounted_again(
    monkeypatch: object,
) -> None:
    """The sweep drops the pledges whose reservation the view shows, hundreds
    a round under a burst; the next plans' tally is the one kept (it never
    counted them), while an outstanding pledge that goes is counted out."""
    from scheduler.ledger.pledge_store import Pledger

    reserved, outstanding, other = _pledge(1), _pledge(2), _pledge(3, devices=2)
    summary = planning.Summary(classes={}, usage={}, pledge_ids=frozenset({reserved.id}))
    pledger = Pledger(kv=None, summary=lambda: summary)  # type: ignore[arg-type]
    for rev, p in enumerate((reserved, outstanding, other), start=1):
        pledger.apply(pledges.key_for("ml", p.id), msgspec.json.encode(p), rev)
    both, one = pledges.held([outstanding, other]), pledges.held([other])
    counted: list[int] = []
    tallied = pledges.tallied

    def counting(found: object) -> object:
        out = tallied(found)  # type: ignore[arg-type]
        counted.append(out[2])
        return out

    monkeypatch.setattr(pledges, "tallied", counting)  # type: ignore[attr-defined]
    assert pledger.by_namespace(fresh=True)["ml"] == (both, 2)
    assert counted == [2]
    pledger.apply(pledges.key_for("ml", reserved.id), None, 4)  # swept: its reservation is seen
    assert pledger.by_namespace(fresh=True)["ml"] == (both, 2)
    assert counted == [2]  # the tally kept
    pledger.apply(pledges.key_for("ml", outstanding.id), None, 5)  # released: its pod deleted
    assert pledger.by_namespace(fresh=True)["ml"] == (one, 1)
    assert counted == [2, 1]
