"""Dead letters: poison copied to ``hcs.dlq.<subject>`` once per stream sequence.

A message no consumer can use (undecodable, hostile, too large, refused by
its handler) is copied into stream ``HCS_DLQ`` with its origin and the
reason, then the consumer goes on (docs/architecture.md#streams, #bus-rules). Replays must not copy
it again: a restarted replica or an ordered consumer re-reading the stream
sees the same poison. So every copy carries ``Nats-Msg-Id:
<stream>:<sequence>`` and the DLQ stream's duplicate window spans its whole
retention (``hcs_bus.streams``): the server stores a letter once, a replay's
copy is acknowledged as a duplicate and neither counted nor logged again.

Copies are published concurrently and awaited together (one round trip per
batch, not per letter), each bounded by ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck

from hcs_bus import subjects
from hcs_bus.telemetry import logger, meter, zero_init

T = TypeVar("T")

MSG_ID = "Nats-Msg-Id"
MAX_MESSAGE_BYTES = 512 * 1024  # a consumer buries anything larger unread
_HEADER_ROOM = 4096  # what the letter's own headers may take of max_payload
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")

_log = logger("hcs.bus.dlq")
DEAD_LETTERS = zero_init(
    meter("hcs.bus").create_counter("hcs_bus_dead_letters", description="messages sent to DLQ"),
    *({"subject_family": f} for f in ("hcs.fp", "hcs.health", "hcs.alloc", "hcs.place")),
)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a JetStream delivery came from, read off its ack subject.

    ``time_ns``: when the server stored the message (its own clock, Unix
    nanoseconds; what nats-py's ``msg.metadata.timestamp`` reads), 0 when
    not known."""

    stream: str
    seq: int
    delivered: int
    pending: int
    time_ns: int = 0


def origin(msg: Msg) -> Origin:
    """The delivery's stream, sequence, delivery count, pending count and
    the server's receive time.

    Read straight from the ack subject — nats-py's ``msg.metadata`` builds
    several objects per message (~7% of a replay). A message with no ack
    subject (core NATS) has sequence 0."""
    tokens = (msg.reply or "").split(".")
    try:
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<dlv>.<sseq>.<cseq>.<ts>.<pending>
            return Origin(tokens[2], int(tokens[5]), int(tokens[4]), int(tokens[8]), int(tokens[7]))
        if len(tokens) >= 11:  # with <domain>.<account hash> after ACK
            return Origin(
                tokens[4], int(tokens[7]), int(tokens[6]), int(tokens[10]), int(tokens[9])
            )
    except ValueError:
        pass
    return Origin("", 0, 1, 0)


def decode_or_reason(
    decode: Callable[[bytes], T], data: bytes, *, kind: str, max_bytes: int
) -> tuple[T | None, str]:
    """``(value, "")``, or ``(None, why)`` for a message no handler should see.

    msgspec raises more than ``MsgspecError`` on hostile input (deep
    nesting: ``RecursionError``; before 0.23, invalid UTF-8 in a string:
    ``UnicodeDecodeError``), so every exception is poison here."""
    if len(data) > max_bytes:
        return None, f"{kind} too large: {len(data)} bytes > {max_bytes}"
    try:
        return decode(data), ""
    except Exception as exc:  # anything the bytes make the decoder raise
        return None, f"undecodable {kind}: {type(exc).__name__}: {exc}"


class DeadLetters:
    """Copies poison to the DLQ stream, once per (stream, sequence)."""

    def __init__(self, nc: Client, js: JetStreamContext, *, timeout_s: float = 5.0) -> None:
        self.nc = nc
        self.js = js
        self.timeout_s = timeout_s

    async def send(self, letters: Sequence[tuple[Msg, str]]) -> list[bool]:
        """Copy each ``(message, reason)``; per letter, whether the DLQ holds it
        now (stored by this call or by an earlier one)."""
        sent: list[asyncio.Future[PubAck] | BaseException] = []
        for msg, reason in letters:
            try:
                sent.append(await self._publish(msg, reason))
            except Exception as exc:  # the DLQ must never stall the consumer
                sent.append(exc)
        futures = [f for f in sent if isinstance(f, asyncio.Future)]
        if futures:
            _done, late = await asyncio.wait(futures, timeout=self.timeout_s)
            for future in late:
                future.cancel()
        results = [_outcome(f) for f in sent]
        for (msg, reason), result in zip(letters, results, strict=True):
            if isinstance(result, PubAck) and not result.duplicate:
                self._record(msg, reason)
        failures = [r for r in results if not isinstance(r, PubAck)]
        if failures:
            _log.error("dead_letter_failed", count=len(failures), error=repr(failures[0]))
        return [isinstance(r, PubAck) for r in results]

    async def _publish(self, msg: Msg, reason: str) -> asyncio.Future[PubAck]:
        where = origin(msg)
        headers = {
            "Hcs-Origin-Subject": msg.subject,
            "Hcs-Origin-Stream": where.stream,
            "Hcs-Origin-Seq": str(where.seq),
            "Hcs-Reason": header_value(reason),
        }
        if where.seq:
            headers[MSG_ID] = f"{where.stream}:{where.seq}"
        data = msg.data
        room = max(self.nc.max_payload - _HEADER_ROOM, 0)
        if len(data) > room:  # the copy must fit where the original did
            headers["Hcs-Truncated-From"] = str(len(data))
            data = data[:room]
        return await self.js.publish_async(subjects.dlq(msg.subject), data, headers=headers)

    @staticmethod
    def _record(msg: Msg, reason: str) -> None:
        where = origin(msg)
        DEAD_LETTERS.add(1, {"subject_family": family(msg.subject)})
        _log.warning(
            "dead_letter", subject=msg.subject, stream=where.stream, seq=where.seq, reason=reason
        )


def _outcome(sent: asyncio.Future[PubAck] | BaseException) -> PubAck | BaseException:
    """The ack, or why there is none (timed out, no DLQ stream, refused)."""
    if isinstance(sent, BaseException):
        return sent
    if sent.cancelled():
        return TimeoutError("no ack from the DLQ stream")
    return sent.exception() or sent.result()


def header_value(text: str, *, limit: int = 500) -> str:
    """Text safe for a NATS header value: printable ASCII, one line, bounded."""
    return _UNPRINTABLE.sub("?", text[:limit])


def family(subject: str) -> str:
    return ".".join(subject.split(".")[:2])
