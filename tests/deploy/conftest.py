"""Fixtures for the deploy tests: rendered overlays and a nats-server running
the authorization block rendered by ``hcs_bus.permissions``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import nats
import pytest

from hcs_bus import permissions, streams
from hcs_bus.bus import Bus
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings

NODES = ("gpu-node-a", "gpu-node-b.zone1")
NAMESPACES = ("ml", "team-b")  # namespaces with a checkpoint sidecar user


def password(user: str) -> str:
    return f"pw-{user}"


@pytest.fixture(scope="session")
def authorized_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real nats-server -js whose users and permissions are the rendered ones."""
    sidecars = [permissions.sidecar_user(ns) for ns in NAMESPACES]
    users = (*permissions.SERVICES, *NODES, *sidecars)
    creds = {u: permissions.Credential(password=password(u)) for u in users}
    auth = permissions.nats_authorization(NODES, creds, namespaces=NAMESPACES)
    conf = tmp_path_factory.mktemp("nats-auth") / "nats.conf"
    conf.write_text(permissions.render_nats_conf(auth))
    server = NatsServer(config_file=conf).start()
    yield server
    server.cleanup()


Connector = Callable[[str], Awaitable[tuple[Bus, list[Exception]]]]


@pytest.fixture
async def connect_as(authorized_server: NatsServer) -> AsyncIterator[Connector]:
    """Connect as a part's user (with its inbox prefix); returns the bus and the
    errors the server reported on that connection (permission violations)."""
    opened: list[Bus] = []

    async def connect(user: str) -> tuple[Bus, list[Exception]]:
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        nc = await nats.connect(
            authorized_server.url,
            user=user,
            password=password(user),
            inbox_prefix=permissions.inbox_prefix(user),
            error_cb=on_error,
            max_reconnect_attempts=0,
        )
        bus = Bus(nc)
        opened.append(bus)
        return bus, errors

    operator, _ = await connect("operator")
    settings = BusSettings(url=authorized_server.url)
    await streams.init(operator, settings)
    for name in [c.name for c in streams.stream_configs(settings)]:
        assert name
        await operator.js.purge_stream(name)
    yield connect
    for bus in opened:
        await bus.nc.close()
