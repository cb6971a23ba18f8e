"""A front for the scheduler replicas' extenders, as a Service (or an L7
balancer) before a Deployment's pods is one: kube-scheduler takes one
extender URL, and each request to the front goes to the next replica in turn
(round robin per request, so both replicas bind at once even over
kube-scheduler's few keep-alive connections; per connection, one replica
took nearly every call). A replica that refuses the connection (down) is
skipped for the next one; a request whose replica dies under it gets a 502,
as a broken connection would be an error to kube-scheduler. Over TLS (as
an L7 balancer in front of the replicas is): ``server_tls`` for
kube-scheduler's side, ``client_tls`` (kube-scheduler's client certificate)
towards the replicas. Runs its own event loop in a thread of the test."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections import Counter

import aiohttp
from aiohttp import web

from hcs_bus.natsserver import free_port

TIMEOUT = aiohttp.ClientTimeout(total=30, connect=1)
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class Front:
    """Round robin over ``https://127.0.0.1:<port>`` of each backend, per request."""

    def __init__(
        self,
        backends: list[int],
        *,
        server_tls: ssl.SSLContext,
        client_tls: ssl.SSLContext,
        host: str = "127.0.0.1",
    ) -> None:
        self.backends = list(backends)
        self.server_tls, self.client_tls = server_tls, client_tls
        self.host = host
        self.port = free_port()
        # (backend port, path) -> requests it answered
        self.served: Counter[tuple[int, str]] = Counter()
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="e2e-front")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(timeout=10)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    async def _open(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self.client_tls)
        self._session = aiohttp.ClientSession(timeout=TIMEOUT, connector=connector)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=self.server_tls).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        start, self._next = self._next, self._next + 1
        for i in range(len(self.backends)):
            port = self.backends[(start + i) % len(self.backends)]
            url = f"https://{self.host}:{port}{request.rel_url}"
            try:
                async with self._session.request(
                    request.method, url, data=body, headers=headers
                ) as answer:
                    data = await answer.read()
                    self.served[(port, request.path)] += 1
                    kind = answer.headers.get("Content-Type", "application/json")
                    return web.Response(
                        status=answer.status, body=data, headers={"Content-Type": kind}
                    )
            except aiohttp.ClientConnectorError:
                continue  # down: the next replica
            except (aiohttp.ClientError, TimeoutError) as exc:
                return web.Response(status=502, text=f"replica on port {port}: {exc!r}")
        return web.Response(status=503, text="no scheduler replica accepts connections")
