"""The bus adapter: the only module that publishes or consumes for the parts.

* ``connect(settings)`` — one connection per process, unlimited reconnects
  with jitter, every callback logged, drained on SIGTERM.
* ``Bus.publish`` — JetStream publish with ``Nats-Msg-Id`` (dedup on retry)
  and a W3C ``traceparent``; retried with the same id until acked.
* ``Bus.publish_window`` — windowed async publish for hot paths.
* ``Bus.request`` / ``Bus.serve`` — core request-reply (admission path).
* ``Consumer`` — a durable or ephemeral pull consumer fetching batches;
  handlers get decoded messages; an undecodable message goes to
  ``hcs.dlq.<subject>`` (counted, logged with subject and sequence) and is
  terminated, never stalling the loop. The error type decides the ack.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from hcs_bus import messages, subjects
from hcs_bus.errors import (
    BadMessage,
    BusTimeout,
    BusUnavailable,
    PermanentError,
    TemporaryError,
)
from hcs_bus.settings import BusSettings
from hcs_bus.telemetry import extract_context, inject_headers, logger, meter, tracer

T = TypeVar("T")
R = TypeVar("R")

_log = logger("hcs.bus")
_meter = meter("hcs.bus")
DEAD_LETTERS = _meter.create_counter("hcs_bus_dead_letters", description="messages sent to DLQ")
PUBLISHED = _meter.create_counter("hcs_bus_published", description="messages published")
_tracer = tracer("hcs.bus")

MSG_ID = "Nats-Msg-Id"


async def connect(settings: BusSettings, *, name: str | None = None) -> Bus:
    """Connect with unlimited reconnects; log every connection state change."""
    conn_name = name or settings.name

    async def on_error(exc: Exception) -> None:
        _log.warning("nats_error", connection=conn_name, error=repr(exc))

    async def on_disconnected() -> None:
        if nc.is_closed or nc.is_draining:
            _log.info("nats_disconnected", connection=conn_name, closing=True)
        else:
            _log.warning("nats_disconnected", connection=conn_name)

    async def on_reconnected() -> None:
        _log.info("nats_reconnected", connection=conn_name, url=_url(nc))

    async def on_closed() -> None:
        _log.info("nats_closed", connection=conn_name)

    nc = Client()
    options: dict[str, Any] = {
        "servers": [u.strip() for u in settings.url.split(",")],
        "name": conn_name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": settings.reconnect_wait_s,
        "ping_interval": settings.ping_interval_s,
        "connect_timeout": settings.connect_timeout_s,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed,
        "allow_reconnect": True,
        "drain_timeout": settings.drain_timeout_s,
    }
    if settings.inbox_prefix:
        options["inbox_prefix"] = settings.inbox_prefix
    options.update(_auth_options(settings))
    try:
        await nc.connect(**options)
    except Exception as exc:  # nats raises several unrelated types here
        raise BusUnavailable(f"cannot connect to NATS at {settings.url}: {exc!r}") from exc
    _log.info("nats_connected", connection=conn_name, url=_url(nc))
    return Bus(nc)


def _auth_options(settings: BusSettings) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if settings.creds_file:
        options["user_credentials"] = settings.creds_file
    if settings.nkey_seed_file:
        options["nkeys_seed"] = settings.nkey_seed_file
    if settings.user:
        options["user"] = settings.user
        options["password"] = settings.password or ""
    if settings.tls_ca_file or settings.tls_cert_file:
        ctx = ssl.create_default_context(cafile=settings.tls_ca_file)
        if settings.tls_cert_file and settings.tls_key_file:
            ctx.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        options["tls"] = ctx
    return options


class Bus:
    """A connection plus its JetStream context."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def publish(
        self,
        subject: str,
        message: msgspec.Struct,
        *,
        msg_id: str,
        timeout_s: float = 2.0,
        attempts: int | None = 5,
    ) -> int:
        """Publish into a stream and wait for the ack; retry with the same id.

        ``attempts=None`` retries forever (agents buffering across an outage
        use their own buffer instead). Returns the stream sequence.
        """
        data = messages.encode(message)
        headers = inject_headers({MSG_ID: msg_id})
        tried = 0
        while True:
            tried += 1
            try:
                ack = await self.js.publish(subject, data, timeout=timeout_s, headers=headers)
                PUBLISHED.add(1, {"subject_family": _family(subject)})
                return int(ack.seq)
            except (NatsTimeout, NoRespondersError, ConnectionError) as exc:
                if attempts is not None and tried >= attempts:
                    raise BusTimeout(f"publish to {subject} not acked: {exc!r}") from exc
                await asyncio.sleep(min(0.1 * 2**tried, 2.0))
            except nats.errors.ConnectionClosedError as exc:
                raise BusUnavailable(f"publish to {subject}: connection closed") from exc

    async def publish_window(
        self, items: Iterable[tuple[str, msgspec.Struct, str]], *, window: int = 1000
    ) -> None:
        """Windowed async publish of (subject, message, msg_id); waits for all acks."""
        js = self.js
        for count, (subject, message, msg_id) in enumerate(items, start=1):
            headers = inject_headers({MSG_ID: msg_id})
            await js.publish_async(subject, messages.encode(message), headers=headers)
            if count % window == 0:
                await js.publish_async_completed()
        await js.publish_async_completed()

    async def request(
        self, subject: str, message: msgspec.Struct, reply: type[R], *, timeout_s: float
    ) -> R:
        """Core request-reply within ``timeout_s``; raises BusTimeout or BadMessage.

        "No responders" (say, during a rollout of the serving replicas) is
        retried until the budget is spent, never answered at once.
        """
        headers = inject_headers({})
        data = messages.encode(message)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise NatsTimeout
                msg = await self.nc.request(subject, data, timeout=left, headers=headers)
                break
            except NoRespondersError:
                await asyncio.sleep(min(0.02, max(deadline - loop.time(), 0)))
            except (TimeoutError, NatsTimeout) as exc:
                raise BusTimeout(f"no answer on {subject} within {timeout_s}s") from exc
        try:
            return messages.decode(msg.data, reply)
        except msgspec.MsgspecError as exc:
            raise BadMessage(f"reply on {subject} is not a {reply.__name__}: {exc}") from exc

    async def serve(
        self,
        subject: str,
        request: type[T],
        handler: Callable[[T], Awaitable[msgspec.Struct]],
        *,
        queue: str,
        on_bad: Callable[[str], msgspec.Struct],
    ) -> Any:
        """Answer requests on ``subject`` in a queue group. A request that does
        not decode is answered with ``on_bad(reason)`` and counted; a handler
        that raises is answered with ``on_bad(reason)`` too, never left to
        time out."""

        async def respond(msg: Msg) -> None:
            try:
                value = messages.decode(msg.data, request)
            except msgspec.MsgspecError as exc:
                DEAD_LETTERS.add(1, {"subject_family": _family(subject)})
                _log.warning("bad_request", subject=subject, error=str(exc))
                await msg.respond(messages.encode(on_bad(f"bad request: {exc}")))
                return
            try:
                with _tracer.start_as_current_span(subject, context=extract_context(msg.headers)):
                    answer = await handler(value)
            except Exception as exc:  # the asker gets a reason now, not a timeout later
                _log.error("request_failed", subject=subject, error=repr(exc), exc_info=exc)
                answer = on_bad(f"failed: {exc!r}")
            await msg.respond(messages.encode(answer))

        return await self.nc.subscribe(subject, queue=queue, cb=respond)

    async def dead_letter(self, msg: Msg, *, reason: str) -> None:
        """Copy a message to ``hcs.dlq.<subject>`` with its origin and reason."""
        seq = _seq(msg)
        DEAD_LETTERS.add(1, {"subject_family": _family(msg.subject)})
        _log.warning("dead_letter", subject=msg.subject, seq=seq, reason=reason)
        headers = {
            "Hcs-Origin-Subject": msg.subject,
            "Hcs-Origin-Seq": str(seq),
            "Hcs-Reason": reason[:500],
            MSG_ID: f"dlq:{msg.subject}:{seq}",
        }
        try:
            await self.js.publish(subjects.dlq(msg.subject), msg.data, headers=headers)
        except Exception as exc:  # the DLQ must never stall the consumer
            _log.error("dead_letter_failed", subject=msg.subject, seq=seq, error=repr(exc))

    async def drain(self) -> None:
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()


def _url(nc: Client) -> str:
    url = nc.connected_url
    return url.geturl() if url is not None else ""


def _raise_if_cancelling() -> None:
    """nats-py's fetch can swallow a cancellation; honour one still pending."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _family(subject: str) -> str:
    return ".".join(subject.split(".")[:2])


def _ack_fields(msg: Msg) -> tuple[int, int]:
    """(stream sequence, pending) straight from the ack subject — nats-py's
    ``msg.metadata`` builds several objects per message (~7% of a replay)."""
    tokens = (msg.reply or "").split(".")
    try:
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<dlv>.<sseq>.<cseq>.<ts>.<pending>
            return int(tokens[5]), int(tokens[8])
        if len(tokens) >= 11:  # with <domain>.<account hash> after ACK
            return int(tokens[7]), int(tokens[10])
    except ValueError:
        pass
    meta = msg.metadata
    return int(meta.sequence.stream), int(meta.num_pending)


def _seq(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:
        return 0


@dataclass(frozen=True, slots=True)
class Delivery(Generic[T]):
    subject: str
    value: T
    stream_seq: int
    pending: int
    headers: dict[str, str] | None


class Consumer(Generic[T]):
    """A pull consumer over one stream that decodes and hands batches on.

    ``handle`` receives a list of decoded deliveries (in stream order). If it
    raises ``TemporaryError`` the whole batch is nak'ed with the delay; a
    ``PermanentError`` terminates the batch (dead-lettered). Undecodable
    messages never reach ``handle``. ``durable=None`` makes an ephemeral
    consumer (each scheduler replica replays the whole view for itself).
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        kind: type[T],
        handle: Callable[[list[Delivery[T]]], Awaitable[None]],
        filter_subject: str | None = None,
        durable: str | None = None,
        deliver: DeliverPolicy = DeliverPolicy.ALL,
        batch: int = 500,
        fetch_timeout_s: float = 1.0,
        max_deliver: int = 5,
        ack_wait_s: float = 30.0,
        ack_all: bool = False,
        opt_start_time: datetime.datetime | None = None,
    ) -> None:
        self.bus = bus
        self.opt_start_time = opt_start_time
        self.stream = stream
        self.kind = kind
        self.handle = handle
        self.filter_subject = filter_subject
        self.durable = durable
        self.deliver = deliver
        self.batch = batch
        self.fetch_timeout_s = fetch_timeout_s
        self.max_deliver = max_deliver
        self.ack_wait_s = ack_wait_s
        self.ack_all = ack_all
        self.caught_up = asyncio.Event()
        self.delivered = 0
        self.dead = 0
        self._decoder = messages.decoder_for(kind)
        self._sub: JetStreamContext.PullSubscription | None = None

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.ALL if self.ack_all else AckPolicy.EXPLICIT,
            deliver_policy=self.deliver,
            max_deliver=self.max_deliver,
            ack_wait=self.ack_wait_s,
            max_ack_pending=max(2 * self.batch, 1000),
            filter_subject=self.filter_subject,
            opt_start_time=self.opt_start_time,
            inactive_threshold=None if self.durable else 300.0,
        )
        self._sub = await self.bus.js.pull_subscribe(
            self.filter_subject or "", durable=self.durable, stream=self.stream, config=config
        )
        info = await self._sub.consumer_info()
        if info.num_pending == 0:
            self.caught_up.set()

    async def run(self) -> None:
        """Fetch → decode → handle → ack until cancelled. A stalled fetch is retried;
        on the way out the subscription is removed, so a drain does not wait on it."""
        try:
            await self._loop()
        finally:
            sub, self._sub = self._sub, None
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _loop(self) -> None:
        """The watchdog: whatever a fetch or a (re)subscription raises, the loop
        waits a moment, subscribes again and carries on (DESIGN §7.3)."""
        while True:
            _raise_if_cancelling()
            try:
                if self._sub is None:
                    await self.start()
                assert self._sub is not None
                batch = await self._sub.fetch(self.batch, timeout=self.fetch_timeout_s)
            except (NatsTimeout, TimeoutError):  # nats-py's fetch also raises the builtin
                self.caught_up.set()
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                await asyncio.sleep(self.fetch_timeout_s)
                continue
            except Exception as exc:  # NotFound (consumer deleted) and the unforeseen
                _log.warning(
                    "consumer_restarting", stream=self.stream, durable=self.durable, error=repr(exc)
                )
                self._sub = None
                await asyncio.sleep(self.fetch_timeout_s)
                continue
            if not batch:
                self.caught_up.set()
                continue
            await self._process(batch)

    async def _process(self, batch: list[Msg]) -> None:
        good: list[Delivery[T]] = []
        good_msgs: list[Msg] = []
        decode = self._decoder.decode
        for msg in batch:
            try:
                value = decode(msg.data)
            except msgspec.MsgspecError as exc:
                self.dead += 1
                await self.bus.dead_letter(msg, reason=f"undecodable {self.kind.__name__}: {exc}")
                await msg.term()
                continue
            seq, pending = _ack_fields(msg)
            good.append(Delivery(msg.subject, value, seq, pending, msg.headers))
            good_msgs.append(msg)
        if good:
            await self._hand_on(good, good_msgs)
        self.delivered += len(batch)
        if _ack_fields(batch[-1])[1] == 0:
            self.caught_up.set()

    async def _hand_on(self, good: list[Delivery[T]], msgs: list[Msg]) -> None:
        try:
            await self.handle(good)
        except TemporaryError as exc:
            _log.warning("batch_retry", stream=self.stream, error=str(exc), delay_s=exc.delay_s)
            for msg in msgs:
                await msg.nak(delay=exc.delay_s)
            return
        except PermanentError as exc:
            for msg in msgs:
                await self.bus.dead_letter(msg, reason=str(exc))
                await msg.term()
            return
        if self.ack_all:
            await msgs[-1].ack()
        else:
            for msg in msgs:
                await msg.ack()


class Follower(Generic[T]):
    """Replays, then follows, a stream with an ordered push consumer.

    For derived state that every replica rebuilds for itself (the scheduler's
    cluster view, ``hcs top``): no acks, flow-controlled, recreated by the
    client on a sequence gap, and several times faster than pull fetches
    (DESIGN §7: ~100k messages replayed in about a second). ``handle`` is a
    plain function called once per decoded message, in stream order.
    Undecodable messages are copied to ``hcs.dlq.<subject>`` and counted.
    ``caught_up`` is set once everything the stream held at start has been
    handled.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        subject: str,
        kind: type[T],
        handle: Callable[[Delivery[T]], None],
        deliver: DeliverPolicy = DeliverPolicy.ALL,
        opt_start_time: datetime.datetime | None = None,
    ) -> None:
        self.bus = bus
        self.stream = stream
        self.subject = subject
        self.kind = kind
        self.handle = handle
        self.deliver = deliver
        self.opt_start_time = opt_start_time
        self.caught_up = asyncio.Event()
        self.delivered = 0
        self.dead = 0
        self.failed = 0
        self._decode = messages.decoder_for(kind).decode
        self._sub: JetStreamContext.PushSubscription | None = None

    async def start(self) -> None:
        config = ConsumerConfig(deliver_policy=self.deliver, opt_start_time=self.opt_start_time)
        self._sub = await self.bus.js.subscribe(
            self.subject,
            stream=self.stream,
            cb=self._on_msg,
            config=config,
            ordered_consumer=True,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1 << 30,
        )
        info = await self._sub.consumer_info()
        delivered = info.delivered.consumer_seq if info.delivered else 0
        if info.num_pending == 0 and self.delivered >= (delivered or 0):
            self.caught_up.set()

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        self.delivered += 1
        try:
            value = self._decode(msg.data)
        except msgspec.MsgspecError as exc:
            self.dead += 1
            await self.bus.dead_letter(msg, reason=f"undecodable {self.kind.__name__}: {exc}")
            value = None
        seq, pending = _ack_fields(msg)
        if value is not None:
            try:
                self.handle(Delivery(msg.subject, value, seq, pending, msg.headers))
            except Exception as exc:  # one bad message must not stop the view
                self.failed += 1
                _log.error("handler_failed", subject=msg.subject, seq=seq, error=repr(exc))
        if pending == 0:
            self.caught_up.set()
