"""Does a replicated stream have a leader? ``LeaderWatch`` asks the cluster
every ``interval_s`` (``$JS.API.STREAM.INFO.<stream>``, answered by the
stream's leader) and says the quorum is lost after ``lost_after`` answers in a
row that name no leader or do not come within ``timeout_s``: two of three
servers gone, or an election under way. While lost, whoever depends on the
stream refuses with ``reason`` instead of waiting on writes that cannot
commit; the first answer naming a leader ends it.

An answer that did not come in time while this process itself was stalled
proves nothing about the cluster: a replica short of CPU (a burst, a host
stopping it for its cgroup's quota) reads the answer late, after its own
timer. While a question is out, a heartbeat measures how late the event loop
runs a due callback; when it was late by ``timeout_s`` / 2 or more, the
missing answer is neither a miss nor a leader (``bus_quorum_unsure``, logged
once in a row of them). Without it, a replica held to 4 % of a core under a
burst calls the quorum lost within seconds and refuses every plan and bind
while the bus is healthy.

The loss and its end are each logged once (``bus_quorum_lost``,
``bus_quorum_regained``); the gauge ``hcs_bus_quorum_lost{stream}`` is 1
while lost, and the counter ``hcs_bus_quorum_losses{stream}`` counts the
losses. On a single server (no cluster) the stream always has its leader.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from hcs_bus.bus import Bus
from hcs_bus.telemetry import logger, meter

_log = logger("hcs.bus.quorum")
_watches: weakref.WeakSet[LeaderWatch] = weakref.WeakSet()


class LeaderWatch:
    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        lost_after: int = 2,
    ) -> None:
        self.bus, self.stream = bus, stream
        self.interval_s, self.timeout_s, self.lost_after = interval_s, timeout_s, lost_after
        self.lost = False
        self._misses = 0
        self._since: float | None = None
        self._why = ""
        self._unsure = False  # the last question could not tell (logged once in a row)

    @property
    def reason(self) -> str:
        """The refusal while lost: what a bind or plan answers instead of guessing."""
        return (
            f"hcs: the bus has lost its quorum: stream {self.stream} has no leader "
            f"({self._why}); refused rather than decided on a ledger that cannot be "
            "written; retry once the NATS servers are back"
        )

    @property
    def unsure(self) -> bool:
        """Whether the last question could not tell: no answer came in time
        while this process was itself stalled."""
        return self._unsure

    async def run(self) -> None:
        _watches.add(self)  # gauged while it runs
        try:
            while True:
                await self.check()
                await asyncio.sleep(self.interval_s)
        finally:
            _watches.discard(self)

    async def check(self) -> bool:
        """One question to the cluster; True when the stream has a leader now."""
        why = await self._ask()
        if why is None:  # this process was too late to tell: nothing learnt
            return not self.lost
        self._unsure = False
        if not why:
            self._misses = 0
            if self.lost:
                self._set(lost=False)
            return True
        self._misses += 1
        self._why = why
        if not self.lost and self._misses >= self.lost_after:
            self._set(lost=True)
        return False

    async def _ask(self) -> str | None:
        """ "" when the stream names a leader, else why not; None when no
        answer came in time while this process was stalled."""
        beat = _Heartbeat()
        beating = asyncio.create_task(beat.run(), name=f"quorum heartbeat {self.stream}")
        try:
            async with asyncio.timeout(self.timeout_s):
                info = await self.bus.js.stream_info(self.stream)
        except TimeoutError:
            stalled_s = beat.late()
            if stalled_s >= self.timeout_s / 2:
                if not self._unsure:
                    self._unsure = True
                    _log.info("bus_quorum_unsure", stream=self.stream, stalled_s=stalled_s)
                return None
            return f"no answer within {self.timeout_s:g} s"
        except Exception as exc:  # nats raises several unrelated types: each means no answer
            return f"{type(exc).__name__}: {exc}".rstrip(": ")
        finally:
            beating.cancel()
        if info.cluster is not None and not info.cluster.leader:
            return "the cluster names none"
        return ""

    def _set(self, *, lost: bool) -> None:
        now = asyncio.get_running_loop().time()
        self.lost = lost
        if lost:
            self._since = now
            LOSSES.add(1, {"stream": self.stream})
            _log.error("bus_quorum_lost", stream=self.stream, why=self._why)
        else:
            lasted = now - (self._since or now)
            _log.warning("bus_quorum_regained", stream=self.stream, lost_for_s=round(lasted, 1))


class _Heartbeat:
    """How late the event loop ran a callback that was due, the longest seen
    while ``run`` runs (``late``)."""

    EVERY_S = 0.05

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.longest_s = 0.0
        self.due = self.loop.time() + self.EVERY_S

    async def run(self) -> None:
        while True:  # the first beat is due from when the beat was made
            await asyncio.sleep(max(0.0, self.due - self.loop.time()))
            now = self.loop.time()
            self.longest_s = max(self.longest_s, now - self.due)
            self.due = now + self.EVERY_S

    def late(self) -> float:
        """The longest lateness, the beat still waiting to be run included
        (after a stall the asker's timeout may run before it)."""
        return max(self.longest_s, self.loop.time() - self.due)


def _observe(_options: CallbackOptions) -> Iterable[Observation]:
    lost: dict[str, int] = {}
    for watch in list(_watches):  # one per process and stream, but a test runs several
        lost[watch.stream] = max(lost.get(watch.stream, 0), int(watch.lost))
    for stream, value in lost.items():
        yield Observation(value, {"stream": stream})


_meter = meter("hcs.bus")
LOSSES = _meter.create_counter(
    "hcs_bus_quorum_losses", description="times a replicated stream was found without a leader"
)
_meter.create_observable_gauge(
    "hcs_bus_quorum_lost",
    callbacks=[_observe],
    description="1 while the stream has no leader (the bus lost its quorum), else 0",
)
