"""The checkpoint sidecars' credential, end to end: the auth Job's
``python -m hcs_bus.permissions render`` makes one nkey per labelled
namespace (kept across runs), renders user ``sidecar:<ns>`` with its public
key, and writes Secret ``hcs-checkpoint-nats`` into that namespace only; a
nats-server running the rendered block lets the seed from that Secret write
its own namespace's checkpoint keys and nothing else."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from hcs_bus import checkpoint, permissions, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings, Settings
from healer.checkpointing import own_inbox

LABELLED = ("ml", "team-b")


def render(work: Path) -> dict[str, Any]:
    """One run of the auth Job's render step; the Secrets it would apply."""
    (work / "nodes.json").write_text(json.dumps({"items": []}))
    names = [{"metadata": {"name": ns, "labels": {"hcs.io/checkpoints": ""}}} for ns in LABELLED]
    (work / "namespaces.json").write_text(json.dumps({"items": names}))
    code = permissions.main(
        [
            "render",
            *("--nodes-json", str(work / "nodes.json")),
            *("--seeds-dir", str(work / "seeds")),
            *("--out", str(work / "auth.conf")),
            *("--namespaces-json", str(work / "namespaces.json")),
            *("--checkpoint-secrets-out", str(work / "secrets.json")),
        ]
    )
    assert code == 0
    return json.loads((work / "secrets.json").read_text())  # type: ignore[no-any-return]


def seed_of(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"]["seed.nk"]).decode().strip()


def test_each_labelled_namespace_gets_its_own_seed_in_its_own_namespace_kept_across_runs(
    tmp_path: Path,
) -> None:
    first = render(tmp_path)
    again = render(tmp_path)
    assert first == again  # the seeds are kept, like the services'
    assert first["kind"] == "List"
    by_ns = {s["metadata"]["namespace"]: s for s in first["items"]}
    assert set(by_ns) == set(LABELLED)
    conf = (tmp_path / "auth.conf").read_text()
    services = {
        permissions.public_key((tmp_path / "seeds" / f"{name}.nk").read_text())
        for name in permissions.SERVICES
    }
    publics = set()
    for namespace, secret in by_ns.items():
        assert secret["metadata"]["name"] == "hcs-checkpoint-nats"
        public = permissions.public_key(seed_of(secret))
        assert secret["metadata"]["annotations"]["hcs.io/nats-nkey"] == public
        assert f'{{nkey: "{public}"' in conf, namespace
        publics.add(public)
    assert len(publics) == len(LABELLED) and not publics & services


def test_the_rendered_sidecar_user_may_touch_only_its_namespaces_run_keys() -> None:
    perms = permissions.sidecar("ml")
    kv_puts = [s for s in perms.publish if s.startswith("$KV.")]
    assert kv_puts == ["$KV.hcs_ckpt.ml.*.*"]
    keyed = [s for s in perms.publish if "$KV.hcs_ckpt." in s]
    assert keyed and all(s.endswith("$KV.hcs_ckpt.ml.*.*") for s in keyed)
    assert not any("STREAM.MSG.GET" in s or s.endswith(">") for s in perms.publish)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, Path]]:
    work = tmp_path_factory.mktemp("auth-job")
    secrets = render(work)
    for secret in secrets["items"]:  # what the sidecar's Secret volume holds
        folder = work / "mounted" / secret["metadata"]["namespace"]
        folder.mkdir(parents=True)
        (folder / "seed.nk").write_text(seed_of(secret) + "\n")
    server = NatsServer(config_file=work / "auth.conf").start()
    yield server, work
    server.cleanup()


class Sidecar:
    def __init__(self, bus: Bus, errors: list[Exception]) -> None:
        self.bus, self.errors = bus, errors

    async def refused(self, subject: str) -> bool:
        async with asyncio.timeout(3):
            while not any(subject.lower() in str(e).lower() for e in self.errors):
                await asyncio.sleep(0.02)
        return True


@pytest.fixture
async def sidecar(rendered: tuple[NatsServer, Path]) -> AsyncIterator[Sidecar]:
    """Connected as the ml namespace's sidecar does: its Secret's seed file and
    its own inbox prefix; the buckets made by the operator."""
    server, work = rendered
    operator = await nats.connect(
        server.url,
        nkeys_seed=str(work / "seeds" / "operator.nk"),
        inbox_prefix=permissions.inbox_prefix("operator"),
    )
    await streams.init(Bus(operator), BusSettings(url=server.url))
    await operator.close()
    config = own_inbox(Settings(), namespace="ml").bus
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        server.url,
        nkeys_seed=str(work / "mounted" / "ml" / "seed.nk"),
        inbox_prefix=config.inbox_prefix or "",
        error_cb=on_error,
        max_reconnect_attempts=0,
    )
    yield Sidecar(Bus(nc), errors)
    await nc.close()


async def test_the_namespaces_seed_reports_its_own_runs_checkpoint(sidecar: Sidecar) -> None:
    done = await checkpoint.report(
        sidecar.bus, namespace="ml", job="llama", run="uid-1", uri="s3://c/7", step=7
    )
    assert done.stored
    got = await checkpoint.latest(sidecar.bus, namespace="ml", job="llama", run="uid-1")
    assert got is not None and got.uri == "s3://c/7"
    await sidecar.bus.nc.flush()
    assert sidecar.errors == []


async def test_the_namespaces_seed_cannot_write_or_read_another_namespaces_keys(
    sidecar: Sidecar,
) -> None:
    other = streams.kv_subject(streams.KV_CKPT, subjects.ckpt_key("team-b", "llama", "uid-1"))
    await sidecar.bus.nc.publish(other, b"{}")
    assert await sidecar.refused(other)
    stream = streams.kv_stream(streams.KV_CKPT)
    direct = f"$JS.API.DIRECT.GET.{stream}.{other}"
    await sidecar.bus.nc.publish(direct, b"")
    assert await sidecar.refused(direct)
    bare = streams.kv_subject(streams.KV_CKPT, "ml.llama")  # a key of no run
    await sidecar.bus.nc.publish(bare, b"{}")
    assert await sidecar.refused(bare)
