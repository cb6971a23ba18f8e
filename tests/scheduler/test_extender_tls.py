"""The extender over mutual TLS, as kube-scheduler calls it: only a client
certificate from the configured CA, naming kube-scheduler, reaches a verb;
anyone else is refused at the handshake (another CA) or with a 401/403 that
says why; the kubelet's probes need no certificate; and the settings refuse
to serve binds in the clear off loopback."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from hcs_bus.bus import Bus
from hcs_bus.errors import ConfigError
from hcs_bus.settings import BusSettings, Settings, load, replace
from scheduler.replica import run
from tests.e2e.pki import Identity, Pki
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import DB, k8s_doc

KUBE_SCHEDULER = "hcs-kube-scheduler"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def _tls_settings(pki: Pki) -> dict[str, Any]:
    server = pki.serving("extender", names=("127.0.0.1", "localhost"))
    return {
        "extender_cert_file": str(server.cert_file),
        "extender_key_file": str(server.key_file),
        "extender_client_ca_file": str(pki.ca_file),
        "extender_client_names": [KUBE_SCHEDULER],
    }


def _client(pki: Pki, identity: Identity | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    if identity is not None:
        context.load_cert_chain(identity.cert_file, identity.key_file)
    return context


async def _call(
    port: int, path: str, *, context: ssl.SSLContext, body: Any = None
) -> tuple[int, str]:
    connector = aiohttp.TCPConnector(ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:
        method = "GET" if body is None else "POST"
        url = f"https://127.0.0.1:{port}{path}"
        async with session.request(method, url, json=body) as resp:
            return resp.status, await resp.text()


async def test_only_kube_schedulers_certificate_reaches_bind_and_probes_need_none(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    bind = k8s_doc("extender-binding-args.json")
    kube_scheduler = pki.client("kube-scheduler", user=KUBE_SCHEDULER)
    status, text = await _call(sched.port, "/bind", context=_client(pki, kube_scheduler), body=bind)
    assert status == 200 and '"Error"' in text  # an answer: the pod was never filtered here
    status, text = await _call(sched.port, "/readyz", context=_client(pki, None))
    assert (status, text) == (200, "ready")
    with capture_logs() as logs:
        status, text = await _call(sched.port, "/bind", context=_client(pki, None), body=bind)
        assert status == 401 and "client certificate" in text and "tlsConfig" in text
        someone = pki.client("someone", user="system:serviceaccount:ml:default")
        status, text = await _call(sched.port, "/bind", context=_client(pki, someone), body=bind)
        assert status == 403 and KUBE_SCHEDULER in text and "extender_client_names" in text
        status, _ = await _call(sched.port, "/metrics", context=_client(pki, None))
        assert status == 401
    refused = [e for e in logs if e["event"] == "extender_caller_refused"]
    assert [(e["verb"], e["reason"]) for e in refused] == [
        ("bind", "no_client_certificate"),
        ("bind", "client_not_allowed"),
        ("metrics", "no_client_certificate"),
    ]


async def test_a_certificate_from_another_ca_is_refused_at_the_handshake(
    bus: Bus, start_scheduler: Start, pki: Pki, tmp_path: Path
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    stranger = Pki(tmp_path / "stranger")
    forged = stranger.client("kube-scheduler", user=KUBE_SCHEDULER)  # the right name, wrong CA
    context = _client(pki, None)
    context.load_cert_chain(forged.cert_file, forged.key_file)
    bind = k8s_doc("extender-binding-args.json")
    with pytest.raises((aiohttp.ClientSSLError, aiohttp.ClientOSError)):
        await _call(sched.port, "/bind", context=context, body=bind)


async def test_a_serving_certificate_of_the_same_ca_is_no_client_certificate(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    """A webhook's or the extender's own certificate, even named as kube-scheduler,
    is for server auth only: the handshake refuses it as a client's."""
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    server_only = pki.serving("impostor", names=(KUBE_SCHEDULER,))
    context = _client(pki, server_only)
    bind = k8s_doc("extender-binding-args.json")
    with pytest.raises((aiohttp.ClientSSLError, aiohttp.ClientOSError)):
        await _call(sched.port, "/bind", context=context, body=bind)


async def test_the_console_and_api_are_not_on_the_extenders_port(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None and sched.console_port not in (None, sched.port)
    context = _client(pki, pki.client("kube-scheduler", user=KUBE_SCHEDULER))
    for path in ("/api/overview", "/console/"):
        status, _ = await _call(sched.port, path, context=context)
        assert status == 404, path


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"extender_host": "0.0.0.0"}, "is not loopback"),
        ({"extender_host": "10.0.0.7", "with_cert": True}, "extender_client_ca_file"),
        ({"extender_client_names": ["x"]}, "needs extender_client_ca_file"),
        ({"extender_cert_file": "/nowhere.crt"}, "go together"),
        ({"with_ca": True}, "needs extender_cert_file"),
        ({"console_key_file": "/nowhere.key"}, "console_cert_file and console_key_file"),
    ],
)
async def test_settings_that_would_serve_binds_unauthenticated_stop_the_replica(
    bus: Bus, bus_settings: BusSettings, pki: Pki, fields: dict[str, Any], named: str
) -> None:
    fields = dict(fields)
    if fields.pop("with_cert", False):
        server = pki.serving("extender", names=("127.0.0.1",))
        fields |= {
            "extender_cert_file": str(server.cert_file),
            "extender_key_file": str(server.key_file),
        }
    if fields.pop("with_ca", False):
        fields["extender_client_ca_file"] = str(pki.ca_file)
    settings = replace(Settings(bus=bus_settings), scheduler={"extender_port": 0, **fields})
    with pytest.raises(ConfigError, match=named):
        await run(bus, None, settings, profiles=DB)


@pytest.mark.parametrize(
    ("value", "names"),
    [("hcs-kube-scheduler", ("hcs-kube-scheduler",)), ("a,b", ("a", "b")), ("", ())],
)
def test_the_allowed_client_names_come_from_the_environment_as_a_list(
    value: str, names: tuple[str, ...]
) -> None:
    settings = load(env={"HCS_SCHEDULER__EXTENDER_CLIENT_NAMES": value})
    assert settings.scheduler.extender_client_names == names


async def test_a_certificate_file_that_cannot_be_read_stops_the_replica_naming_it(
    bus: Bus, bus_settings: BusSettings, tmp_path: Path
) -> None:
    fields = {
        "extender_cert_file": str(tmp_path / "absent.crt"),
        "extender_key_file": str(tmp_path / "absent.key"),
    }
    settings = replace(Settings(bus=bus_settings), scheduler={"extender_port": 0, **fields})
    with pytest.raises(ConfigError, match=r"scheduler\.extender_cert_file.*absent\.crt"):
        await run(bus, None, settings, profiles=DB)
