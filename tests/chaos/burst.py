"""A burst against a three-server cluster: two scheduler replicas (the real
``scheduler.replica`` with its Booker and Pledger) plan and bind pods, and
release some, while a publisher sends numbered health events; faults are
done to the servers meanwhile. ``Burst.check`` then reads the ledger and the
alert feed back from the cluster and says what was lost or double-booked."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import random
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hcs_bus import messages, streams, subjects, tasks
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import HealthEvent, NodeReservations, PlanRequest, Policy, Requests
from hcs_bus.settings import BusSettings, Settings, replace
from scheduler.plan.pods import PlanAnnotation
from scheduler.replica import Scheduler, run
from tests.scheduler.helpers import A100_WHOLE, DB, node_fp, pod_info, publish_fleet, until

NODES = [f"gpu-{i}" for i in range(6)]
WHOLE = PlanAnnotation(**A100_WHOLE)
SLICE = PlanAnnotation(
    vendor="nvidia",
    model="A100-80G",
    devices=1,
    vram_mib_per_device=8192,
    whole_device=False,
    acu_per_device=5.0,
)
VRAM_MIB = 81920
OP_TIMEOUT_S = 15.0
SERVING_WITHIN_S = 10.0


@dataclass
class Burst:
    settings: BusSettings
    buses: list[Bus] = field(default_factory=list)
    replicas: list[Scheduler] = field(default_factory=list)
    acked: dict[str, str] = field(default_factory=dict)  # pod → node, bind answered ""
    released: set[str] = field(default_factory=set)
    successes: list[float] = field(default_factory=list)  # loop times of answered binds
    health_acked: list[int] = field(default_factory=list)
    failures: int = 0
    # the latest failed operations: (loop time, what was raised), for a failure's message
    errors: collections.deque[tuple[float, str]] = field(
        default_factory=functools.partial(collections.deque, maxlen=2000)
    )
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _next: int = 0

    async def start(self, bus: Bus, *, workers: int = 4) -> None:
        await publish_fleet(bus, *(node_fp(n) for n in NODES))
        settings = Settings(bus=self.settings)
        settings = replace(settings, scheduler={"extender_port": 0, "console_port": 0})
        for i in range(2):
            replica_bus = await connect(self.settings, name=f"replica-{i}")
            self.buses.append(replica_bus)
            replica = await run(replica_bus, None, settings, profiles=DB, http=False)
            self.replicas.append(replica)
            await replica.view.wait_ready(timeout_s=15)
            await until(lambda r=replica: len(r.view.state.nodes) == len(NODES), timeout_s=15)
        health_bus = await connect(self.settings, name="health-publisher")
        self.buses.append(health_bus)
        self._tasks = [
            tasks.start(self._work(w), name=f"chaos:worker-{w}") for w in range(workers)
        ] + [tasks.start(self._health(health_bus), name="chaos:health")]

    async def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        await tasks.stop(*self._tasks)
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                await replica.stop()
        for bus in self.buses:
            with contextlib.suppress(Exception):
                await bus.nc.close()

    # -- the load -----------------------------------------------------------
    async def _work(self, worker: int) -> None:
        rng = random.Random(worker)
        replica = self.replicas[worker % len(self.replicas)]
        loop = asyncio.get_running_loop()
        mine: list[str] = []
        # pods to let go, (name, node): the oldest of this worker's once it
        # holds more than 20, and those whose bind answer was lost in a fault
        # (held or not: kube-scheduler would retry them elsewhere, the
        # release loop free them); a release that fails is tried again,
        # else the fleet fills with reservations nobody frees
        leaving: list[tuple[str, str]] = []
        while not self._stop.is_set():
            self._next += 1
            name = f"p{self._next}"
            whole = self._next % 8 == 0
            node = rng.choice(NODES)
            answered = await self._attempt(
                functools.partial(self._plan_and_bind, replica, name, whole, node)
            )
            if answered == "":
                self.acked[name] = node
                self.successes.append(loop.time())
                mine.append(name)
            elif isinstance(answered, str):  # refused: the reason kube-scheduler would get
                self.errors.append((loop.time(), f"bind refused: {answered[:160]}"))
            else:
                leaving.append((name, node))
            if len(mine) > 20:
                old = mine.pop(0)
                leaving.append((old, self.acked[old]))
            leaving = await self._let_go(replica, leaving)

    async def _let_go(
        self, replica: Scheduler, leaving: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """Release each pod of ``leaving``; those whose release failed, to try again."""
        again = []
        for name, node in leaving:
            # asked to go: held or not afterwards, no longer a reservation the
            # ledger must keep
            self.released.add(name)
            ref = pod_info(name).ref
            done = await self._attempt(
                functools.partial(replica.booker.release, ref, reason="done", node=node)
            )
            if isinstance(done, Exception):
                again.append((name, node))
        return again

    async def _plan_and_bind(self, replica: Scheduler, name: str, whole: bool, node: str) -> str:
        request = PlanRequest(
            namespace="ml",
            requests=Requests(devices=1) if whole else Requests(vram_mib=8192),
            policy=Policy(),
            pod_name=name,
            admission_uid=f"admission-{name}",
        )
        plan = await replica.planner.place(request)
        demand = WHOLE if whole else SLICE
        pod = pod_info(name, annotation=demand, pledge=plan.pledge if plan.ok else "")
        return await replica.booker.bind(pod, demand, node=node)

    async def _attempt(self, op: Any) -> Any:
        """One operation within OP_TIMEOUT_S; a failure (the bus away) is an answer too."""
        try:
            async with asyncio.timeout(OP_TIMEOUT_S):
                return await op()
        except Exception as exc:
            self.failures += 1
            loop = asyncio.get_running_loop()
            self.errors.append((loop.time(), f"{type(exc).__name__}: {str(exc)[:160]}"))
            await asyncio.sleep(0.1)
            return exc

    async def _health(self, bus: Bus) -> None:
        """Numbered events, one after the other, each retried with its id until acked."""
        code = 0
        while not self._stop.is_set():
            event = HealthEvent(
                node="gpu-0", kind="chaos", severity="info", source="probe", time_s=1.0, code=code
            )
            try:
                await bus.publish(subjects.health("gpu-0"), event, msg_id=f"chaos-{code}")
            except Exception:
                await asyncio.sleep(0.1)
                continue  # the same id again: stored once however often it is sent
            self.health_acked.append(code)
            code += 1
            await asyncio.sleep(0.01)

    # -- what the cluster holds ----------------------------------------------
    async def serving_after(self, since: float, *, timeout_s: float = SERVING_WITHIN_S) -> float:
        """Seconds from ``since`` (loop time) to the first bind answered after it."""
        try:
            async with asyncio.timeout(timeout_s + 5.0):
                while not any(t > since for t in self.successes):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(self.why_not_serving(since, waited_s=timeout_s + 5.0)) from None
        return min(t for t in self.successes if t > since) - since

    def why_not_serving(self, since: float, *, waited_s: float) -> str:
        """What the replicas answered since ``since`` instead of a bind, each
        kind of failure counted, and where each connection and quorum watch
        stands: enough to tell a slow election from a stuck client."""
        seen = collections.Counter(why for t, why in self.errors if t > since)
        last = max(self.successes, default=since) - since
        lines = [f"no bind answered within {waited_s:g} s of {since:.2f}"]
        lines.append(f"last answered bind {last:+.2f} s from then")
        lines += [f"  {n} x {why}" for why, n in seen.most_common(8)]
        for bus in self.buses:
            url = bus.nc.connected_url
            where = f"{url.hostname}:{url.port}" if url is not None else "nowhere"
            state = "connected" if bus.nc.is_connected else "reconnecting"
            lines.append(f"  connection {bus.nc.options.get('name')}: {state} to {where}")
        lines += [
            f"  replica-{i}: ledger quorum {'lost' if r.booker.quorum.lost else 'held'}"
            for i, r in enumerate(self.replicas)
            if r.booker.quorum is not None
        ]
        lines += [f"  {t.get_name()} waits in {_awaiting(t)}" for t in self._tasks if not t.done()]
        return "\n".join(lines)

    async def wait_binds(self, count: int, *, timeout_s: float = 30.0) -> None:
        """Until ``count`` more binds were answered."""
        start = len(self.successes)
        async with asyncio.timeout(timeout_s):
            while len(self.successes) < start + count:
                await asyncio.sleep(0.05)

    async def wait_health(self, count: int, *, timeout_s: float = 30.0) -> None:
        """Until ``count`` health events in all were acknowledged."""
        async with asyncio.timeout(timeout_s):
            while len(self.health_acked) < count:
                await asyncio.sleep(0.05)

    async def check(self, bus: Bus) -> list[str]:
        """Every problem found: a device double-booked or over its memory, an
        acknowledged reservation missing, a health event missing or twice."""
        problems: list[str] = []
        kv = await bus.js.key_value(streams.KV_ALLOC)
        decode = messages.decoder_for(NodeReservations).decode
        held: dict[str, str] = {}
        for node in NODES:
            entry = await _get(kv, subjects.alloc_key(node))
            doc = decode(entry) if entry else NodeReservations(node=node)
            problems += _double_booked(doc)
            for r in doc.reservations:
                held[r.pod.name] = node
        for pod, node in self.acked.items():
            if pod not in self.released and held.get(pod) != node:
                problems.append(f"acknowledged reservation of {pod} on {node} lost")
        codes = await _health_codes(bus)
        if len(codes) != len(set(codes)):
            problems.append("a health event stored twice")
        sent = self.health_acked
        if sent and not set(range(sent[-1] + 1)) <= set(codes):
            missing = sorted(set(range(sent[-1] + 1)) - set(codes))
            problems.append(f"health events lost: {missing[:20]}")
        if codes and sorted(set(codes)) != list(range(max(codes) + 1)):
            problems.append("health event ids have a gap")
        return problems


async def _get(kv: Any, key: str) -> bytes | None:
    from nats.js.errors import KeyNotFoundError

    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value or None


def _double_booked(doc: NodeReservations) -> list[str]:
    mib: dict[int, int] = {}
    whole: dict[int, int] = {}
    sliced: set[int] = set()
    for r in doc.reservations:
        for s in r.devices:
            mib[s.index] = mib.get(s.index, 0) + s.vram_mib
            if s.whole:
                whole[s.index] = whole.get(s.index, 0) + 1
            else:
                sliced.add(s.index)
    out = [f"{doc.node} device {i} booked whole {n} times" for i, n in whole.items() if n > 1]
    out += [f"{doc.node} device {i} whole and sliced" for i in set(whole) & sliced]
    out += [f"{doc.node} device {i} over its memory" for i, m in mib.items() if m > VRAM_MIB]
    return out


async def _health_codes(bus: Bus) -> list[int]:
    """The code of every chaos event HCS_HEALTH holds, in stream order."""
    codes: list[int] = []
    done = asyncio.Event()
    async with asyncio.timeout(30):  # a server just back may still be catching up
        while True:
            try:
                info = await bus.js.stream_info(
                    streams.HEALTH,
                )
                break
            except Exception:  # no leader to answer yet; the API times out
                await asyncio.sleep(0.2)
    last = info.state.last_seq

    async def on_msg(msg: Any) -> None:
        with contextlib.suppress(msgspec.MsgspecError):
            event = msgspec.json.decode(msg.data, type=HealthEvent)
            if event.kind == "chaos" and event.code is not None:
                codes.append(event.code)
        if msg.metadata.sequence.stream >= last:
            done.set()

    sub = await bus.js.subscribe(
        subjects.HEALTH_ALL, stream=streams.HEALTH, cb=on_msg, ordered_consumer=True
    )
    try:
        if last:
            async with asyncio.timeout(20):
                await done.wait()
    finally:
        await sub.unsubscribe()
    return codes


def _awaiting(task: asyncio.Task[Any]) -> str:
    """Where a task is suspended: the chain of coroutines it awaits, innermost last."""
    frames: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        frames.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return " > ".join(frames[-8:]) or "nothing (a future)"
