"""The extender under hostile input: newer kube-schedulers' fields, absurd
quantities, bodies over the limit or not the gzip they claim to be, a
500k-name filter beside plan requests, and caches that stay bounded whatever
names and demands arrive."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from typing import Any

import aiohttp
import msgspec
import pytest
from structlog.testing import capture_logs

from hcs_bus.bus import Bus
from hcs_bus.messages import PlanRequest, Requests
from scheduler.extender import rules as placing
from scheduler.extender import wire
from scheduler.extender.caches import NodeCache, PodMemo
from scheduler.extender.http import serve
from scheduler.plan.pods import PodInfo
from scheduler.plan.service import ask_plan
from tests.metering import counted
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import (
    A100_TWO,
    a100_slice,
    k8s_doc,
    node_fp,
    pod,
    pod_info,
    post,
    publish_fleet,
    state_of,
    until,
)

NAMES = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]


async def _ready(bus: Bus, start: Start) -> Any:
    await publish_fleet(bus, *(node_fp(n) for n in NAMES))
    sched = await start(bus)
    await until(lambda: len(sched.view.state.nodes) == 3)
    return sched


def _filter_args(**pod_kw: Any) -> dict[str, Any]:
    args = k8s_doc("extender-filter-args-nodecache.json")
    args["Pod"] = pod("trainer", uid="uid-trainer", **pod_kw)
    return args


async def test_fields_a_newer_kube_scheduler_adds_are_ignored_on_every_verb(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = _filter_args(plan=A100_TWO)
    args["FutureTopLevel"] = {"v": 2}
    args["Pod"]["spec"]["futureSpecField"] = [1, 2]
    status, out = await post(sched.port, "filter", args)
    assert status == 200 and out["NodeNames"] == NAMES and out["Error"] == ""
    status, out = await post(sched.port, "prioritize", args)
    assert status == 200 and [h["Host"] for h in out] == NAMES
    preempt = k8s_doc("extender-preempt-args-nodecache.json")
    preempt["Pod"] = pod("trainer", plan=A100_TWO, priority=100)
    preempt["FutureTopLevel"] = True
    for victims in preempt["NodeNameToMetaVictims"].values():
        victims["FutureVictimsField"] = "x"
        for p in victims["Pods"]:
            p["FuturePodField"] = 1
    status, out = await post(sched.port, "preempt", preempt)
    assert status == 200 and set(out) == {"NodeNameToMetaVictims"}
    binding = {**k8s_doc("extender-binding-args.json"), "FutureBindingField": "x"}
    status, out = await post(sched.port, "bind", binding)
    assert status == 200 and set(out) == {"Error"}


async def test_what_hcs_owns_inside_the_envelope_stays_strict(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    status, out = await post(sched.port, "filter", _filter_args(plan={**A100_TWO, "surprise": 1}))
    assert status == 200 and out["NodeNames"] == []
    reasons = out["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NAMES)
    assert all("hcs.io/plan" in why and "surprise" in why for why in reasons.values())


@pytest.mark.parametrize(
    "quantity",
    ['"1e400"', "1e400", '"nan"', '"inf"', '"1e9999999999"', '"-1e400"', "-1e400", '"1e-400Gi"'],
)
async def test_an_absurd_quantity_refuses_the_pod_by_resource_never_the_call(
    bus: Bus, start_scheduler: Start, quantity: str
) -> None:
    """kube-scheduler wants HTTP 200 for a pod it may not place (docs/architecture.md#kubernetes-wire-facts):
    filter names the resource on every node, as unresolvable; prioritize
    scores 0; preempt proposes nothing."""
    sched = await _ready(bus, start_scheduler)
    marker = "7357"
    args = _filter_args(requests={"ai.compute/vram": marker})
    text = json.dumps(args).replace(f'"{marker}"', quantity)  # bare JSON numbers too
    assert text.count(quantity) == 2  # the request and the limit
    status, out = await post(sched.port, "filter", text.encode())
    assert status == 200, out
    assert out["NodeNames"] == [] and out["Error"] == "" and not out["FailedNodes"]
    reasons = out["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(NAMES)
    assert all("ai.compute/vram" in why for why in reasons.values()), reasons
    status, out = await post(sched.port, "prioritize", text.encode())
    assert status == 200 and out == [{"Host": n, "Score": 0} for n in NAMES]
    preempt = k8s_doc("extender-preempt-args-nodecache.json")
    preempt["Pod"] = args["Pod"]
    body = json.dumps(preempt).replace(f'"{marker}"', quantity).encode()
    status, out = await post(sched.port, "preempt", body)
    assert status == 200 and out == {"NodeNameToMetaVictims": {}}


async def test_a_body_over_the_limit_gets_413_naming_the_limit(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    runner = await serve(sched.extender.app(max_body_bytes=4096), host="127.0.0.1", port=0)
    try:
        port = runner.addresses[0][1]
        args = _filter_args(plan=A100_TWO)
        args["NodeNames"] = [f"node-{i}" for i in range(1000)]
        status, text = await post(port, "filter", args)
        assert status == 413 and "4096 bytes" in text

        async def chunked() -> Any:  # no Content-Length: the limit holds while reading
            yield json.dumps(args).encode()

        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/filter", data=chunked()) as resp:
                assert resp.status == 413 and "4096 bytes" in await resp.text()
        status, out = await post(port, "filter", _filter_args(plan=A100_TWO))
        assert status == 200 and out["NodeNames"] == NAMES
    finally:
        await runner.cleanup()


async def _post_encoded(port: int, verb: str, body: bytes, encoding: str) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}/{verb}", data=body, headers=headers) as r:
            return r.status, await r.text()


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
async def test_a_body_that_is_not_valid_gzip_gets_400_naming_the_encoding_on_every_verb(
    bus: Bus, start_scheduler: Start, caplog: pytest.LogCaptureFixture, verb: str
) -> None:
    sched = await _ready(bus, start_scheduler)
    before = counted("hcs_extender_refusals", verb=verb, reason="bad_encoding")
    body = json.dumps(_filter_args(plan=A100_TWO)).encode()  # JSON, not gzip
    with capture_logs() as logs, caplog.at_level(logging.DEBUG, logger="aiohttp"):
        status, text = await _post_encoded(sched.port, verb, body, "gzip")
    assert status == 400, text
    assert f"hcs: {verb}:" in text and "not valid gzip (Content-Encoding: gzip)" in text
    assert counted("hcs_extender_refusals", verb=verb, reason="bad_encoding") == before + 1
    (logged,) = [e for e in logs if e["event"] == "extender_body_refused"]
    assert logged["verb"] == verb and logged["reason"] == "bad_encoding"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no aiohttp traceback


async def test_gzip_bodies_are_read_and_a_gzip_bomb_stops_at_the_limit_with_413(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = gzip.compress(json.dumps(_filter_args(plan=A100_TWO)).encode())
    status, text = await _post_encoded(sched.port, "filter", args, "gzip")
    assert status == 200 and json.loads(text)["NodeNames"] == NAMES
    runner = await serve(sched.extender.app(max_body_bytes=65536), host="127.0.0.1", port=0)
    try:
        port = runner.addresses[0][1]
        bomb = gzip.compress(b" " * (64 * 1024 * 1024))
        before = counted("hcs_extender_refusals", verb="filter", reason="too_large")
        status, text = await _post_encoded(port, "filter", bomb, "gzip")
        assert status == 413 and "65536 bytes" in text, text
        assert counted("hcs_extender_refusals", verb="filter", reason="too_large") == before + 1
        status, text = await _post_encoded(port, "filter", args, "gzip")
        assert status == 200 and json.loads(text)["NodeNames"] == NAMES
    finally:
        await runner.cleanup()


async def test_plans_keep_answering_while_a_500k_name_filter_runs(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = _filter_args(plan=A100_TWO)
    args["NodeNames"] = [*NAMES, *(f"fuzz-node-{i:06d}" for i in range(500_000))]
    body = json.dumps(args).encode()
    request = PlanRequest(namespace="ml", requests=Requests(vram_mib=16384), dry_run=True)
    assert (await ask_plan(bus, request, timeout_s=2)).ok
    loop = asyncio.get_running_loop()

    async def huge_filter() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{sched.port}/filter"
            async with session.post(url, data=body) as resp:
                return resp.status, await resp.read()

    filtering = asyncio.create_task(huge_filter())
    latencies: list[float] = []
    while not filtering.done():
        began = loop.time()
        plan = await ask_plan(bus, request, timeout_s=5)
        latencies.append(loop.time() - began)
        assert plan.ok
    status, raw = await filtering
    assert status == 200
    out = json.loads(raw)
    assert out["NodeNames"] == NAMES and len(out["FailedAndUnresolvableNodes"]) == 500_000
    assert len(latencies) >= 5, latencies  # plans were asked while the filter ran
    assert max(latencies) < 1.0, max(latencies)


async def test_many_demands_and_names_over_http_keep_only_known_nodes_in_bounded_caches(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    cache = sched.extender.cache
    for i in range(100):
        plan = {**A100_TWO, "devices": 1, "vram_mib_per_device": 1000 + i, "whole_device": False}
        args = _filter_args(plan=plan)
        args["Pod"]["metadata"]["uid"] = f"uid-{i}"
        args["NodeNames"] = [*NAMES, *(f"ghost-{i}-{j}" for j in range(500))]
        status, out = await post(sched.port, "filter", args)
        assert status == 200 and out["NodeNames"] == NAMES
    assert cache.demands == 64
    assert cache.budget.used == 64 * len(NAMES)  # the ghosts were answered, never kept
    assert len(sched.extender.pods) == 100


def test_demand_caches_hold_at_most_their_entry_budget_and_still_answer_past_it() -> None:
    state = state_of(*(node_fp(f"n{i}") for i in range(40)))
    cache = NodeCache(state, weights=_weights(), max_demands=8, max_entries=100)
    names = [f"n{i}" for i in range(40)]
    for i in range(50):
        passed, failed, never = cache.of(a100_slice(1000 + i)).filter([*names, "ghost"])
        assert passed == names and not failed and set(never) == {"ghost"}
        held = sum(len(c.entries) for c in cache._by_demand.values())
        assert cache.budget.used == held <= 100
        assert cache.demands <= 8
    for name in names:  # a change drops entries and gives their budget back
        cache.changed(name)
    assert cache.budget.used == 0


def test_the_least_recently_used_demand_goes_first() -> None:
    state = state_of(node_fp("n0"))
    cache = NodeCache(state, weights=_weights(), max_demands=2)
    first = cache.of(a100_slice(1))
    cache.of(a100_slice(2))
    assert cache.of(a100_slice(1)) is first  # used again: now the newest
    cache.of(a100_slice(3))
    assert cache.of(a100_slice(1)) is first and cache.demands == 2


def _pod(uid: str, *, name: str = "p") -> PodInfo:
    return pod_info(name, namespace="ns", uid=uid)


def test_the_pod_memo_is_bounded_in_pods_and_in_bytes() -> None:
    memo = PodMemo(max_pods=50, max_bytes=64 * 1024)
    for i in range(200):
        memo.put(f"uid-{i}", _pod(f"uid-{i}", name="x" * 500))
        assert len(memo) <= 50 and memo.bytes <= 64 * 1024
    assert memo.get("uid-199") is not None and memo.get("uid-0") is None
    memo.put("huge", _pod("huge", name="x" * 2048))  # over a 64th of the bytes: not kept
    assert memo.get("huge") is None
    before = memo.bytes
    assert memo.pop("uid-199") is not None and memo.bytes < before


def _weights() -> placing.Weights:
    return placing.Weights()


def test_every_answer_we_write_still_decodes_strictly() -> None:
    answer = wire.ExtenderFilterResult(node_names=["a"], failed={"b": "why"})
    strict = msgspec.json.Decoder(wire.ExtenderFilterResult)
    assert strict.decode(wire.ENCODER.encode(answer)) == answer
    with pytest.raises(msgspec.ValidationError):
        strict.decode(b'{"NodeNames": [], "Surprise": 1}')


@pytest.mark.parametrize("max_entries", [100_000, 2])
def test_the_best_node_is_the_first_of_the_highest_scores_whether_or_not_entries_are_kept(
    max_entries: int,
) -> None:
    from hcs_bus.messages import NodeReservations
    from tests.view.factories import reservation

    state = state_of(*(node_fp(f"n{i}") for i in range(6)))
    for node, used in (("n2", 2), ("n4", 5)):  # bin-packing prefers the fuller node
        held = tuple(reservation("ml", f"{node}-{i}", [(i, 81920, True)]) for i in range(used))
        state.apply_reservations(node, NodeReservations(node=node, reservations=held))
    cache = NodeCache(state, weights=_weights(), max_entries=max_entries).of(a100_slice(8192))
    names = [f"n{i}" for i in range(6)]
    scores = {n: cache.entry(n).score for n in names}
    assert scores["n4"] > scores["n2"] > scores["n0"] == scores["n1"] == scores["n3"]
    assert cache.best(names) == "n4"
    assert cache.best(["n0", "n2", "n3"]) == "n2"
    assert cache.best(["n3", "n1", "n0"]) == "n3"  # a tie: the first in kube-scheduler's order
    # prioritize's answer: every name's score, kept or not, an unknown one 0
    listed = json.loads(cache.plain_scores([*names, "ghost"]))
    assert listed == [{"Host": n, "Score": scores[n]} for n in names] + [
        {"Host": "ghost", "Score": 0}
    ]
    assert json.loads(cache.plain_scores(names)) == listed[:-1]


def test_the_all_fit_answers_match_the_general_ones_and_drop_with_any_change() -> None:
    from hcs_bus.messages import NodeReservations
    from tests.view.factories import reservation

    state = state_of(*(node_fp(f"n{i}") for i in range(5)))
    nodes = NodeCache(state, weights=_weights())
    cache = nodes.of(a100_slice(8192))
    names = [f"n{i}" for i in range(5)]
    assert cache.best_if_all_fit(names) is None  # nothing kept yet: the general path
    assert cache.plain_scores_if_all_fit(names) is None
    assert cache.filter(names) == (names, {}, {})  # which keeps every entry
    assert cache.best_if_all_fit(names) == cache.best(names) == "n0"  # a tie: the first
    assert cache.best_if_all_fit(["ghost", *names]) is None  # one unknown: the general path
    assert cache.best_if_all_fit([]) is None
    whole = cache.plain_scores_if_all_fit(list(reversed(names)))  # by host, in any order
    assert whole is not None
    assert sorted(json.loads(whole), key=lambda h: h["Host"]) == json.loads(
        cache.plain_scores(names)
    )
    assert cache.plain_scores_if_all_fit(names[:4]) is None  # not every fitting node
    assert cache.plain_scores_if_all_fit([*names[:4], "ghost"]) is None

    # n3 fills up: its entry is dropped, the bytes built for all five go with it
    held = tuple(reservation("ml", f"n3-{i}", [(i, 81920, True)]) for i in range(8))
    state.apply_reservations("n3", NodeReservations(node="n3", reservations=held))
    nodes.changed("n3")
    assert cache.best_if_all_fit(names) is None  # n3 no longer fits
    passed, failed, _never = cache.filter(names)
    assert "n3" in failed and passed == ["n0", "n1", "n2", "n4"]
    assert cache.plain_scores_if_all_fit(names) is None
    fitting = cache.plain_scores_if_all_fit(passed)
    assert fitting is not None and {h["Host"] for h in json.loads(fitting)} == set(passed)


def test_picks_last_until_booked_refused_or_expired_and_stay_bounded() -> None:
    from scheduler.extender.caches import Picks

    now = [0.0]
    picks = Picks(hold_s=10.0, max_pods=3, clock=lambda: now[0])
    demand = a100_slice(8192)
    booked: set[str] = set()
    picks.add("u1", "ml/p1", "n1", demand)
    picks.add("u2", "ml/p2", "n1", demand)
    assert picks.on("n1", besides="u1", booked=booked.__contains__) == [demand]  # not its own
    assert picks.on("n2", besides="", booked=booked.__contains__) == []
    booked.add("ml/p1")  # the view holds p1's reservation now
    assert picks.on("n1", besides="", booked=booked.__contains__) == [demand]
    assert len(picks) == 1
    picks.add("u2", "ml/p2", "n2", demand)  # filtered again: one pick per pod, the last
    assert picks.on("n1", besides="", booked=booked.__contains__) == []
    now[0] = 10.0  # its time is up
    assert picks.on("n2", besides="", booked=booked.__contains__) == [] and len(picks) == 0
    for i in range(5):  # whatever is sent to the port, at most max_pods are held
        picks.add(f"x{i}", f"ml/x{i}", "n3", demand)
    assert len(picks) == 3
    assert len(picks.on("n3", besides="", booked=booked.__contains__)) == 3
    picks.drop("x4")
    assert len(picks) == 2
