"""Identity from the subject and the NATS user, never from the body — on a
real nats-server running the authorization rendered by
``hcs_bus.permissions`` (fixtures in ``tests/deploy/conftest.py``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats.errors
import pytest

from hcs_bus import checkpoint, messages, permissions, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BusTimeout
from hcs_bus.messages import CheckpointEvent, HealthEvent, NodeFingerprint
from hcs_bus.settings import SchedulerSettings
from scheduler.view.follow_loop import ClusterView
from tests.deploy.conftest import NODES, Connector
from tests.deploy.test_nats_permissions import violations, wait_for

NODE, OTHER = NODES
TIMEOUT_S = 5.0


def fp(node: str, *, seq: int, boot: str = "b1", time_s: float | None = None) -> NodeFingerprint:
    return NodeFingerprint(
        node=node,
        agent_version="t",
        boot_id=boot,
        seq=seq,
        time_s=time.time() if time_s is None else time_s,
        labels={"seq": str(seq)},
    )


def failed_node(node: str, *, source: str = "healer") -> HealthEvent:
    return HealthEvent(
        node=node,
        kind="verdict",
        severity="critical",
        source=source,  # type: ignore[arg-type]
        time_s=time.time(),
        verdict="failed",
    )


async def until(predicate: Callable[[], bool], *, timeout_s: float = TIMEOUT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


async def dead_letter_reason(bus: Bus, subject: str) -> str:
    """The reason on the newest dead letter of ``subject`` ("" when none)."""
    try:
        msg = await bus.js.get_last_msg(streams.DLQ, subjects.dlq(subject))
    except Exception:
        return ""
    return (msg.headers or {}).get("Hcs-Reason", "")


@pytest.fixture
async def view(connect_as: Connector) -> AsyncIterator[ClusterView]:
    """The scheduler's view, with its own NATS user, ready."""
    scheduler, _ = await connect_as("scheduler")
    view = ClusterView(scheduler, settings=SchedulerSettings(stale_after_s=0.6))
    await view.start()
    await view.wait_ready(timeout_s=TIMEOUT_S)
    yield view
    await view.stop()


# -- what the server refuses ------------------------------------------------------


@pytest.mark.parametrize(
    "subject",
    [subjects.healer_health(NODE), subjects.healer_health(OTHER), subjects.health(OTHER)],
    ids=["verdict-own-node", "verdict-other-node", "other-nodes-health"],
)
async def test_an_agent_cannot_publish_verdicts_or_another_nodes_health(
    connect_as: Connector, subject: str
) -> None:
    agent, errors = await connect_as(NODE)
    with pytest.raises(BusTimeout):
        await agent.publish(subject, failed_node(NODE), msg_id="forge:1", timeout_s=0.5, attempts=1)
    refused = await wait_for(errors)
    assert any(subject in line for line in refused)


async def test_the_healer_may_publish_verdicts_on_its_subject(connect_as: Connector) -> None:
    healer, errors = await connect_as("healer")
    seq = await healer.publish(subjects.healer_health(NODE), failed_node(NODE), msg_id="h:1")
    assert seq > 0 and violations(errors) == []


# -- what the consumers refuse ---------------------------------------------------


async def test_a_fingerprint_naming_another_node_is_dead_lettered_and_the_view_unchanged(
    connect_as: Connector, view: ClusterView
) -> None:
    agent, _ = await connect_as(NODE)
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=1), msg_id="own:1")
    await until(lambda: NODE in view.state.nodes)
    await agent.publish(subjects.fp(NODE), fp(OTHER, seq=99), msg_id="lie:1")
    operator, _ = await connect_as("operator")
    reason = ""
    async with asyncio.timeout(TIMEOUT_S):
        while not reason:
            reason = await dead_letter_reason(operator, subjects.fp(NODE))
            await asyncio.sleep(0.02)
    assert OTHER in reason and "subject" in reason
    assert OTHER not in view.state.nodes
    assert view.state.nodes[NODE].fingerprint.seq == 1  # not rewritten by the lie


async def test_a_verdict_from_an_agents_subject_is_dead_lettered_and_never_applied(
    connect_as: Connector, view: ClusterView
) -> None:
    agent, _ = await connect_as(NODE)
    healer, _ = await connect_as("healer")
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=1), msg_id="v:fp:1")
    await until(lambda: NODE in view.state.nodes)
    await agent.publish(subjects.health(NODE), failed_node(NODE), msg_id="v:forged")
    operator, _ = await connect_as("operator")
    reason = ""
    async with asyncio.timeout(TIMEOUT_S):
        while not reason:
            reason = await dead_letter_reason(operator, subjects.health(NODE))
            await asyncio.sleep(0.02)
    assert "forged verdict" in reason
    assert view.state.nodes[NODE].verdict == "healthy"
    # the healer's own verdict, on its subject, is what fails the node
    await healer.publish(subjects.healer_health(NODE), failed_node(NODE), msg_id="v:real")
    await until(lambda: view.state.nodes[NODE].verdict == "failed")


async def test_an_out_of_order_fingerprint_is_ignored_and_counted(
    connect_as: Connector, view: ClusterView
) -> None:
    agent, _ = await connect_as(NODE)
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=5, boot="a"), msg_id="o:5")
    await until(lambda: NODE in view.state.nodes)
    ignored = view.state.stale_ignored
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=3, boot="a"), msg_id="o:3")
    await until(lambda: view.state.stale_ignored == ignored + 1)
    assert view.state.nodes[NODE].fingerprint.seq == 5
    # a reboot starts again at seq 1; the replaced boot never comes back
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=1, boot="b"), msg_id="o:b1")
    await until(lambda: view.state.nodes[NODE].fingerprint.boot_id == "b")
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=6, boot="a"), msg_id="o:a6")
    await until(lambda: view.state.stale_ignored == ignored + 2)
    assert view.state.nodes[NODE].fingerprint.boot_id == "b"


async def test_a_node_whose_clock_is_an_hour_ahead_stays_fresh_while_it_publishes(
    connect_as: Connector, view: ClusterView
) -> None:
    """Staleness is judged on receive time; a reboot with the clock put right
    (time_s an hour earlier than the last one) is still the node's latest."""
    agent, _ = await connect_as(NODE)
    ahead = time.time() + 3600.0
    stale_after_s = view.settings.stale_after_s
    loop = asyncio.get_running_loop()
    until_s = loop.time() + 4 * stale_after_s
    seq = 0
    while loop.time() < until_s:
        seq += 1
        await agent.publish(subjects.fp(NODE), fp(NODE, seq=seq, time_s=ahead), msg_id=f"c:{seq}")
        await asyncio.sleep(stale_after_s / 4)
        assert not view.state.nodes[NODE].stale, f"stale after {seq} fingerprints"
    await agent.publish(subjects.fp(NODE), fp(NODE, seq=1, boot="fixed"), msg_id="c:fixed")
    await until(lambda: view.state.nodes[NODE].fingerprint.boot_id == "fixed")
    await asyncio.sleep(stale_after_s / 2)
    assert not view.state.nodes[NODE].stale


# -- checkpoints: one namespace, one identity -------------------------------------


async def test_a_sidecar_cannot_write_or_read_another_namespaces_checkpoint(
    connect_as: Connector,
) -> None:
    sidecar, errors = await connect_as(permissions.sidecar_user("ml"))
    kv = await sidecar.nc.jetstream(timeout=0.5).key_value(streams.KV_CKPT)
    event = CheckpointEvent(namespace="team-b", job="llm", uri="s3://evil", step=10**9, time_s=1)
    with pytest.raises(nats.errors.TimeoutError):  # no ack: the server dropped the write
        await kv.put(subjects.ckpt_key("team-b", "llm"), messages.encode(event))
    with pytest.raises(nats.errors.TimeoutError):  # no answer: the direct get was refused
        await kv.get(subjects.ckpt_key("team-b", "llm"))
    refused = await wait_for(errors)
    assert any("team-b" in line for line in refused)
    # its own namespace works, end to end through checkpoint.report
    done = await checkpoint.report(sidecar, namespace="ml", job="llm", uri="s3://ok", step=1)
    assert done.stored
    team_b, _ = await connect_as(permissions.sidecar_user("team-b"))
    assert await checkpoint.latest(team_b, namespace="team-b", job="llm", run="") is None


async def test_a_checkpoint_whose_body_names_another_namespace_is_never_a_resume_point(
    connect_as: Connector,
) -> None:
    """A B key holding an A body (written by B's own sidecar, the only user
    that may): the readers refuse it, so it resumes neither B's job nor A's."""
    team_b, errors = await connect_as(permissions.sidecar_user("team-b"))
    kv = await team_b.js.key_value(streams.KV_CKPT)
    a_body = CheckpointEvent(namespace="ml", job="gpt", uri="s3://a/gpt", step=7, time_s=1)
    key = subjects.ckpt_key("team-b", "gpt")
    await kv.put(key, messages.encode(a_body))
    assert violations(errors) == []
    scheduler, _ = await connect_as("scheduler")
    entry = await (await scheduler.js.key_value(streams.KV_CKPT)).get(key)
    assert checkpoint.resume_point(entry.value, key=key, namespace="team-b", job="gpt") is None
    assert checkpoint.resume_point(entry.value, key=key, namespace="ml", job="gpt") is None
    assert await checkpoint.latest(scheduler, namespace="team-b", job="gpt") is None
    assert await checkpoint.latest(scheduler, namespace="ml", job="gpt") is None
    own = CheckpointEvent(namespace="team-b", job="gpt", uri="s3://b/gpt", step=8, time_s=1)
    await kv.put(key, messages.encode(own))
    got = await checkpoint.latest(scheduler, namespace="team-b", job="gpt")
    assert got is not None and got.uri == "s3://b/gpt"


def test_render_makes_one_sidecar_user_per_listed_namespace_with_only_its_keys(
    tmp_path: Path,
) -> None:
    nodes = {"items": [{"metadata": {"name": NODE, "labels": {}}}]}
    namespaces = {"items": [{"metadata": {"name": "ml"}}, {"metadata": {"name": "team-b"}}]}
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    (tmp_path / "namespaces.json").write_text(json.dumps(namespaces))
    out = tmp_path / "auth.conf"
    argv = ["render", "--nodes-json", str(tmp_path / "nodes.json"), "--seeds-dir"]
    argv += [str(tmp_path / "seeds"), "--out", str(out)]
    assert permissions.main([*argv, "--namespaces-json", str(tmp_path / "namespaces.json")]) == 0
    conf = out.read_text()
    assert '"$KV.hcs_ckpt.ml.*.*"' in conf and '"$KV.hcs_ckpt.team-b.*.*"' in conf
    assert '"$KV.hcs_ckpt.*.*"' not in conf and '"$KV.hcs_ckpt.>"' not in conf
    assert {"sidecar-ml.nk", "sidecar-team-b.nk"} <= {
        p.name for p in (tmp_path / "seeds").iterdir()
    }
