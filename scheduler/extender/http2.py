"""The extender's HTTP/2 side: kube-scheduler's calls on one connection.

kube-scheduler's extender client (Go ``net/http``) keeps at most two idle
connections per host, and binds run in parallel (one goroutine per pod,
each waiting on the API server's Binding): under a burst every call past
the second opened a new TLS connection and paid a full mutual-TLS
handshake, about a millisecond of this process's CPU. The same client
speaks HTTP/2 when the server offers it by ALPN; then every call, binds and
filters together, is a stream of one connection that stays open.

``Http2Site`` listens like aiohttp's ``TCPSite``; a TLS connection whose
ALPN chose ``h2`` is served here (``h2``'s state machine, flow control and
all), any other goes on to the aiohttp application unchanged (probes, other
clients). Each request's body, undone from ``Content-Encoding`` and held to
``max_body_bytes`` as ``hcs_bus.httpbodies`` does for HTTP/1.1, is handed
with its method, path and the client certificate's names to ``answer``,
which returns the ``web.Response`` to send: the same answer either way. The
bodies being read at once on one connection are held to ``BUFFERED_BODIES``
times that (past it a stream is answered 413): one connection carries many
calls at once, where HTTP/1.1 carries one.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from aiohttp import web

from hcs_bus import httpbodies, tls
from hcs_bus.telemetry import logger

_log = logger("hcs.scheduler.extender.http2")
ALPN = ("h2", "http/1.1")
MAX_STREAMS = 256  # calls open at once on one connection (kube-scheduler's binds in flight)
WINDOW_BYTES = 1024 * 1024  # each stream's receive window: a 5,000-node filter in one go
MAX_HEADER_BYTES = 64 * 1024
SHUTDOWN_S = 5.0  # calls in flight finish within this when the server stops
BUFFERED_BODIES = 2  # the bodies read at once on one connection: at most this × max_body_bytes


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP/2 request, read whole."""

    method: str
    path: str  # without the query
    body: bytes | httpbodies.Refusal
    peer_names: frozenset[str]  # of a verified client certificate; empty for none


Answer = Callable[[Request], Awaitable[web.Response]]


@dataclass(slots=True)
class _Stream:
    method: str
    path: str
    encoding: str
    body: bytearray = field(default_factory=bytearray)
    refusal: httpbodies.Refusal | None = None


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 connection: requests in, ``answer``'s responses out."""

    def __init__(self, answer: Answer, *, max_body_bytes: int, owner: set[Http2Connection]):
        self.answer, self.max_body_bytes, self.owner = answer, max_body_bytes, owner
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding="utf-8",
            # the answers' two headers are ours, lower-case and well-formed:
            # not checked again per answer (the requests' headers still are)
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config=config)
        self.transport: asyncio.Transport | None = None
        self.peer_names: frozenset[str] = frozenset()
        self.streams: dict[int, _Stream] = {}
        self.buffered = 0  # bytes of the bodies of ``streams``, read so far
        self.tasks: set[asyncio.Task[None]] = set()
        self.windows: dict[int, asyncio.Event] = {}  # streams waiting for flow-control room
        self.flushing = False  # a flush is due in this turn of the event loop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        self.peer_names = frozenset(tls.peer_names(transport.get_extra_info("peercert")))
        self.owner.add(self)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_BYTES,
            },
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW_BYTES)  # the connection's, past 64 KiB
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.discard(self)
        self.transport = None
        for waiting in self.windows.values():
            waiting.set()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            _log.warning("http2_protocol_error", error=str(exc))
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            self._on(event)
        self._flush_soon()

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._begin(event.stream_id, event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            self._body(event.stream_id, event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.StreamEnded):
            self._start(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self._forget(event.stream_id or 0)
            self._wake(event.stream_id or 0)
        elif isinstance(event, h2.events.WindowUpdated):
            self._wake(event.stream_id or 0)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._wake(0)  # a new initial window size moves every stream's
        elif isinstance(event, h2.events.ConnectionTerminated) and self.transport is not None:
            self.transport.close()

    def _begin(self, stream_id: int, headers: list[Any]) -> None:
        found = {str(k): str(v) for k, v in headers}
        path = found.get(":path", "/").partition("?")[0]
        encoding = found.get("content-encoding", "identity").strip().lower()
        self.streams[stream_id] = _Stream(found.get(":method", ""), path, encoding)
        size = found.get("content-length", "")
        if size.isdigit() and int(size) > self.max_body_bytes:
            refused = httpbodies.too_large(self.max_body_bytes, size=int(size))
            self.streams[stream_id].refusal = refused

    def _body(self, stream_id: int, data: bytes, flow: int) -> None:
        self.h2.acknowledge_received_data(flow, stream_id)
        stream = self.streams.get(stream_id)
        if stream is None or stream.refusal is not None:
            return
        over = len(stream.body) + len(data) > self.max_body_bytes
        if over or self.buffered + len(data) > BUFFERED_BODIES * self.max_body_bytes:
            # one body past the limit, or all those in flight past twice it
            # (streams are many to a connection, unlike HTTP/1.1 requests)
            stream.refusal = httpbodies.too_large(self.max_body_bytes, size=None)
            self.buffered -= len(stream.body)
            stream.body = bytearray()
            return
        stream.body += data
        self.buffered += len(data)

    def _forget(self, stream_id: int) -> _Stream | None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self.buffered -= len(stream.body)
        return stream

    def _start(self, stream_id: int) -> None:
        stream = self._forget(stream_id)
        if stream is None:
            return
        body = stream.refusal or _decoded(stream, limit=self.max_body_bytes)
        request = Request(stream.method, stream.path, body, self.peer_names)
        task = asyncio.get_running_loop().create_task(self._serve(stream_id, request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, stream_id: int, request: Request) -> None:
        try:
            response = await self.answer(request)
        except Exception as exc:  # the answer's own guard failed: a 500, the stream kept apart
            _log.error("http2_answer_failed", path=request.path, error=repr(exc), exc_info=exc)
            response = web.Response(status=500, text=f"hcs: {exc!r}")
        await self._respond(stream_id, response)

    async def _respond(self, stream_id: int, response: web.Response) -> None:
        body = response.body
        if isinstance(body, bytes):
            payload = body
        else:
            payload = bytes(body) if isinstance(body, bytearray | memoryview) else b""
        content_type = response.content_type
        if response.charset:
            content_type += f"; charset={response.charset}"
        # no content-length: END_STREAM ends the body. Each length would be a
        # new HPACK entry, searched for and added at every answer, and would
        # crowd the two headers that repeat out of the connection's table.
        headers = [(":status", str(response.status)), ("content-type", content_type)]
        try:
            self.h2.send_headers(stream_id, headers, end_stream=not payload)
            await self._send(stream_id, memoryview(payload))
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return  # the client reset the stream, or the connection went: nobody to tell

    async def _send(self, stream_id: int, rest: memoryview) -> None:
        while rest:
            if self.transport is None:
                return
            room = min(
                self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size
            )
            if room <= 0:
                self._flush()
                waiting = self.windows.setdefault(stream_id, asyncio.Event())
                await waiting.wait()
                self.windows.pop(stream_id, None)
                continue
            part, rest = rest[:room], rest[room:]
            self.h2.send_data(stream_id, part.tobytes(), end_stream=not rest)
        self._flush_soon()

    def _wake(self, stream_id: int) -> None:
        """Streams waiting for room: the one named, or all (0: the connection's window)."""
        for key, waiting in self.windows.items():
            if stream_id in (0, key):
                waiting.set()

    def _flush_soon(self) -> None:
        """Flush once the event loop has run what is ready: the answers that
        finish together go out in one write (one TLS record, one wake-up of
        the peer) rather than one each."""
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        out = self.h2.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    async def shutdown(self, *, timeout_s: float) -> None:
        """GOAWAY (no new calls), the calls in flight answered, then close."""
        if self.transport is None:
            return
        self.h2.close_connection()
        self._flush()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout_s)
        if self.transport is not None:
            self.transport.close()


def _decoded(stream: _Stream, *, limit: int) -> bytes | httpbodies.Refusal:
    """The body undone from its ``Content-Encoding`` (gzip, deflate), at most ``limit`` bytes."""
    if stream.encoding in ("identity", ""):
        return bytes(stream.body)
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
    if stream.encoding not in wbits:
        message = f"Content-Encoding {stream.encoding!r} is not supported (gzip, deflate)"
        return httpbodies.Refusal(415, "bad_encoding", message)
    inflate = zlib.decompressobj(wbits[stream.encoding])
    try:
        out = inflate.decompress(bytes(stream.body), limit + 1)
    except zlib.error as exc:
        message = (
            f"the body is not valid {stream.encoding} (Content-Encoding: {stream.encoding}): {exc}"
        )
        return httpbodies.Refusal(400, "bad_encoding", message)
    if len(out) > limit:
        return httpbodies.too_large(limit, size=None)
    if not inflate.eof:
        return httpbodies.Refusal(
            400, "unreadable", "truncated or unreadable body: stream ended early"
        )
    return out


class _Choose(asyncio.Protocol):
    """Stands in until the TLS handshake is done, then hands the connection
    to HTTP/2 (ALPN ``h2``) or to the aiohttp server (anything else)."""

    def __init__(
        self,
        h1: Callable[[], asyncio.Protocol],
        h2_factory: Callable[[], Http2Connection],
    ) -> None:
        self.h1, self.h2_factory = h1, h2_factory

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sslobj = transport.get_extra_info("ssl_object")
        chosen = sslobj.selected_alpn_protocol() if sslobj is not None else None
        inner: asyncio.Protocol = self.h2_factory() if chosen == "h2" else self.h1()
        transport.set_protocol(inner)
        inner.connection_made(transport)


class Http2Site(web.TCPSite):
    """``web.TCPSite`` that also serves HTTP/2 to TLS clients that choose it
    (ALPN): their requests go to ``answer``, the others' to the runner's
    aiohttp application. Without TLS it is a plain ``TCPSite``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        answer: Answer,
        max_body_bytes: int,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.answer, self.max_body_bytes = answer, max_body_bytes
        self.connections: set[Http2Connection] = set()
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(list(ALPN))

    async def start(self) -> None:
        if self._ssl_context is None:
            return await super().start()
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        h1 = server  # aiohttp's web.Server: a protocol factory

        def h2_factory() -> Http2Connection:
            return Http2Connection(
                self.answer, max_body_bytes=self.max_body_bytes, owner=self.connections
            )

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Choose(h1, h2_factory),  # type: ignore[arg-type]
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]
        return None

    async def stop(self) -> None:
        await super().stop()
        if self.connections:
            await asyncio.gather(
                *(c.shutdown(timeout_s=SHUTDOWN_S) for c in list(self.connections)),
                return_exceptions=True,
            )
