"""No requester can make the scheduler write where the requester may not.

On a real nats-server running the rendered permissions, with a real scheduler
replica as user ``scheduler``: every rendered user sends requests to every
scheduler subject naming, as reply subject, the JetStream API (purge, delete,
message delete, update, consumer delete of every stream), ledger and
checkpoint keys, stream subjects and the scheduler's own subjects. Afterwards
every stream and bucket is as it was and the scheduler still answers. The
server layer (no ``allow_responses``: answers only into askers' inboxes) and
the code layer (``Bus.serve`` answers only an inbox) are each tested alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from hcs_bus import checkpoint, kvkeys, messages, permissions, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BusTimeout
from hcs_bus.messages import (
    AllocationEvent,
    Plan,
    PlanRequest,
    PodRef,
    Policy,
    ReleaseRequest,
    Requests,
)
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings, Settings
from scheduler.replica import Scheduler, run
from tests.deploy.conftest import NAMESPACES, NODES, Connector
from tests.metering import counted
from tests.scheduler.helpers import DB
from tests.view.factories import fingerprint

NODE = NODES[0]
SIDECARS = tuple(permissions.sidecar_user(ns) for ns in NAMESPACES)
USERS = (*permissions.SERVICES, *NODES, *SIDECARS)
SERVED = (subjects.PLACE, subjects.PLACE_DRY, subjects.RELEASE)
STREAMS = (
    streams.FP,
    streams.HEALTH,
    streams.ALLOC,
    streams.DLQ,
    streams.kv_stream(streams.KV_ALLOC),
    streams.kv_stream(streams.KV_CKPT),
)
JS = permissions.JS_API
FUZZ_NS = "fuzz"  # the namespace of fuzzed plans: the only pledges they may make


def targets(ledger_keys: list[str]) -> list[str]:
    """Reply subjects a confused deputy would write to."""
    out: list[str] = []
    for stream in STREAMS:
        out += [
            f"{JS}.STREAM.PURGE.{stream}",
            f"{JS}.STREAM.DELETE.{stream}",
            f"{JS}.STREAM.MSG.DELETE.{stream}",
            f"{JS}.STREAM.UPDATE.{stream}",
            f"{JS}.CONSUMER.DELETE.{stream}.{permissions.HEALER_DURABLE}",
        ]
    out += [streams.kv_subject(streams.KV_ALLOC, key) for key in ledger_keys]
    out += [
        streams.kv_subject(streams.KV_ALLOC, subjects.alloc_key(NODE)),
        streams.kv_subject(streams.KV_CKPT, subjects.ckpt_key("ml", "llama")),
        subjects.fp(NODE),
        subjects.healer_health(NODE),
        subjects.alloc(NODE),
        subjects.dlq(subjects.fp(NODE)),
        *SERVED,  # an answer sent as a request again
    ]
    return out


def unique(what: str) -> str:
    """A message id no earlier test used (a purge keeps the duplicate window)."""
    return f"deputy:{what}:{uuid.uuid4().hex}"


def request_for(subject: str, *, namespace: str = "ml") -> bytes:
    if subject == subjects.RELEASE:
        return messages.encode(ReleaseRequest(pod=PodRef(namespace=namespace, name="p")))
    return messages.encode(plan_request(dry_run=subject == subjects.PLACE_DRY, ns=namespace))


def plan_request(*, dry_run: bool, ns: str = "ml", name: str = "train-0") -> PlanRequest:
    return PlanRequest(
        namespace=ns,
        requests=Requests(vram_mib=16384),
        policy=Policy(),
        pod_name=name,
        dry_run=dry_run,
        admission_uid="" if dry_run else f"admission-{ns}-{name}",
    )


@dataclass(frozen=True)
class Snapshot:
    """Every stream's counts and every bucket's keys, values and revisions."""

    streams: dict[str, tuple[int, int, int]]
    buckets: dict[str, dict[str, tuple[bytes, int]]]

    def without_pledges_of(self, namespace: str) -> Snapshot:
        """The same, less the ledger keys of ``namespace``'s pledges (fuzzed
        plans that reached the planner pledge there, rightly)."""
        ledger = streams.kv_stream(streams.KV_ALLOC)
        mine = f"pledges={namespace}"
        kept = {
            bucket: {k: v for k, v in keys.items() if not (k == mine or k.startswith(mine + "="))}
            for bucket, keys in self.buckets.items()
        }
        counts = {name: c for name, c in self.streams.items() if name != ledger}
        return Snapshot(counts, kept)


async def snapshot(operator: Bus) -> Snapshot:
    counts = {}
    for name in STREAMS:
        state = (await operator.js.stream_info(name)).state
        counts[name] = (state.messages, state.first_seq, state.last_seq)
    buckets: dict[str, dict[str, tuple[bytes, int]]] = {}
    for bucket in (streams.KV_ALLOC, streams.KV_CKPT):
        kv = await operator.js.key_value(bucket)
        entries = {}
        for key in sorted(await kvkeys.stored_keys(operator, bucket)):
            try:  # each stored key that holds a value (a deleted one: skipped)
                entry = await kv.get(key)
            except KeyNotFoundError:
                continue
            entries[key] = (entry.value or b"", int(entry.revision or 0))
        buckets[bucket] = entries
    return Snapshot(counts, buckets)


def refused_so_far() -> float:
    return sum(
        counted("hcs_bus_replies_refused", subject=s, reason=r)
        for s in SERVED
        for r in ("not_inbox", "no_reply")
    )


async def eventually(check: Any, *, timeout_s: float = 10.0, what: str) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s:g} s: {what}") from None


@dataclass
class Stage:
    """The scheduler replica, a bus per user, and the operator for looking."""

    scheduler: Scheduler
    scheduler_errors: list[Exception]
    buses: dict[str, tuple[Bus, list[Exception]]]
    operator: Bus

    async def ask(self, user: str, request: PlanRequest) -> Plan:
        bus = self.buses[user][0]
        subject = subjects.place(dry_run=request.dry_run)
        return await bus.request(subject, request, Plan, timeout_s=5.0)

    async def flush_all(self) -> None:
        for bus, _ in self.buses.values():
            await bus.nc.flush()


@pytest.fixture
async def stage(connect_as: Connector, authorized_server: NatsServer) -> AsyncIterator[Stage]:
    buses = {user: await connect_as(user) for user in USERS}
    agent = buses[NODE][0]
    await agent.publish(subjects.fp(NODE), fingerprint(NODE, devices=8), msg_id=unique("fp"))
    scheduler, errors = await connect_as("scheduler")
    settings = Settings(bus=BusSettings(url=authorized_server.url))
    replica = await run(scheduler, None, settings, profiles=DB, http=False, summary_max_age_s=0.0)
    staged = Stage(replica, errors, buses, buses["operator"][0])
    try:
        await replica.view.wait_ready(timeout_s=10)
        await eventually(lambda: NODE in replica.view.state.nodes, what="the node is known")
        sidecar = buses[permissions.sidecar_user("ml")][0]
        await checkpoint.report(sidecar, namespace="ml", job="llama", uri="s3://c/1", step=1)
        pledged = await staged.ask("injector", plan_request(dry_run=False))  # a real pledge
        assert pledged.ok, pledged.reason
        event = AllocationEvent(
            node=NODE, pod=PodRef(namespace="ml", name="p"), state="bound", time_s=1.0
        )
        await scheduler.publish(subjects.alloc(NODE), event, msg_id=unique("alloc"))
        yield staged
    finally:
        await replica.stop()


async def still_serving(stage: Stage) -> None:
    dry = await stage.ask("operator", plan_request(dry_run=True))
    pledged = await stage.ask("injector", plan_request(dry_run=False, ns="after"))
    assert dry.ok and pledged.ok, (dry.reason, pledged.reason)


async def test_no_user_can_make_the_scheduler_answer_into_a_stream_a_bucket_or_the_api(
    stage: Stage,
) -> None:
    before = await snapshot(stage.operator)
    ledger = list(before.buckets[streams.KV_ALLOC])
    assert any(k.startswith("pledges=ml") for k in ledger), ledger  # a pledge to lose
    replies = targets(ledger)
    refused = refused_so_far()
    expected = 0
    for user in USERS:
        bus = stage.buses[user][0]
        for subject in SERVED:
            for reply in replies:
                await bus.nc.publish(subject, request_for(subject), reply=reply)
            expected += len(replies) if user in permissions.ASKING[subject] else 0
    await stage.flush_all()
    assert expected == 4 * len(replies)  # the injector: 2 subjects, the operator: 2
    await eventually(
        lambda: refused_so_far() - refused >= expected, what=f"{expected} requests refused"
    )
    await stage.scheduler.view.bus.nc.flush()
    assert await snapshot(stage.operator) == before
    assert refused_so_far() - refused == expected
    await still_serving(stage)
    assert stage.scheduler_errors == []  # it never even tried


def refused_to(errors: list[Exception], subject: str) -> bool:
    """Whether the server refused this connection a publish to ``subject``."""
    said = f'permissions violation for publish to "{subject.lower()}"'
    return any(said in str(e).lower() for e in errors)


async def test_only_the_injector_may_ask_for_a_plan_that_pledges(stage: Stage) -> None:
    for n, user in enumerate(USERS):
        bus, errors = stage.buses[user]
        request = plan_request(dry_run=False, ns=f"asker-{n}")
        if user == "injector":
            assert (await bus.request(subjects.PLACE, request, Plan, timeout_s=5.0)).ok
            continue
        with pytest.raises(BusTimeout):
            await bus.request(subjects.PLACE, request, Plan, timeout_s=0.3)
        await eventually(
            lambda errors=errors: refused_to(errors, subjects.PLACE),
            timeout_s=3,
            what=f"{user} refused {subjects.PLACE}",
        )
    await stage.scheduler.view.bus.nc.flush()
    ledger = (await snapshot(stage.operator)).buckets[streams.KV_ALLOC]
    pledged = {k.split("=")[1] for k in ledger if k.startswith("pledges=asker-")}
    assert pledged == {f"asker-{USERS.index('injector')}"}


async def test_no_agent_may_ask_for_any_plan_or_release(stage: Stage) -> None:
    for node in NODES:
        agent, errors = stage.buses[node]
        for subject in SERVED:
            await agent.nc.publish(subject, request_for(subject), reply="_INBOX.x.y")
        await agent.nc.flush()
        await eventually(
            lambda errors=errors: all(refused_to(errors, s) for s in SERVED),
            timeout_s=3,
            what=f"{node} refused every scheduler subject",
        )


async def test_a_plan_on_the_wrong_subject_for_its_dry_run_is_refused_unplanned(
    stage: Stage,
) -> None:
    before = await snapshot(stage.operator)
    injector = stage.buses["injector"][0]
    wrong = (
        (subjects.PLACE_DRY, plan_request(dry_run=False, name="sneaky")),
        (subjects.PLACE, plan_request(dry_run=True, name="lost")),
    )
    for subject, request in wrong:
        plan = await injector.request(subject, request, Plan, timeout_s=5.0)
        assert not plan.ok and subjects.place(dry_run=request.dry_run) in plan.reason, plan
    await stage.scheduler.view.bus.nc.flush()
    assert await snapshot(stage.operator) == before  # no pledge made
    assert counted("hcs_scheduler_plan_refusals", reason="pledge_on_dry_subject") >= 1
    assert counted("hcs_scheduler_plan_refusals", reason="dry_run_on_pledging_subject") >= 1


async def test_the_scheduler_user_itself_cannot_answer_into_the_api_even_without_the_check(
    connect_as: Connector,
) -> None:
    """The server layer alone: a naive responder (``msg.respond``, no inbox
    check) under the scheduler's user is refused by the server."""
    scheduler, errors = await connect_as("scheduler")
    injector, _ = await connect_as("injector")
    agent, _ = await connect_as(NODE)
    await agent.publish(subjects.fp(NODE), fingerprint(NODE), msg_id=unique("naive"))
    got = asyncio.Event()

    async def naive(msg: Msg) -> None:
        got.set()
        await msg.respond(b"{}")

    sub = await scheduler.nc.subscribe(subjects.PLACE, queue=subjects.PLACE_QUEUE, cb=naive)
    await scheduler.nc.flush()
    purge = f"{JS}.STREAM.PURGE.{streams.FP}"
    await injector.nc.publish(subjects.PLACE, request_for(subjects.PLACE), reply=purge)
    await injector.nc.flush()
    async with asyncio.timeout(3):
        await got.wait()
    said = purge.lower()  # nats-py lower-cases the server's error
    await eventually(lambda: any(said in str(e) for e in errors), what="the answer refused")
    await sub.unsubscribe()
    operator, _ = await connect_as("operator")
    assert (await operator.js.stream_info(streams.FP)).state.messages == 1


# -- the fuzz -----------------------------------------------------------------

_SUBJECT_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E)  # no whitespace
_tokens = st.text(_SUBJECT_CHARS.filter(lambda c: c != "."), min_size=1, max_size=12)
_made_up = st.lists(_tokens, min_size=1, max_size=5).map(".".join)
_inboxes = st.builds(
    lambda prefix, rest: f"{prefix}.{rest}",
    st.sampled_from(
        ["_INBOX", *(permissions.inbox_prefix(u) for u in USERS), "_INBOX_", "_INBOXX"]
    ),
    _made_up,
)
_under_api = st.builds(
    lambda prefix, rest: f"{prefix}.{rest}",
    st.sampled_from([JS, "$JS", streams.kv_subject(streams.KV_ALLOC, "x")[:-2], "$KV"]),
    _made_up,
)


def reply_subjects(ledger_keys: list[str]) -> st.SearchStrategy[str]:
    """Mostly subjects a deputy would harm (the ledger's real keys among
    them), then made-up subjects, inboxes (real and near misses) and
    subjects under the JetStream API and the buckets."""
    harmful = st.sampled_from(targets(ledger_keys))
    return st.one_of(harmful, harmful, _made_up, _inboxes, _under_api)


plan_bodies = st.builds(
    lambda dry, vram, devices, name, vendors: messages.encode(
        PlanRequest(
            namespace=FUZZ_NS,
            requests=Requests(vram_mib=vram, devices=devices),
            policy=Policy(vendors=vendors),
            pod_name=name,
            dry_run=dry,
        )
    ),
    st.booleans(),
    st.integers(min_value=0, max_value=2**20),
    st.none() | st.integers(min_value=0, max_value=16),
    st.text(max_size=20),
    st.lists(st.sampled_from(["nvidia", "huawei", "x"]), max_size=2).map(tuple),
)
release_bodies = st.builds(
    lambda name: messages.encode(ReleaseRequest(pod=PodRef(namespace=FUZZ_NS, name=name))),
    st.text(max_size=20),
)
bodies = plan_bodies | release_bodies | st.binary(max_size=200)
senders = st.sampled_from(USERS) | st.sampled_from(
    sorted({u for a in permissions.ASKING.values() for u in a})
)


async def test_fuzzed_requests_from_every_user_leave_every_stream_and_bucket_as_it_was(
    stage: Stage,
) -> None:
    """Fuzzed reply subjects and plan/release requests (``dry_run`` either
    way, undecodable bytes too) from every user, askers more often. Plans
    that reach the planner are in namespace ``fuzz``: its pledges are the
    only change allowed."""
    loop = asyncio.get_running_loop()
    before = (await snapshot(stage.operator)).without_pledges_of(FUZZ_NS)
    refused = refused_so_far()
    expected = 0

    async def send(user: str, subject: str, reply: str, body: bytes) -> None:
        await stage.buses[user][0].nc.publish(subject, body, reply=reply)

    @settings(
        max_examples=300,
        deadline=timedelta(seconds=5),
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(
        senders,
        st.sampled_from(SERVED),
        reply_subjects(list(before.buckets[streams.KV_ALLOC])),
        bodies,
    )
    def attack(user: str, subject: str, reply: str, body: bytes) -> None:
        nonlocal expected
        asyncio.run_coroutine_threadsafe(send(user, subject, reply, body), loop).result(5)
        if user in permissions.ASKING[subject] and not subjects.is_inbox(reply):
            expected += 1

    await asyncio.to_thread(attack)
    await stage.flush_all()
    await eventually(
        lambda: refused_so_far() - refused >= expected, what=f"{expected} requests refused"
    )
    await stage.scheduler.view.bus.nc.flush()
    await stage.flush_all()
    after = (await snapshot(stage.operator)).without_pledges_of(FUZZ_NS)
    assert after == before
    assert refused_so_far() - refused == expected > 0
    await still_serving(stage)


# -- what nats-server does with allow_responses --------------------------------


@pytest.fixture
def responses_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A user with ``allow_responses`` and a deny rule on the JetStream API."""
    conf = tmp_path / "nats.conf"
    conf.write_text(
        "authorization { users = [\n"
        '  {user: deputy, password: p, permissions: {publish: {allow: ["$JS.API.STREAM.INFO.>"],'
        ' deny: ["$JS.API.>", "$KV.>"]}, subscribe: {allow: ["ask"]},'
        " allow_responses: {max: 1}}},\n"
        '  {user: asker, password: p, permissions: {publish: {allow: ["ask"]}}},\n'
        "  {user: admin, password: p}\n"
        "] }\n"
    )
    server = NatsServer(config_file=conf).start()
    yield server
    server.cleanup()


async def test_nats_lets_an_allow_responses_answer_past_deny_rules_so_no_user_has_it(
    responses_server: NatsServer,
) -> None:
    """Measured on the real server: a deny rule does not hold an answer
    sent under ``allow_responses`` (even ``max: 1``) to a reply subject the
    asker chose, so a deny list cannot close the confused deputy; the
    rendered permissions give no user ``allow_responses`` at all."""
    url = responses_server.url.replace("nats://", "")
    admin = await nats.connect(f"nats://admin:p@{url}")
    deputy = await nats.connect(f"nats://deputy:p@{url}")
    asker = await nats.connect(f"nats://asker:p@{url}")
    try:
        js = admin.jetstream()
        await js.add_stream(name="VICTIM", subjects=["victim.>"])
        for n in range(3):
            await js.publish("victim.x", b"%d" % n)

        async def answer(msg: Msg) -> None:
            await msg.respond(b"{}")

        await deputy.subscribe("ask", cb=answer)
        await deputy.flush()

        async def purged() -> bool:
            return (await js.stream_info("VICTIM")).state.messages == 0

        async with asyncio.timeout(30):  # a loaded CI machine answers slowly
            while not await purged():  # asked again each second: core NATS may drop one
                await asker.publish("ask", b"", reply="$JS.API.STREAM.PURGE.VICTIM")
                await asker.flush()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        while not await purged():
                            await asyncio.sleep(0.02)
    finally:
        for nc in (admin, deputy, asker):
            with contextlib.suppress(Exception):
                await nc.close()


def test_no_rendered_user_has_allow_responses_and_only_the_operator_may_purge() -> None:
    creds = {u: permissions.Credential(password="x") for u in (*permissions.SERVICES, *NODES)}
    auth = permissions.nats_authorization(NODES, creds)
    for user in auth["users"]:
        rules = user["permissions"]
        assert "allow_responses" not in rules, user["user"]
        if user["user"] == "operator":
            continue
        deny = rules["publish"]["deny"]
        assert set(permissions.GUARDED) <= set(deny), user["user"]
        writes_ledger = user["user"] == "scheduler"
        assert (streams.kv_subject(streams.KV_ALLOC) in deny) is not writes_ledger, user["user"]
    scheduler = permissions.service("scheduler")
    answers = [s for s in scheduler.publish if s.startswith(subjects.INBOX)]
    assert answers == ["_INBOX_INJECTOR.>", "_INBOX_OPERATOR.>"]


def test_the_scheduler_may_publish_no_stream_purge_delete_or_message_delete() -> None:
    scheduler = permissions.service("scheduler")
    for subject in scheduler.publish:
        for op in ("PURGE", "STREAM.DELETE", "MSG.DELETE"):
            assert op not in subject, subject
