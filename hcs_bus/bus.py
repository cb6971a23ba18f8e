"""The bus adapter: the only module that publishes or consumes for the parts.

* ``connect(settings)`` — one connection per process, unlimited reconnects
  with jitter, every callback logged, drained on SIGTERM.
* ``Bus.publish`` — JetStream publish with ``Nats-Msg-Id`` (dedup on retry)
  and a W3C ``traceparent``; retried with the same id until acked.
* ``Bus.publish_window`` — windowed async publish for hot paths.
* ``Bus.request`` / ``Bus.serve`` — core request-reply (admission path).
  A service answers only into an inbox (``subjects.is_inbox``): a request
  whose reply subject is anything else (a stream's subject, a bucket key,
  the JetStream API) is dropped unhandled, logged once and counted
  (``hcs_bus_replies_refused``), so no requester can make a service write
  where it may and the requester may not. Answers never echo the request's
  headers (a rollup or KV-Operation header is the requester's to set on
  its own publishes, not on ours). A request says how long its asker
  still waits (``Hcs-Wait-S``); a service started with ``expires=True``
  drops one whose wait ran out while it sat in this process's queues
  (``hcs_bus_requests_expired``), and its handler reads what is left with
  ``time_left()``.
* ``Consumer`` / ``Follower`` (``hcs_bus.consuming``, re-exported here) —
  pull batches / an ordered replay; handlers get decoded messages only;
  poison goes to ``hcs.dlq.<subject>`` once per stream sequence
  (``hcs_bus.deadletters``), never stalling the loop; a crashed loop is
  restarted. The error type decides the ack.

No URL with credentials, password or token is ever logged or put in an
error message: every one passes ``hcs_bus.redacting.redact_url`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError

from hcs_bus import messages, subjects
from hcs_bus.deadletters import DEAD_LETTERS, DeadLetters, family
from hcs_bus.errors import BadMessage, BusTimeout, BusUnavailable, StaleWrite
from hcs_bus.redacting import redact_text, redact_url
from hcs_bus.settings import BusSettings
from hcs_bus.telemetry import (
    TRACEPARENT,
    TallyCounter,
    inject_headers,
    logger,
    meter,
    span,
    zero_init,
)

T = TypeVar("T")
R = TypeVar("R")

_log = logger("hcs.bus")
_meter = meter("hcs.bus")
PUBLISHED = TallyCounter(
    "hcs_bus_published", description="messages published", meter_name="hcs.bus"
)

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code: the subject's last sequence differs
SENDER = "Hcs-Sender"  # the requester's connection name, as it says (for logs; not proof)
WAIT = "Hcs-Wait-S"  # how many seconds the requester still waits for the answer, as it sends
REFUSED_REASONS = ("no_reply", "not_inbox")
REPLIES_REFUSED = zero_init(
    _meter.create_counter(
        "hcs_bus_replies_refused",
        description="requests left unanswered: their reply subject is not an inbox",
    ),
    *(
        {"subject": served, "reason": reason}
        for served in (subjects.PLACE, subjects.PLACE_DRY, subjects.RELEASE)
        for reason in REFUSED_REASONS
    ),
)

EXPIRED = zero_init(
    _meter.create_counter(
        "hcs_bus_requests_expired",
        description="requests dropped unhandled: their asker's wait (Hcs-Wait-S) ran out"
        " while they queued in the serving process",
    ),
    *({"subject": served} for served in (subjects.PLACE, subjects.PLACE_DRY)),
)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "hcs_request_deadline", default=None
)


@dataclasses.dataclass
class _TimedMsg(Msg):
    """A message that knows when this process parsed it (``time.monotonic``):
    how long it then queued here is what a request's wait is measured against."""

    arrived: float = dataclasses.field(default_factory=time.monotonic, repr=False, compare=False)


def time_left() -> float | None:
    """Inside a ``Bus.serve`` handler: the seconds its asker still waits for
    the answer, by the request's ``Hcs-Wait-S`` less the time it queued here;
    None when the request did not say."""
    deadline = _DEADLINE.get()
    return None if deadline is None else deadline - time.monotonic()


def _deadline(msg: Msg) -> float | None:
    """The monotonic time past which ``msg``'s asker no longer waits, or None."""
    said = (msg.headers or {}).get(WAIT)
    if said is None:
        return None
    try:
        wait = float(said)
    except ValueError:
        return None
    if not math.isfinite(wait) or wait < 0:
        return None
    return getattr(msg, "arrived", time.monotonic()) + min(wait, 3600.0)


async def connect(
    settings: BusSettings, *, name: str | None = None, give_up_after_s: float | None = None
) -> Bus:
    """Connect with unlimited reconnects; log every connection state change.

    ``give_up_after_s``: a bound on the first connection (a command line
    answers rather than waits): past it, BusUnavailable names the URL and the
    last attempt's error, which is then not logged once per attempt.
    Reconnects after a first success stay unlimited.
    """
    conn_name = name or settings.name
    first_errors: list[Exception] = []
    connected_once = False

    async def on_error(exc: Exception) -> None:
        if give_up_after_s is not None and not connected_once:
            first_errors.append(exc)
            _log.debug("nats_error", connection=conn_name, error=redact_text(repr(exc)))
            return
        _log.warning("nats_error", connection=conn_name, error=redact_text(repr(exc)))

    async def on_disconnected() -> None:
        if not connected_once:  # a first connection given up: BusUnavailable says so
            return
        if nc.is_closed or nc.is_draining:
            _log.info("nats_disconnected", connection=conn_name, closing=True)
        else:
            _log.warning("nats_disconnected", connection=conn_name)

    async def on_reconnected() -> None:
        _log.info("nats_reconnected", connection=conn_name, url=_url(nc))

    async def on_closed() -> None:
        if connected_once:
            _log.info("nats_closed", connection=conn_name)

    nc = Client()
    nc.msg_class = _TimedMsg
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
        async with asyncio.timeout(give_up_after_s):
            await nc.connect(**options)
    except TimeoutError as exc:
        with contextlib.suppress(Exception):
            await nc.close()
        said = [e for e in first_errors if isinstance(e, nats.errors.Error)]  # the server's word
        why = _describe((said or first_errors)[-1], settings) if first_errors else "no answer"
        after = f" (gave up after {give_up_after_s:g} s)" if give_up_after_s is not None else ""
        raise BusUnavailable(
            f"cannot reach NATS at {redact_url(settings.url)}: {redact_text(why)}{after}"
        ) from exc
    except Exception as exc:  # nats raises several unrelated types here
        where, why = redact_url(settings.url), redact_text(repr(exc))
        raise BusUnavailable(f"cannot connect to NATS at {where}: {why}") from exc
    connected_once = True
    _log.info("nats_connected", connection=conn_name, url=_url(nc))
    return Bus(nc)


def _describe(exc: Exception, settings: BusSettings) -> str:
    """A failed connection attempt in words (for the one line a command prints)."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | NatsTimeout):
        return f"no answer within {settings.connect_timeout_s:g} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip() or type(exc).__name__


def _auth_options(settings: BusSettings) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if settings.creds_file:
        options["user_credentials"] = settings.creds_file
    if settings.nkey_seed_file:
        options["nkeys_seed"] = settings.nkey_seed_file
    if settings.user:
        options["user"] = settings.user
        options["password"] = settings.password or ""
    if settings.token:
        options["token"] = settings.token
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
        self.dead_letters = DeadLetters(nc, self.js)

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
        traceparent: str | None = None,
        expect_last_subject_seq: int | None = None,
    ) -> int:
        """Publish into a stream and wait for the ack; retry with the same id.

        ``attempts=None`` retries forever (agents buffering across an outage
        use their own buffer instead). Returns the stream sequence. The trace
        context is the current span's, or ``traceparent`` (a message queued
        earlier, published later, keeps the trace it was queued in).
        ``expect_last_subject_seq``: store it only if the subject's last
        stream sequence is that (0: none), else ``StaleWrite``; a retry
        the server already stored is acked as its duplicate first.
        """
        data = messages.encode(message)
        headers = inject_headers({MSG_ID: msg_id})
        if traceparent:
            headers[TRACEPARENT] = traceparent
        if expect_last_subject_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expect_last_subject_seq)
        tried = 0
        while True:
            tried += 1
            try:
                ack = await self.js.publish(subject, data, timeout=timeout_s, headers=headers)
                PUBLISHED.add(1, {"subject_family": family(subject)})
                return int(ack.seq)
            except (NatsTimeout, NoRespondersError, ConnectionError) as exc:
                if attempts is not None and tried >= attempts:
                    raise BusTimeout(f"publish to {subject} not acked: {exc!r}") from exc
                await asyncio.sleep(min(0.1 * 2**tried, 2.0))
            except nats.errors.ConnectionClosedError as exc:
                raise BusUnavailable(f"publish to {subject}: connection closed") from exc
            except BadRequestError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
                found = (exc.description or "").rpartition(":")[2].strip()
                last = int(found) if found.isdigit() else -1
                raise StaleWrite(f"publish to {subject}: {exc.description}", last_seq=last) from exc

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
        name = getattr(self.nc, "options", {}).get("name")
        if name:
            headers[SENDER] = str(name)
        data = messages.encode(message)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise NatsTimeout
                headers[WAIT] = f"{left:.3f}"
                msg = await self.nc.request(subject, data, timeout=left, headers=headers)
                break
            except NoRespondersError:
                await asyncio.sleep(min(0.02, max(deadline - loop.time(), 0)))
            except (TimeoutError, NatsTimeout) as exc:
                raise BusTimeout(f"no answer on {subject} within {timeout_s}s") from exc
        try:
            return messages.decode(msg.data, reply)
        except Exception as exc:  # hostile bytes raise more than MsgspecError
            raise BadMessage(f"reply on {subject} is not a {reply.__name__}: {exc}") from exc

    async def serve(
        self,
        subject: str,
        request: type[T],
        handler: Callable[[T], Awaitable[msgspec.Struct]],
        *,
        queue: str,
        on_bad: Callable[[str], msgspec.Struct],
        concurrency: int = 1,
        expires: bool = False,
    ) -> Any:
        """Answer requests on ``subject`` in a queue group. A request whose
        reply subject is not an inbox is dropped before it is decoded or
        handled (``_refused``). A request that does not decode is answered
        with ``on_bad(reason)`` and counted; a handler that raises is answered
        with ``on_bad(reason)`` too, never left to time out. ``concurrency``
        > 1: up to that many handlers at once (for handlers that wait on
        I/O), else one after the other. ``expires``: a request whose asker
        has stopped waiting (``Hcs-Wait-S``) by the time its handler would
        start is dropped unhandled and unanswered (``_expired``); for work
        that is wasted, or worse, once nobody reads the answer."""

        async def answer_with(msg: Msg, answer: msgspec.Struct) -> None:
            try:  # no headers: the request's are not ours to repeat
                await self.nc.publish(msg.reply, messages.encode(answer))
            except Exception as exc:  # a closed connection must not end the service
                _log.warning("reply_failed", subject=subject, error=redact_text(repr(exc)))

        async def respond(msg: Msg) -> None:
            deadline = _deadline(msg)
            if expires and deadline is not None and deadline <= time.monotonic():
                _expired(subject, msg, deadline)
                return
            token = _DEADLINE.set(deadline)
            try:
                await respond_by(msg)
            finally:
                _DEADLINE.reset(token)

        async def respond_by(msg: Msg) -> None:
            try:
                value = messages.decode(msg.data, request)
            except Exception as exc:  # hostile bytes raise more than MsgspecError
                DEAD_LETTERS.add(1, {"subject_family": family(subject)})
                _log.warning("bad_request", subject=subject, error=str(exc))
                await answer_with(msg, on_bad(f"bad request: {exc}"))
                return
            try:
                with span(f"serve {subject}", headers=msg.headers):
                    answer = await handler(value)
            except Exception as exc:  # the asker gets a reason now, not a timeout later
                _log.error("request_failed", subject=subject, error=repr(exc), exc_info=exc)
                answer = on_bad(f"failed: {exc!r}")
            await answer_with(msg, answer)

        if concurrency <= 1:

            async def one(msg: Msg) -> None:
                if not _refused(subject, msg):
                    await respond(msg)

            return await self.nc.subscribe(subject, queue=queue, cb=one)
        slots = asyncio.Semaphore(concurrency)
        running: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            slots.release()

        async def spawn(msg: Msg) -> None:
            if _refused(subject, msg):
                return
            await slots.acquire()
            task = asyncio.create_task(respond(msg), name=f"serve {subject}")
            running.add(task)
            task.add_done_callback(done)

        return await self.nc.subscribe(subject, queue=queue, cb=spawn)

    async def dead_letter(self, msg: Msg, *, reason: str) -> bool:
        """Copy a message to ``hcs.dlq.<subject>`` with its origin and reason,
        once per stream sequence; whether the DLQ holds it now."""
        return (await self.dead_letters.send([(msg, reason)]))[0]

    async def drain(self) -> None:
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()


def _expired(subject: str, msg: Msg, deadline: float) -> None:
    """A request dropped because its asker no longer waits: counted, and
    logged at debug (an overloaded replica drops them by the hundred)."""
    EXPIRED.add(1, {"subject": subject})
    _log.debug(
        "request_expired",
        subject=subject,
        late_s=round(time.monotonic() - deadline, 3),
        sender=(msg.headers or {}).get(SENDER, "")[:128],
    )


def _refused(subject: str, msg: Msg) -> bool:
    """Whether a request on ``subject`` must go unanswered (its reply subject
    is not an inbox); if so it is counted and logged once, with who it says
    it is from."""
    reply = msg.reply or ""
    if subjects.is_inbox(reply):
        return False
    reason = "not_inbox" if reply else "no_reply"
    REPLIES_REFUSED.add(1, {"subject": subject, "reason": reason})
    sender = (msg.headers or {}).get(SENDER, "")
    _log.warning(
        "reply_refused",
        subject=subject,
        reply=reply[:256],
        sender=sender[:128],
        reason=reason,
    )
    return True


def _url(nc: Client) -> str:
    url = nc.connected_url
    return redact_url(url.geturl()) if url is not None else ""


# The consumers live in their own module; parts import them from here.
from hcs_bus.consuming import Consumer, Delivery, Follower  # noqa: E402

__all__ = ["Bus", "Consumer", "Delivery", "Follower", "connect"]
