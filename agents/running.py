"""The agent's two modes: one real node, or a simulated fleet.

``run_node`` — detectors → change detection → publish; NVML events and kernel
probes feed health events; labels and capacity go to Kubernetes when there is
a cluster. ``run_fleet`` — one process plays a fleet file and, when there is a
cluster, labels each fleet node's Node and writes its capacity (a fleet node
with no Node is skipped and tried again later). Both run until cancelled, then
flush what is queued (bounded) before returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

from agents import measuring, nvml, probing
from agents.backstopping import run_backstop
from agents.changes import health_changes
from agents.detecting import choose, detect_all
from agents.fleet import Fleet
from agents.labeling import Labeler, Target, keep_labelled
from agents.labels import labels_of_devices
from agents.reporting import Publisher, Reporter
from agents.simulating import SimNode, play
from hcs_bus import kube as kube_adapter
from hcs_bus import tasks
from hcs_bus.bus import Bus
from hcs_bus.errors import ConfigError
from hcs_bus.messages import DeviceFingerprint
from hcs_bus.profiles import ProfileDB
from hcs_bus.profiles import load as load_profiles
from hcs_bus.settings import Settings
from hcs_bus.telemetry import logger

_log = logger("hcs.agent")
FLUSH_AT_EXIT_S = 5.0
LABEL_PERIOD_S = 1.0  # fleet mode: how often changed labels and capacity are looked for


async def run_fleet(bus: Bus, fleet: Fleet, *, settings: Settings, tick_s: float = 0.1) -> None:
    publisher = Publisher(bus, capacity=settings.agent.buffer_max_events)
    draining = tasks.start(publisher.run(), name="agent:publisher")
    kube = await kube_adapter.connect(settings.kube)
    nodes: list[SimNode] = []
    playing = tasks.start(
        play(
            fleet,
            publisher=publisher,
            report_interval_s=settings.agent.report_interval_s,
            tick_s=tick_s,
            nodes_out=nodes,
        ),
        name="agent:fleet",
    )
    interval_s = fleet.report_interval_s or settings.agent.report_interval_s
    labelling = tasks.start(
        keep_labelled(
            kube,
            lambda: fleet_targets(nodes),
            period_s=min(LABEL_PERIOD_S, interval_s),
            retry_s=interval_s,  # a Node not registered yet: looked for again at the next report
        ),
        name="agent:labels",
    )
    try:
        await asyncio.gather(draining, playing)
    finally:
        await tasks.stop(playing, labelling)
        await publisher.flush(timeout_s=FLUSH_AT_EXIT_S)
        await tasks.stop(draining)
        if kube is not None:
            await kube.close()


def fleet_targets(nodes: Sequence[SimNode]) -> list[Target]:
    """Each simulated node's labels and the devices of its last fingerprint."""
    return [
        Target(n.spec.name, n.reporter.labels, n.reporter.last.devices)
        for n in nodes
        if n.reporter.last is not None
    ]


def node_name(settings: Settings) -> str:
    name = settings.agent.node_name or os.environ.get("NODE_NAME")
    if not name:
        raise ConfigError("agent.node_name: not set (value None); pass --node or set NODE_NAME")
    return name


async def run_node(bus: Bus, *, settings: Settings, db: ProfileDB | None = None) -> None:
    db = db or load_profiles()
    node = node_name(settings)
    publisher = Publisher(bus, capacity=settings.agent.buffer_max_events)
    reporter = Reporter(publisher, node=node, report_interval_s=settings.agent.report_interval_s)
    draining = tasks.start(publisher.run(), name="agent:publisher")
    kube = await kube_adapter.connect(settings.kube)
    labeler = Labeler(kube, node=node)
    helpers: list[asyncio.Task[Any]] = []
    watcher = _start_nvml_events(node, reporter)
    helpers.append(tasks.start(_forward_probes(node, reporter), name="agent:probes"))
    helpers.append(
        tasks.start(
            run_backstop(node=node, kube=kube, sink=reporter, settings=settings.agent),
            name="agent:vram-backstop",
        )
    )
    try:
        await _poll(node=node, settings=settings, db=db, reporter=reporter, labeler=labeler)
    finally:
        await tasks.stop(*helpers)
        if watcher is not None:
            await asyncio.to_thread(watcher.stop)
        await publisher.flush(timeout_s=FLUSH_AT_EXIT_S)
        await tasks.stop(draining)
        if kube is not None:
            await kube.close()


async def _poll(
    *, node: str, settings: Settings, db: ProfileDB, reporter: Reporter, labeler: Labeler
) -> None:
    detectors = choose(db=db, timeout_s=settings.agent.vendor_tool_timeout_s)
    measurer = measuring.Measurer(
        timeout_s=settings.agent.measure_timeout_s,
        every_s=settings.agent.remeasure_interval_s,
    )
    loop = asyncio.get_running_loop()
    period = min(2.0, settings.agent.report_interval_s)
    previous: Sequence[DeviceFingerprint] | None = None
    while True:
        found = await detect_all(detectors, node=node, now=time.time())
        if settings.agent.measure_acu:
            await measurer.update(found.devices)
        devices = [measurer.apply(d, bench_tflops=measuring.bench_of(db, d)) for d in found.devices]
        for event in [
            *found.events,
            *health_changes(previous, devices, node=node, now=time.time()),
        ]:
            reporter.health(event)
        reporter.offer(devices, now=time.time(), loop_s=loop.time())
        labels = labels_of_devices(devices, base=reporter.labels)
        await labeler.apply(labels, devices, now_s=loop.time())
        previous = devices
        await asyncio.sleep(period)


def _start_nvml_events(node: str, reporter: Reporter) -> nvml.EventWatcher | None:
    if not nvml.available():
        return None
    watcher = nvml.EventWatcher(node=node, publish=reporter.health, wall=time.time)
    watcher.start(asyncio.get_running_loop())
    return watcher


async def _forward_probes(node: str, reporter: Reporter) -> None:
    try:
        from agents.probes import loader
    except ImportError as exc:
        _log.info("probes_unavailable", error=str(exc))
        return

    def devices() -> Sequence[DeviceFingerprint]:
        return reporter.last.devices if reporter.last is not None else ()

    with contextlib.suppress(asyncio.CancelledError):
        await probing.forward(
            loader.watch(), node=node, devices=devices, publish=reporter.health, wall=time.time
        )
