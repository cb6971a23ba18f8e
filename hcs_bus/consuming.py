"""Consumers that survive any bytes (re-exported by ``hcs_bus.bus``).

* ``Consumer`` — a durable or ephemeral pull consumer fetching batches.
* ``Follower`` — an ordered push consumer that replays, then follows.

Both hand on decoded messages only. Anything else — bytes that do not
decode (msgspec's errors, but also ``RecursionError`` and, before msgspec
0.23, ``UnicodeDecodeError`` from hostile input), a message over ``max_bytes`` — is
poison: copied to ``hcs.dlq.<subject>`` once per stream sequence
(``hcs_bus.deadletters``), and the consumer goes on. So is a message whose
body contradicts its subject (``hcs_bus.identity``: a fingerprint naming
another node, a verdict not on the healer's subject), and one claiming a
time it cannot have (``hcs_bus.clocks``: a boot after the server received
it, beyond ``clock_skew_tolerance_s``). Poison never holds back
``caught_up``: it counts as read. Each delivery carries the server's receive
time (``received_s``), the clock staleness is judged on.

For a ``Consumer`` the error type decides the ack: ``TemporaryError`` →
``nak(delay)``; ``PermanentError`` → dead letter + ``term``; on a message's
last delivery (``max_deliver``) a failing batch is retried one message at a
time, so only the culprit is buried. ``max_deliver=-1`` retries a temporary
failure without limit; with ``backoff_max_s`` each redelivery waits twice as
long as the one before (from the error's ``delay_s``), up to that cap. A
durable consumer found with another ``max_deliver`` is updated to this one. Any other exception kills the loop
after its batch is settled; ``hcs_bus.tasks.supervised`` starts it again
(``hcs_task_restarts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import nats
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from hcs_bus import clocks, identity, messages, tasks
from hcs_bus.deadletters import MAX_MESSAGE_BYTES, decode_or_reason, origin
from hcs_bus.errors import PermanentError, TemporaryError
from hcs_bus.telemetry import TRACEPARENT, consuming, logger

if TYPE_CHECKING:
    from hcs_bus.bus import Bus

T = TypeVar("T")

_log = logger("hcs.bus")


@dataclass(frozen=True, slots=True)
class Delivery(Generic[T]):
    subject: str
    value: T
    stream_seq: int
    pending: int
    headers: dict[str, str] | None
    received_s: float = 0.0  # when the server stored it (its clock, Unix s); 0: not known


def _refusal(subject: str, value: object, received_s: float, tolerance_s: float) -> str:
    """Why a decoded message must not be handed on: its body contradicts its
    subject, or it claims a time it cannot have; "" when neither."""
    return identity.refusal(subject, value) or clocks.future_claim(
        value, received_s=received_s, tolerance_s=tolerance_s
    )


def _raise_if_cancelling() -> None:
    """nats-py's fetch can swallow a cancellation; honour one still pending."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Consumer(Generic[T]):
    """A pull consumer over one stream that decodes and hands batches on.

    ``handle`` receives a list of decoded deliveries (in stream order).
    ``durable=None`` makes an ephemeral consumer (each scheduler replica
    replays the whole view for itself). ``restarts`` counts the loop's
    restarts after a crash.
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
        max_bytes: int = MAX_MESSAGE_BYTES,
        clock_skew_tolerance_s: float = clocks.DEFAULT_CLOCK_SKEW_TOLERANCE_S,
        retry_delay_s: float = 1.0,
        restart_backoff_s: float = 0.5,
        backoff_max_s: float | None = None,
    ) -> None:
        self.bus = bus
        self.backoff_max_s = backoff_max_s
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
        self.max_bytes = max_bytes
        self.clock_skew_tolerance_s = clock_skew_tolerance_s
        self.retry_delay_s = retry_delay_s
        self.restart_backoff_s = restart_backoff_s
        self.caught_up = asyncio.Event()
        self.delivered = 0
        self.dead = 0
        self.restarts = 0
        self._decode = messages.decoder_for(kind).decode
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def name(self) -> str:
        return f"consumer:{self.stream}:{self.durable or 'ephemeral'}"

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
        if self.durable:
            await self._update_durable(config)
        self._sub = await self.bus.js.pull_subscribe(
            self.filter_subject or "", durable=self.durable, stream=self.stream, config=config
        )
        info = await self._sub.consumer_info()
        if info.num_pending == 0:
            self.caught_up.set()

    async def _update_durable(self, config: ConsumerConfig) -> None:
        """A durable made with another ``max_deliver`` (an older release) takes ours."""
        assert self.durable is not None
        try:
            info = await self.bus.js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            return
        if info.config.max_deliver != self.max_deliver:
            wanted = dataclasses.replace(info.config, max_deliver=self.max_deliver)
            await self.bus.js.add_consumer(self.stream, wanted)
            _log.info("consumer_updated", consumer=self.name, max_deliver=self.max_deliver)

    async def run(self) -> None:
        """Fetch → decode → handle → ack until cancelled, restarted after a crash.
        On the way out the subscription is removed, so a drain does not wait on it."""
        try:
            await tasks.supervised(
                self._loop,
                name=self.name,
                backoff_s=self.restart_backoff_s,
                on_restart=self._restarted,
            )
        finally:
            sub, self._sub = self._sub, None
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    def _restarted(self) -> None:
        self.restarts += 1

    async def _loop(self) -> None:
        """The watchdog: whatever a fetch or a (re)subscription raises, the loop
        waits a moment, subscribes again and carries on (docs/architecture.md#bus-rules)."""
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
                _log.warning("consumer_resubscribing", consumer=self.name, error=repr(exc))
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
        poison: list[tuple[Msg, str]] = []
        kind = self.kind.__name__
        for msg in batch:
            value, why = decode_or_reason(
                self._decode, msg.data, kind=kind, max_bytes=self.max_bytes
            )
            where = origin(msg)
            received_s = where.time_ns / 1e9
            why = why or _refusal(msg.subject, value, received_s, self.clock_skew_tolerance_s)
            if why:
                poison.append((msg, why))
                continue
            good.append(
                Delivery(
                    msg.subject, cast(T, value), where.seq, where.pending, msg.headers, received_s
                )
            )
            good_msgs.append(msg)
        self.delivered += len(batch)
        caught_up = origin(batch[-1]).pending == 0
        if poison:
            self.dead += len(poison)
            await self._bury(poison)
        if good:
            await self._hand_on(good, good_msgs)
        if caught_up:
            self.caught_up.set()

    async def _bury(self, letters: list[tuple[Msg, str]]) -> None:
        """Dead-letter, then terminate; a copy that failed is tried again on
        redelivery unless this was the last one."""
        stored = await self.bus.dead_letters.send(letters)
        for (msg, _why), ok in zip(letters, stored, strict=True):
            if ok or self._last_delivery(msg):
                await msg.term()
            else:
                await msg.nak(delay=self.retry_delay_s)

    async def _hand_on(self, good: list[Delivery[T]], msgs: list[Msg]) -> None:
        try:
            with consuming((item.subject, item.headers) for item in good):
                await self.handle(good)
        except TemporaryError as exc:
            _log.warning("batch_retry", consumer=self.name, error=str(exc), delay_s=exc.delay_s)
            await self._retry(good, msgs, reason=str(exc), delay_s=exc.delay_s)
            return
        except PermanentError as exc:
            await self._bury([(msg, f"refused: {exc}") for msg in msgs])
            return
        except asyncio.CancelledError:  # stopped mid-batch: hand it on now, not after ack_wait
            with contextlib.suppress(Exception):
                for msg in msgs:
                    await msg.nak()
            raise
        except Exception as exc:  # a crash: settle the batch, then let the supervisor restart
            await self._retry(good, msgs, reason=repr(exc), delay_s=self.retry_delay_s)
            raise
        await self._ack(msgs)

    async def _ack(self, msgs: list[Msg]) -> None:
        if self.ack_all:
            await msgs[-1].ack()
        else:
            for msg in msgs:
                await msg.ack()

    async def _retry(
        self, good: list[Delivery[T]], msgs: list[Msg], *, reason: str, delay_s: float
    ) -> None:
        """Nak for redelivery; messages on their last delivery (the server
        would drop them silently) get one more try each, alone."""
        last: list[tuple[Delivery[T], Msg]] = []
        for item, msg in zip(good, msgs, strict=True):
            if self._last_delivery(msg):
                last.append((item, msg))
            else:
                await msg.nak(delay=self._backoff(msg, delay_s))
        for item, msg in last:
            await self._last_try(item, msg, reason=reason)

    def _backoff(self, msg: Msg, delay_s: float) -> float:
        """The wait before the next delivery: ``delay_s``, or with ``backoff_max_s``
        doubled for each delivery so far, up to that cap."""
        if self.backoff_max_s is None:
            return delay_s
        tries = min(max(origin(msg).delivered, 1), 32)
        return float(min(delay_s * 2 ** (tries - 1), self.backoff_max_s))

    def _last_delivery(self, msg: Msg) -> bool:
        """Whether the server will not deliver ``msg`` again (max_deliver ≤ 0: unlimited)."""
        return 0 < self.max_deliver <= origin(msg).delivered

    async def _last_try(self, item: Delivery[T], msg: Msg, *, reason: str) -> None:
        try:
            await self.handle([item])
        except Exception as exc:  # still failing alone: this one is the poison
            why = f"failed {self.max_deliver} deliveries: {reason}; alone: {exc!r}"
            await self._bury([(msg, why)])
            return
        await msg.ack()


class Follower(Generic[T]):
    """Replays, then follows, a stream with an ordered push consumer.

    For derived state that every replica rebuilds for itself (the scheduler's
    cluster view, ``hcs top``): no acks, flow-controlled, recreated by the
    client on a sequence gap, and several times faster than pull fetches
    (docs/architecture.md#bus-rules: ~100k messages replayed in about a second). ``handle`` is a
    plain function called once per decoded message, in stream order; one
    that raises is counted in ``failed`` and the follower goes on. Poison is
    dead-lettered in the background, so a replay of garbage never waits on
    the DLQ. ``caught_up`` is set once everything the stream held at start
    has been read, poison included.
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
        max_bytes: int = MAX_MESSAGE_BYTES,
        clock_skew_tolerance_s: float = clocks.DEFAULT_CLOCK_SKEW_TOLERANCE_S,
    ) -> None:
        self.bus = bus
        self.stream = stream
        self.subject = subject
        self.kind = kind
        self.handle = handle
        self.deliver = deliver
        self.opt_start_time = opt_start_time
        self.max_bytes = max_bytes
        self.clock_skew_tolerance_s = clock_skew_tolerance_s
        self.caught_up = asyncio.Event()
        self.delivered = 0
        self.dead = 0
        self.failed = 0
        self._decode = messages.decoder_for(kind).decode
        self._sub: JetStreamContext.PushSubscription | None = None
        self._letters: list[tuple[Msg, str]] = []
        self._burying: asyncio.Task[Any] | None = None

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
        # nats-py re-creates a lost ordered consumer (a server restarted: no
        # heartbeats) on this same config, switched to a start sequence; a
        # start time left in it makes the server refuse every re-creation.
        config.opt_start_time = None
        info = await self._sub.consumer_info()
        delivered = info.delivered.consumer_seq if info.delivered else 0
        if info.num_pending == 0 and self.delivered >= (delivered or 0):
            self.caught_up.set()

    async def stop(self, *, timeout_s: float = 5.0) -> None:
        """Unsubscribe, then give the dead letters still queued ``timeout_s``."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        if self._burying is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._burying), timeout_s)
            await tasks.stop(self._burying)
            self._burying = None

    async def dead_lettered(self) -> None:
        """Wait until every poison message read so far has been copied (or failed)."""
        while self._burying is not None and not self._burying.done():
            await asyncio.shield(self._burying)

    async def _on_msg(self, msg: Msg) -> None:
        self.delivered += 1
        where = origin(msg)
        value, why = decode_or_reason(
            self._decode, msg.data, kind=self.kind.__name__, max_bytes=self.max_bytes
        )
        received_s = where.time_ns / 1e9
        why = why or _refusal(msg.subject, value, received_s, self.clock_skew_tolerance_s)
        if why:
            self._bury(msg, why)
        else:
            try:
                item = Delivery(
                    msg.subject, cast(T, value), where.seq, where.pending, msg.headers, received_s
                )
                if msg.headers and TRACEPARENT in msg.headers:
                    with consuming(((msg.subject, msg.headers),)):
                        self.handle(item)
                else:  # untraced (fingerprints, a replay): no span, no cost
                    self.handle(item)
            except Exception as exc:  # one bad message must not stop the view
                self.failed += 1
                _log.error("handler_failed", subject=msg.subject, seq=where.seq, error=repr(exc))
        if where.pending == 0:
            self.caught_up.set()

    def _bury(self, msg: Msg, why: str) -> None:
        self.dead += 1
        self._letters.append((msg, why))
        if self._burying is None or self._burying.done():
            self._burying = tasks.start(self._flush(), name=f"follower:{self.stream}:dlq")

    async def _flush(self, *, chunk: int = 1000) -> None:
        while self._letters:
            letters, self._letters = self._letters, []
            for start in range(0, len(letters), chunk):
                await self.bus.dead_letters.send(letters[start : start + chunk])
