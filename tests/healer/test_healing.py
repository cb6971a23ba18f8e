"""The healer end to end: a real nats-server, the API double, small windows."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hcs_bus import checkpoint, messages, subjects, tasks
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.messages import HealthEvent, Telemetry
from hcs_bus.settings import HealerSettings
from healer import acting, rules
from healer.acting import Actor
from healer.checkpointing import REQUEST_FILE, Sidecar
from healer.healing import Healer
from tests.apiserver import ApiServer
from tests.healer.conftest import bound, fingerprint, health

OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
Make = Callable[..., Awaitable[Healer]]


async def wait_until(cond: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def make(bus: Bus) -> AsyncIterator[Make]:
    made: list[Healer] = []

    async def build(
        kube: Kube | None,
        *,
        dry_run: bool = False,
        identity: str = "h1",
        durable: str | None = None,
        fraction: float = 0.5,
        stale_s: float = 60.0,
        failed_share: float = 0.5,
    ) -> Healer:
        settings = HealerSettings(
            dry_run=dry_run,
            degraded_window_s=0.3,
            recovery_window_s=0.6,
            checkpoint_wait_s=5.0,
            breaker_max_fraction=fraction,
            retry_period_s=0.1,
            renew_deadline_s=1.0,
            lease_duration_s=1.5,
        )
        rule_set = msgspec.structs.replace(
            rules.load(degraded_window_s=0.3, recovery_window_s=0.6),
            min_change_interval_s=0.05,
            node_stale_s=stale_s,
            taint_failed_share=failed_share,
        )
        actor = Actor(bus=bus, kube=kube, dry_run=dry_run, retry_initial_s=0.05, retry_max_s=0.2)
        healer = Healer(
            bus,
            kube,
            settings,
            identity=identity,
            rule_set=rule_set,
            actor=actor,
            durable=durable or f"t-{uuid.uuid4().hex[:8]}",
            telemetry_every_s=0.05,
        )
        await healer.start()
        made.append(healer)
        return healer

    yield build
    for healer in made:
        await healer.stop()
        if healer.durable.startswith("t-"):
            try:
                await healer.bus.js.delete_consumer("HCS_HEALTH", f"{healer.durable}-health")
            except Exception:
                pass


async def publish(bus: Bus, event: Any, subject: str) -> None:
    await bus.publish(subject, event, msg_id=uuid.uuid4().hex)


def our_taint(api: ApiServer, node: str) -> dict[str, Any] | None:
    taints = api.nodes[node].get("spec", {}).get("taints") or []
    return next((t for t in taints if t["key"] == "hcs.io/unhealthy"), None)


def condition(api: ApiServer, node: str) -> dict[str, Any] | None:
    conds = api.nodes[node]["status"].get("conditions") or []
    return next((c for c in conds if c["type"] == "HCSHealthy"), None)


async def collect(bus: Bus, subject: str) -> tuple[list[Any], Any]:
    got: list[Any] = []

    async def on(msg: Any) -> None:
        got.append(msgspec.json.decode(msg.data))

    return got, await bus.nc.subscribe(subject, cb=on)


async def ready(healer: Healer) -> None:
    await wait_until(lambda: healer.ready.is_set())


async def test_a_fatal_xid_taints_without_clobbering_and_recovery_untaints(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1", taints=[OTHER])
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube, failed_share=0.25)  # one device of four taints
    await ready(healer)
    verdicts, sub = await collect(bus, subjects.healer_health("n1"))
    await publish(bus, health("n1", code=79, device=1), subjects.health("n1"))
    await wait_until(lambda: our_taint(apiserver, "n1") is not None)
    assert our_taint(apiserver, "n1")["effect"] == "NoSchedule"  # type: ignore[index]
    assert OTHER in apiserver.nodes["n1"]["spec"]["taints"]
    await wait_until(lambda: (condition(apiserver, "n1") or {}).get("status") == "False")
    await wait_until(lambda: any(v.get("kind") == "verdict" for v in verdicts))
    device_verdict = next(v for v in verdicts if v["kind"] == "verdict" and v.get("device") == 1)
    assert (device_verdict["verdict"], device_verdict["health_score"]) == ("failed", 0)
    assert device_verdict["source"] == "healer" and device_verdict["evidence"]["code"] == 79
    for seq in range(2, 40):  # the device is back and healthy for longer than the window
        await publish(bus, fingerprint("n1", seq=seq), subjects.fp("n1"))
        if our_taint(apiserver, "n1") is None:
            break
        await asyncio.sleep(0.05)
    await wait_until(lambda: our_taint(apiserver, "n1") is None)
    assert apiserver.nodes["n1"]["spec"]["taints"] == [OTHER]
    await wait_until(lambda: (condition(apiserver, "n1") or {}).get("status") == "True")
    await sub.unsubscribe()


async def test_a_same_named_replacement_of_the_bound_pod_is_not_evicted(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    apiserver.add_pod("ml", "train-0", node="n1", uid="uid-of-the-replacement")
    await publish(bus, bound("n1", "train-0", (0,)), subjects.alloc("n1"))  # the old uid
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    await publish(bus, health("n1", code=79, device=0), subjects.health("n1"))

    def tried() -> bool:
        return any(r.resource == "pods/eviction" for r in apiserver.requests)

    await wait_until(tried)
    await healer.actor.wait_evictions()
    assert ("ml", "train-0") in apiserver.pods
    assert "ml/train-0" not in healer.actor.evicted


async def test_only_pods_on_the_failed_devices_are_evicted_and_a_pdb_refusal_is_retried(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    requests, sub = await collect(bus, "hcs.ckpt.request.>")
    for name, node in (("on-bad", "n1"), ("on-good", "n1"), ("elsewhere", "n2")):
        apiserver.add_pod("ml", name, node=node, labels={"app": name}, uid=f"uid-{name}")
    apiserver.add_pdb("ml", "pdb", match_labels={"app": "on-bad"}, min_available=1)
    await publish(bus, bound("n1", "on-bad", (0, 1), job="llama"), subjects.alloc("n1"))
    await publish(bus, bound("n1", "on-good", (2,)), subjects.alloc("n1"))
    await publish(bus, bound("n2", "elsewhere", (1,)), subjects.alloc("n2"))
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    await publish(bus, health("n1", code=79, device=1), subjects.health("n1"))

    def refusals() -> int:
        return sum(1 for r in apiserver.requests if r.resource == "pods/eviction")

    await wait_until(lambda: refusals() >= 2)
    assert ("ml", "on-bad") in apiserver.pods  # the PDB holds it
    apiserver.set_pdb("ml", "pdb", minAvailable=0)
    await wait_until(lambda: ("ml", "on-bad") not in apiserver.pods)
    assert {("ml", "on-good"), ("ml", "elsewhere")} <= set(apiserver.pods)
    evicted = {r.path.split("/")[-2] for r in apiserver.requests if r.resource == "pods/eviction"}
    assert evicted == {"on-bad"}
    assert requests == []  # failed: evicted at once, no checkpoint request
    await sub.unsubscribe()


async def test_dry_run_publishes_the_actions_and_calls_no_api(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    apiserver.add_pod("ml", "p", node="n1", uid="uid-p")
    await publish(bus, bound("n1", "p", (0,)), subjects.alloc("n1"))
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube, dry_run=True, failed_share=0.25)
    await ready(healer)
    events, sub = await collect(bus, subjects.healer_health("n1"))
    await publish(
        bus, health("n1", kind="device_lost", device=0, severity="fatal"), subjects.health("n1")
    )
    await wait_until(
        lambda: (
            {e["evidence"].get("action") for e in events if e["kind"] == "action"}
            >= {"taint", "evict"}
        )
    )
    taint = next(e for e in events if e["kind"] == "action" and e["evidence"]["action"] == "taint")
    assert taint["evidence"]["dry_run"] is True
    assert taint["evidence"]["taint"].endswith(":NoSchedule")
    assert taint["evidence"]["pods"] == "ml/p"
    writes = [
        r
        for r in apiserver.requests
        if r.verb in ("patch", "create", "update") and not r.resource.startswith("leases")
    ]
    assert writes == [] and our_taint(apiserver, "n1") is None
    await sub.unsubscribe()


async def test_without_a_cluster_the_single_healer_leads_and_publishes_verdicts(
    bus: Bus, make: Make
) -> None:
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(None, dry_run=True)
    await ready(healer)
    events, sub = await collect(bus, subjects.healer_health("n1"))
    await publish(
        bus, health("n1", kind="device_lost", device=0, severity="fatal"), subjects.health("n1")
    )
    await wait_until(lambda: any(e["kind"] == "verdict" and e["device"] == 0 for e in events))
    verdict = next(e for e in events if e["kind"] == "verdict" and e["device"] == 0)
    assert verdict["verdict"] == "failed" and verdict["source"] == "healer"
    await sub.unsubscribe()


async def test_two_healers_with_one_lease_only_one_acts(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    durable = f"t-{uuid.uuid4().hex[:8]}"
    a = await make(kube, identity="a", durable=durable, failed_share=0.25)
    b = await make(kube, identity="b", durable=durable, failed_share=0.25)
    await wait_until(lambda: a.leader.is_leader or b.leader.is_leader)
    await asyncio.sleep(0.3)  # several retry periods: the other never wins
    assert [a.leader.is_leader, b.leader.is_leader].count(True) == 1
    leader = a if a.leader.is_leader else b
    await ready(leader)
    verdicts, sub = await collect(bus, subjects.healer_health("n1"))
    await publish(bus, health("n1", code=79, device=0), subjects.health("n1"))
    await wait_until(lambda: our_taint(apiserver, "n1") is not None)
    await asyncio.sleep(0.3)
    taint_writes = [r for r in apiserver.requests if r.resource == "nodes" and r.verb == "patch"]
    assert len(taint_writes) == 1
    assert len([v for v in verdicts if v["kind"] == "verdict" and v.get("device") == 0]) == 1
    lease = apiserver.leases[("hcs-system", "hcs-healer")]
    assert lease["spec"]["holderIdentity"] == leader.leader.identity
    await sub.unsubscribe()


async def test_degraded_asks_for_a_checkpoint_and_evicts_after_it_arrives(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make, tmp_path: Path
) -> None:
    apiserver.add_node("n1")
    apiserver.add_pod("ml", "trainer-0", node="n1", uid="uid-trainer-0")
    await checkpoint.report(bus, namespace="ml", job="llama", uri="old", step=10)
    await publish(bus, bound("n1", "trainer-0", (0,), job="llama"), subjects.alloc("n1"))
    sidecar = Sidecar(bus, root=tmp_path, namespace="ml", job="llama", interval_s=0.05)
    side = asyncio.get_running_loop().create_task(sidecar.run())
    saved_at: list[float] = []
    evicted_at: list[float] = []
    apiserver.before("create", "pods/eviction", lambda: evicted_at.append(time.monotonic()))

    async def trainer() -> None:  # saves when asked through the request file
        await wait_until(lambda: (tmp_path / REQUEST_FILE).exists())
        (tmp_path / "checkpoint-20").mkdir()
        (tmp_path / "checkpoint-20" / "trainer_state.json").write_text("{}")
        saved_at.append(time.monotonic())

    train = asyncio.get_running_loop().create_task(trainer())
    healer = await make(kube)
    await ready(healer)
    slow = Telemetry(throttle_reasons=("hw_slowdown",), temperature_c=50)
    try:
        for seq in range(1, 60):
            await publish(bus, fingerprint("n1", seq=seq, telemetry=slow), subjects.fp("n1"))
            if ("ml", "trainer-0") not in apiserver.pods:
                break
            await asyncio.sleep(0.05)
        await wait_until(lambda: ("ml", "trainer-0") not in apiserver.pods)
        assert our_taint(apiserver, "n1")["effect"] == "PreferNoSchedule"  # type: ignore[index]
        latest = await checkpoint.latest(bus, namespace="ml", job="llama")
        assert latest is not None and latest.step == 20
        assert saved_at and evicted_at and evicted_at[0] > saved_at[0]
    finally:
        train.cancel()
        side.cancel()
        await asyncio.gather(train, side, return_exceptions=True)


async def test_the_breaker_alerts_instead_of_isolating_too_many_nodes(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    nodes = [f"b{i}" for i in range(10)]
    for node in nodes:
        apiserver.add_node(node)
        await publish(bus, fingerprint(node), subjects.fp(node))
    healer = await make(kube, fraction=0.2, failed_share=0.25)  # 2 of 10
    await ready(healer)
    await wait_until(lambda: len(healer.fleet.nodes) == 10)
    alerts, sub = await collect(bus, "hcs.health.*")
    for node in nodes[:4]:
        await publish(bus, health(node, code=79, device=0), subjects.health(node))
    await wait_until(lambda: len([a for a in alerts if a["kind"] == "breaker_open"]) == 2)
    await wait_until(lambda: sum(our_taint(apiserver, n) is not None for n in nodes) >= 2)
    tainted = [n for n in nodes if our_taint(apiserver, n) is not None]
    assert len(tainted) == 2
    assert {a["node"] for a in alerts if a["kind"] == "breaker_open"} == set(nodes[:4]) - set(
        tainted
    )
    await sub.unsubscribe()


async def test_a_node_whose_fingerprints_stop_is_lost_and_gets_no_execute(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube, stale_s=0.5)
    await ready(healer)
    await wait_until(lambda: our_taint(apiserver, "n1") is not None, timeout_s=5.0)
    taint = our_taint(apiserver, "n1")
    assert taint is not None and taint["effect"] == "NoExecute" and "timeAdded" in taint


async def test_unknown_kinds_are_counted_and_nothing_is_done(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    event = HealthEvent(
        node="n1", kind="gremlins", severity="fatal", source="agent", time_s=1.0, device=0
    )
    await publish(bus, event, subjects.health("n1"))
    await wait_until(lambda: healer.unknown == 1)
    assert our_taint(apiserver, "n1") is None
    assert messages.decode(messages.encode(event), HealthEvent).kind == "gremlins"


async def test_a_fatal_event_about_the_whole_node_evicts_every_hcs_pod_on_it(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    for name, node in (("a", "n1"), ("b", "n1"), ("elsewhere", "n2")):
        apiserver.add_pod("ml", name, node=node, uid=f"uid-{name}")
    await publish(bus, bound("n1", "a", (0,)), subjects.alloc("n1"))
    await publish(bus, bound("n1", "b", (2, 3)), subjects.alloc("n1"))
    await publish(bus, bound("n2", "elsewhere", (0,)), subjects.alloc("n2"))
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    event = health("n1", kind="aer_fatal", device=None, severity="fatal")  # no device index
    await publish(bus, event, subjects.health("n1"))
    await wait_until(lambda: not {("ml", "a"), ("ml", "b")} & set(apiserver.pods))
    assert ("ml", "elsewhere") in apiserver.pods
    assert our_taint(apiserver, "n1")["effect"] == "NoSchedule"  # type: ignore[index]


async def test_a_healer_that_stops_leading_stops_retrying_its_evictions(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    apiserver.add_pod("ml", "held", node="n1", labels={"app": "held"}, uid="uid-held")
    apiserver.add_pdb("ml", "pdb", match_labels={"app": "held"}, min_available=1)
    await publish(bus, bound("n1", "held", (0,)), subjects.alloc("n1"))
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    await publish(bus, health("n1", code=79, device=0), subjects.health("n1"))

    def evictions() -> int:
        return sum(1 for r in apiserver.requests if r.resource == "pods/eviction")

    await wait_until(lambda: evictions() >= 2)  # the PDB refuses; retried with backoff
    assert healer._leader_task is not None
    await tasks.stop(healer._leader_task)  # another replica takes over from here
    healer.leader._set(False)
    await wait_until(lambda: not healer.ready.is_set())
    await wait_until(lambda: not any(not t.done() for t in healer.actor._evictions.values()))
    after = evictions()
    await asyncio.sleep(0.5)  # several retry periods (≤ 0.2 s each): none may come
    assert evictions() == after and ("ml", "held") in apiserver.pods


async def test_a_taint_the_api_refused_until_the_actor_gave_up_is_applied_later(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube, failed_share=0.25)
    await ready(healer)
    healer.actor.attempts = 2
    tried: list[bool | None] = []
    taint = healer.actor.taint

    async def counting(node: str, **kw: Any) -> bool:
        done = await taint(node, **kw)
        tried.append(done)
        return done

    healer.actor.taint = counting  # type: ignore[method-assign]
    apiserver.fail("get", "nodes", code=503, times=10_000)  # the API is down
    await publish(bus, health("n1", code=79, device=0), subjects.health("n1"))
    await wait_until(lambda: len(tried) >= 1)  # the actor gave up once
    assert our_taint(apiserver, "n1") is None
    apiserver._hooks.clear()  # the API is back
    await wait_until(lambda: our_taint(apiserver, "n1") is not None)
    assert our_taint(apiserver, "n1")["effect"] == "NoSchedule"  # type: ignore[index]


async def test_the_condition_transition_time_moves_only_when_its_status_changes(
    bus: Bus, kube: Kube, apiserver: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.add_node("n1")
    actor = Actor(bus=bus, kube=kube, dry_run=False, retry_initial_s=0.05)
    clock = iter(f"2030-01-01T00:00:0{i}Z" for i in range(10))
    monkeypatch.setattr(acting, "_now_iso", lambda: next(clock))
    assert await actor.taint("n1", effect="PreferNoSchedule", reason="slow clocks", pods=[])
    first = condition(apiserver, "n1")
    assert first is not None and first["status"] == "False"
    assert await actor.taint("n1", effect="NoSchedule", reason="xid 79", pods=[])
    second = condition(apiserver, "n1")
    assert second is not None and second["status"] == "False"
    assert second["lastTransitionTime"] == first["lastTransitionTime"]
    assert second["lastHeartbeatTime"] != first["lastHeartbeatTime"]
    assert second["reason"] != first["reason"] and second["message"] == "xid 79"
    assert await actor.untaint("n1", reason="healthy again")
    third = condition(apiserver, "n1")
    assert third is not None and third["status"] == "True"
    assert third["lastTransitionTime"] == third["lastHeartbeatTime"]
    assert third["lastTransitionTime"] > second["lastHeartbeatTime"]


PREVIOUS = "2020-01-01T00:00:00Z"


def tainted_before(effect: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Our taint and condition as a previous leader left them."""
    taint = {"key": "hcs.io/unhealthy", "value": "xid-79", "effect": effect}
    cond = {
        "type": "HCSHealthy",
        "status": "False",
        "reason": "Xid79",
        "message": "xid 79",
        "lastHeartbeatTime": PREVIOUS,
        "lastTransitionTime": PREVIOUS,
    }
    return taint, cond


async def test_a_new_leader_untaints_a_node_the_previous_leader_tainted_once_it_recovers(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    taint, cond = tainted_before("NoSchedule")
    ready_cond = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    apiserver.add_node("n1", taints=[OTHER, taint], conditions=[ready_cond, cond])
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    await wait_until(lambda: "n1" in healer.read_nodes)
    adopted_at = time.monotonic()
    assert healer.nodes["n1"].effect == "NoSchedule"
    for seq in range(2, 60):  # healthy fingerprints for longer than the recovery window
        await publish(bus, fingerprint("n1", seq=seq), subjects.fp("n1"))
        if our_taint(apiserver, "n1") is None:
            break
        await asyncio.sleep(0.05)
    await wait_until(lambda: our_taint(apiserver, "n1") is None)
    assert time.monotonic() - adopted_at >= 0.5  # not at once: after the recovery window
    assert apiserver.nodes["n1"]["spec"]["taints"] == [OTHER]
    now = condition(apiserver, "n1")
    assert now is not None and now["status"] == "True"
    assert now["lastTransitionTime"] != PREVIOUS


async def test_a_new_leader_keeps_the_condition_transition_time_while_status_stays(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    taint, cond = tainted_before("PreferNoSchedule")
    apiserver.add_node("n1", taints=[taint], conditions=[cond])
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    healer = await make(kube, failed_share=0.25)
    await ready(healer)
    await wait_until(lambda: "n1" in healer.read_nodes)
    await publish(bus, health("n1", code=79, device=1), subjects.health("n1"))
    await wait_until(lambda: (our_taint(apiserver, "n1") or {}).get("effect") == "NoSchedule")
    await wait_until(
        lambda: (condition(apiserver, "n1") or {}).get("lastHeartbeatTime") != PREVIOUS
    )
    now = condition(apiserver, "n1")
    assert now is not None and now["status"] == "False"
    assert now["lastTransitionTime"] == PREVIOUS  # still unhealthy since the previous leader
    assert now["message"] != "xid 79"
