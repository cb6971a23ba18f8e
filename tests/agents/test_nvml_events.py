"""The NVML event watcher over pynvml's real module with its library calls
replaced: every replacement checks its arguments against the real function's
signature, so a call the real library would refuse fails here too (the watcher
once called nvmlDeviceRegisterEvents without its event set, and died on every
real GPU)."""

from __future__ import annotations

import asyncio
import inspect
import queue
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from agents import nvml
from hcs_bus.messages import HealthEvent
from hcs_bus.vocabulary import Kind

EVENT_SET = object()
XID = pynvml.nvmlEventTypeXidCriticalError
SBE = pynvml.nvmlEventTypeSingleBitEccError
DBE = pynvml.nvmlEventTypeDoubleBitEccError


class FakeNvml:
    """Two devices; events to deliver go on ``pending``."""

    def __init__(self, *, supported: tuple[int, int] = (XID | SBE | DBE, XID)) -> None:
        self.supported = supported
        self.refuse: set[int] = set()
        self.registered: list[tuple[str, int, object]] = []
        self.pending: queue.Queue[SimpleNamespace] = queue.Queue()
        self.freed: list[object] = []
        self.create_error: Exception | None = None

    def calls(self) -> dict[str, Callable[..., Any]]:
        def create() -> object:
            if self.create_error is not None:
                raise self.create_error
            return EVENT_SET

        def register(handle: str, types: int, event_set: object) -> None:
            if int(handle[-1]) in self.refuse:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self.registered.append((handle, types, event_set))

        def wait(event_set: object, timeout_ms: int) -> SimpleNamespace:
            assert event_set is EVENT_SET
            try:
                return self.pending.get(timeout=timeout_ms / 1000 / 50)
            except queue.Empty:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

        return {
            "nvmlInit": lambda: None,
            "nvmlEventSetCreate": create,
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda index: f"handle-{index}",
            "nvmlDeviceGetSupportedEventTypes": lambda handle: self.supported[int(handle[-1])],
            "nvmlDeviceRegisterEvents": register,
            "nvmlEventSetWait": wait,
            "nvmlEventSetFree": self.freed.append,
            "nvmlDeviceGetUUID": lambda handle: f"GPU-{handle[-1]}".encode(),
            "nvmlDeviceGetIndex": lambda handle: int(handle[-1]),
        }


def checked(name: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(getattr(pynvml, name))

    def call(*args: Any, **kwargs: Any) -> Any:
        signature.bind(*args, **kwargs)  # TypeError where the real function would raise one
        return impl(*args, **kwargs)

    return call


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml_fake = FakeNvml()
    for name, impl in nvml_fake.calls().items():
        monkeypatch.setattr(pynvml, name, checked(name, impl))
    return nvml_fake


async def watching(events: list[HealthEvent]) -> nvml.EventWatcher:
    watcher = nvml.EventWatcher(node="n1", publish=events.append, wall=lambda: 1000.0)
    watcher.start(asyncio.get_running_loop())
    assert await asyncio.to_thread(watcher.ready.wait, 10.0)
    return watcher


@pytest.fixture
def stopped() -> Iterator[list[nvml.EventWatcher]]:
    watchers: list[nvml.EventWatcher] = []
    yield watchers
    for watcher in watchers:
        watcher.stop()


async def until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not in 5 s")


async def test_every_device_is_registered_on_the_event_set_and_an_xid_arrives_as_an_event(
    fake: FakeNvml, stopped: list[nvml.EventWatcher]
) -> None:
    events: list[HealthEvent] = []
    watcher = await watching(events)
    stopped.append(watcher)
    assert (watcher.failure, watcher.registered, watcher.alive()) == (None, [0, 1], True)
    assert fake.registered == [
        ("handle-0", XID | SBE | DBE, EVENT_SET),
        ("handle-1", XID, EVENT_SET),
    ]
    fake.pending.put(SimpleNamespace(device="handle-1", eventType=XID, eventData=79))
    await until(lambda: bool(events))
    (event,) = events
    assert (event.kind, event.code, event.device, event.device_uuid) == (Kind.XID, 79, 1, "GPU-1")
    assert event.severity == "fatal" and event.node == "n1"
    watcher.stop()
    assert not watcher.alive() and fake.freed == [EVENT_SET]


async def test_a_device_that_refuses_events_is_skipped_and_the_others_are_watched(
    fake: FakeNvml, stopped: list[nvml.EventWatcher]
) -> None:
    fake.refuse = {0}
    fake.supported = (XID, 0)  # device 1 supports none of the wanted events
    watcher = await watching([])
    stopped.append(watcher)
    assert (watcher.failure, watcher.registered, watcher.alive()) == (None, [], True)


async def test_a_watcher_that_cannot_start_says_why_instead_of_vanishing(
    fake: FakeNvml, stopped: list[nvml.EventWatcher]
) -> None:
    fake.create_error = pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    watcher = await watching([])
    stopped.append(watcher)
    assert watcher.failure is not None and "NVMLError_Unknown" in watcher.failure
    assert not watcher.alive() and watcher.registered == []
