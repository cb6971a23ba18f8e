"""The extender over HTTP/2, as kube-scheduler's Go client speaks it when the
server offers ``h2`` by ALPN: many calls at once on one connection, answered
exactly as over HTTP/1.1, with the same client-certificate check, body
limits and encodings; large answers pass through HTTP/2 flow control; and
clients that do not offer ``h2`` keep HTTP/1.1 on the same port."""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import h2.config
import h2.connection
import h2.events
import pytest
import uvloop
from structlog.testing import capture_logs

from hcs_bus.bus import Bus
from scheduler.extender.http import MAX_BODY
from tests.e2e.pki import Identity, Pki
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import k8s_doc

KUBE_SCHEDULER = "hcs-kube-scheduler"


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Each test on both loops: the parts run on uvloop, whose TLS transport differs."""
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


def _tls_settings(pki: Pki, **extra: Any) -> dict[str, Any]:
    server = pki.serving("extender", names=("127.0.0.1", "localhost"))
    return {
        "extender_cert_file": str(server.cert_file),
        "extender_key_file": str(server.key_file),
        "extender_client_ca_file": str(pki.ca_file),
        "extender_client_names": [KUBE_SCHEDULER],
        **extra,
    }


def _client(pki: Pki, identity: Identity | None, *, alpn: tuple[str, ...]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.set_alpn_protocols(list(alpn))
    if identity is not None:
        context.load_cert_chain(identity.cert_file, identity.key_file)
    return context


@dataclass
class Call:
    method: str
    path: str
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Answer:
    status: int = 0
    body: bytearray = field(default_factory=bytearray)

    def json(self) -> Any:
        return json.loads(self.body)


async def _h2_calls(
    port: int, context: ssl.SSLContext, calls: list[Call], *, bodies_first: bool = False
) -> list[Answer]:
    """Every call sent at once, each on its own stream of one HTTP/2
    connection; their answers, read with flow control as a client does.
    ``bodies_first``: every (small) body sent, and only then every stream
    ended, so the server holds them all at once."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        answers: dict[int, Answer] = {}
        pending: dict[int, memoryview] = {}
        held: list[int] = []
        for call in calls:
            sid = conn.get_next_available_stream_id()
            headers = [
                (":method", call.method),
                (":path", call.path),
                (":scheme", "https"),
                (":authority", f"127.0.0.1:{port}"),
                ("content-length", str(len(call.body))),
                *call.headers,
            ]
            conn.send_headers(sid, headers, end_stream=not call.body)
            answers[sid] = Answer()
            if call.body and bodies_first:
                conn.send_data(sid, call.body)
                held.append(sid)
            elif call.body:
                pending[sid] = memoryview(call.body)
        for sid in held:
            conn.end_stream(sid)
        ended: set[int] = set()
        async with asyncio.timeout(20):
            while len(ended) < len(answers):
                _send_what_fits(conn, pending)
                writer.write(conn.data_to_send())
                data = await reader.read(65536)
                assert data, "the server closed the connection"
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        answers[event.stream_id].status = int(dict(event.headers)[b":status"])
                    elif isinstance(event, h2.events.DataReceived):
                        answers[event.stream_id].body += event.data
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        ended.add(event.stream_id)
                    elif isinstance(event, h2.events.StreamReset):
                        raise AssertionError(f"stream {event.stream_id} reset: {event.error_code}")
        return [answers[sid] for sid in sorted(answers)]
    finally:
        writer.close()


def _send_what_fits(conn: h2.connection.H2Connection, pending: dict[int, memoryview]) -> None:
    for sid in list(pending):
        rest = pending[sid]
        room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
        while rest and room > 0:
            part, rest = rest[:room], rest[room:]
            conn.send_data(sid, part.tobytes(), end_stream=not rest)
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
        if rest:
            pending[sid] = rest
        else:
            del pending[sid]


async def _h1_call(port: int, context: ssl.SSLContext, call: Call) -> tuple[int, bytes]:
    connector = aiohttp.TCPConnector(ssl=context)
    async with aiohttp.ClientSession(connector=connector) as session:
        url = f"https://127.0.0.1:{port}{call.path}"
        async with session.request(call.method, url, data=call.body or None) as resp:
            return resp.status, await resp.read()


def _filter_of(pod_doc: str, names: list[str]) -> bytes:
    args = k8s_doc(pod_doc)
    args["Nodes"], args["NodeNames"] = None, names
    return json.dumps(args).encode()


async def test_calls_in_parallel_share_one_connection_and_answer_as_over_http1(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    me = pki.client("kube-scheduler", user=KUBE_SCHEDULER)
    bind = json.dumps(k8s_doc("extender-binding-args.json")).encode()
    filter_body = json.dumps(k8s_doc("extender-filter-args-nodecache.json")).encode()
    calls = [Call("POST", "/bind", bind) for _ in range(20)]
    calls += [Call("POST", "/filter", filter_body) for _ in range(20)]
    calls += [Call("GET", "/readyz"), Call("GET", "/metrics")]
    answers = await _h2_calls(sched.port, _client(pki, me, alpn=("h2", "http/1.1")), calls)
    h1 = _client(pki, me, alpn=("http/1.1",))
    for call, answer in zip(calls[:-1], answers[:-1], strict=True):
        assert (answer.status, bytes(answer.body)) == await _h1_call(sched.port, h1, call)
    assert answers[-1].status == 200 and b"# TYPE hcs_scheduler" in answers[-1].body


async def test_over_http2_the_client_certificate_is_checked_as_over_http1(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    bind = json.dumps(k8s_doc("extender-binding-args.json")).encode()
    someone = pki.client("someone", user="system:serviceaccount:ml:default")
    with capture_logs() as logs:
        nobody = await _h2_calls(
            sched.port,
            _client(pki, None, alpn=("h2",)),
            [Call("POST", "/bind", bind), Call("GET", "/metrics"), Call("GET", "/healthz")],
        )
        other = await _h2_calls(
            sched.port, _client(pki, someone, alpn=("h2",)), [Call("POST", "/bind", bind)]
        )
    assert [a.status for a in nobody] == [401, 401, 200]
    assert b"tlsConfig" in nobody[0].body and bytes(nobody[2].body) == b"ok"
    assert other[0].status == 403 and b"extender_client_names" in other[0].body
    refused = [(e["verb"], e["reason"]) for e in logs if e["event"] == "extender_caller_refused"]
    assert sorted(refused) == [  # streams of one connection: answered as each ends
        ("bind", "client_not_allowed"),
        ("bind", "no_client_certificate"),
        ("metrics", "no_client_certificate"),
    ]


async def test_a_large_filter_and_its_answer_pass_through_flow_control(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    """20,000 node names (~300 KiB each way, past HTTP/2's 64 KiB default
    windows) for a pod that asks for no devices: every name comes back."""
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    names = [f"node-{i:05d}.rack-{i % 40:02d}.example" for i in range(20_000)]
    body = _filter_of("extender-filter-args-nodecache.json", names)
    args = json.loads(body)
    for container in args["Pod"]["spec"]["containers"]:
        container["resources"] = {}
    me = pki.client("kube-scheduler", user=KUBE_SCHEDULER)
    (answer,) = await _h2_calls(
        sched.port,
        _client(pki, me, alpn=("h2",)),
        [Call("POST", "/filter", json.dumps(args).encode())],
    )
    assert answer.status == 200
    assert answer.json()["NodeNames"] == names


async def test_bodies_are_limited_and_decoded_as_over_http1(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki))
    assert sched.port is not None
    me = _client(pki, pki.client("kube-scheduler", user=KUBE_SCHEDULER), alpn=("h2",))
    bind = json.dumps(k8s_doc("extender-binding-args.json")).encode()
    gzipped = [("content-encoding", "gzip")]
    with capture_logs() as logs:
        plain, zipped, bad, bomb, huge = await _h2_calls(
            sched.port,
            me,
            [
                Call("POST", "/bind", bind),
                Call("POST", "/bind", gzip.compress(bind), gzipped),
                Call("POST", "/bind", b"\x1f\x8b not gzip at all", gzipped),
                Call("POST", "/filter", gzip.compress(b" " * (MAX_BODY + 1)), gzipped),
                Call("POST", "/filter", b"{" + b" " * (MAX_BODY + 1)),
            ],
        )
    assert plain.status == 200 and bytes(zipped.body) == bytes(plain.body)
    assert bad.status == 400 and b"not valid gzip" in bad.body
    assert bomb.status == 413 and huge.status == 413 and str(MAX_BODY).encode() in huge.body
    reasons = [(e["verb"], e["reason"]) for e in logs if e["event"] == "extender_body_refused"]
    assert reasons == [("bind", "bad_encoding"), ("filter", "too_large"), ("filter", "too_large")]


async def test_without_the_setting_kube_scheduler_is_served_http1(
    bus: Bus, start_scheduler: Start, pki: Pki
) -> None:
    sched = await start_scheduler(bus, **_tls_settings(pki, extender_http2=False))
    assert sched.port is not None
    me = _client(pki, pki.client("kube-scheduler", user=KUBE_SCHEDULER), alpn=("h2", "http/1.1"))
    _reader, writer = await asyncio.open_connection("127.0.0.1", sched.port, ssl=me)
    try:
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() in (None, "http/1.1")
    finally:
        writer.close()
    status, text = await _h1_call(sched.port, me, Call("GET", "/readyz"))
    assert (status, text) == (200, b"ready")


async def test_the_bodies_read_at_once_on_one_connection_are_bounded(pki: Pki) -> None:
    """Each body may be up to the limit, but not every stream of a connection
    at once: past twice the limit in flight a stream is answered 413."""
    from aiohttp import web

    from scheduler.extender import http2

    async def answer(request: http2.Request) -> web.Response:
        if isinstance(request.body, bytes):
            return web.Response(text=str(len(request.body)))
        return request.body.response()

    runner = web.AppRunner(web.Application())
    await runner.setup()
    server = pki.serving("extender", names=("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server.cert_file, server.key_file)
    site = http2.Http2Site(
        runner, "127.0.0.1", 0, ssl_context=context, answer=answer, max_body_bytes=1000
    )
    await site.start()
    try:
        calls = [Call("POST", "/filter", b"x" * 900) for _ in range(3)]
        calls.append(Call("POST", "/filter", b"x" * 1001))
        answers = await _h2_calls(
            site.port, _client(pki, None, alpn=("h2",)), calls, bodies_first=True
        )
        assert [a.status for a in answers] == [200, 200, 413, 413]
        assert bytes(answers[0].body) == b"900" and b"1000 bytes" in answers[2].body
        (alone,) = await _h2_calls(
            site.port, _client(pki, None, alpn=("h2",)), [Call("POST", "/bind", b"y" * 1000)]
        )
        assert (alone.status, bytes(alone.body)) == (200, b"1000")
    finally:
        await runner.cleanup()
