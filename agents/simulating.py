"""One process plays a whole fleet from a fleet file (``agents.fleet``).

Each simulated node has its own Reporter (seq, boot_id); devices come from
the profile database with slightly noisy telemetry; failure scripts fire at
``at_s`` seconds after start, measured on the event loop clock. What a script
does:

========================  ==================================================
xid (code)                HealthEvent ``xid`` with the code's severity
                          (79 fatal, 13 info …), ``repeat`` times
ecc_storm (count)         a burst of ``count`` ``ecc_corrected`` events;
                          the telemetry counter climbs
slow (to)                 telemetry only: achieved TFLOPS drops to ``to`` ×
                          — the healer has to notice
thermal_throttle          clocks down, throttle reason set, one warning event
fall_off_bus              the device reports an error; ``device_lost`` fatal
recover                   the device (or node) is healthy again; info event
detector_error            the agent's own detector fails; warning event
========================  ==================================================
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agents import xids
from agents.fleet import Failure, Fleet, NodeSpec, profiles_of
from agents.labels import node_labels
from agents.reporting import Publisher, Reporter
from hcs_bus.messages import (
    Compute,
    DeviceFingerprint,
    HealthEvent,
    Link,
    LinkType,
    Severity,
    Telemetry,
)
from hcs_bus.profiles import Profile, ProfileDB
from hcs_bus.profiles import load as load_profiles
from hcs_bus.telemetry import logger
from hcs_bus.vocabulary import Kind

_log = logger("hcs.agent.simulating")
EFFICIENCY = 0.85  # achieved / peak dense FP16 of a healthy device in a matmul loop


@dataclass
class SimDevice:
    index: int
    profile: Profile
    speed: float = 1.0
    lost: bool = False
    hot: bool = False
    ecc_corrected: int = 0


@dataclass
class SimNode:
    spec: NodeSpec
    reporter: Reporter
    devices: list[SimDevice]
    script: list[tuple[float, Failure]]
    links: LinkType
    rng: random.Random
    next_step: int = 0
    used_mib: dict[int, int] = field(default_factory=dict)
    # ``used_mib`` as the last fingerprint offered saw it: a change is worth a look
    offered_used_mib: dict[int, int] | None = None


def timeline(failures: tuple[Failure, ...]) -> list[tuple[float, Failure]]:
    """Scripts expanded into (time, failure) steps, repeats included, time-sorted."""
    steps = [(f.at_s + k * f.every_s, f) for f in failures for k in range(f.repeat)]
    return sorted(steps, key=lambda step: step[0])


def build_node(
    spec: NodeSpec, *, publisher: Publisher, db: ProfileDB, interval_s: float, seed: int
) -> SimNode:
    profiles = profiles_of(spec, db=db)
    reporter = Reporter(
        publisher,
        node=spec.name,
        report_interval_s=interval_s,
        simulated=True,
        labels=node_labels(
            spec.labels,
            profiles=profiles,
            network_group=spec.network_group,
            rdma_fabric=spec.rdma_fabric,
        ),
    )
    return SimNode(
        spec=spec,
        reporter=reporter,
        devices=[SimDevice(i, p) for i, p in enumerate(profiles)],
        script=timeline(spec.failures),
        links=spec.topology or profiles[0].interconnect,
        rng=random.Random(f"{seed}:{spec.name}"),
    )


def fingerprints(node: SimNode, *, noise_pct: float) -> list[DeviceFingerprint]:
    return [_device(node, d, noise_pct=noise_pct) for d in node.devices]


def _device(node: SimNode, dev: SimDevice, *, noise_pct: float) -> DeviceFingerprint:
    p, rng = dev.profile, node.rng
    jitter = 1.0 + rng.uniform(-noise_pct, noise_pct) / 100.0
    clock = 1410.0 * (0.55 if dev.hot else 1.0) * min(1.0, dev.speed + 0.1)
    telemetry = Telemetry(
        utilisation_pct=round(rng.uniform(0, 3), 1),
        sm_clock_mhz=round(clock * jitter),
        max_sm_clock_mhz=1410.0,
        power_w=round(p.tflops_fp16 * 0.25 * jitter, 1),
        power_limit_w=round(p.tflops_fp16 * 1.3, 0),
        temperature_c=round((88.0 if dev.hot else 38.0) * jitter, 1),
        ecc_corrected=dev.ecc_corrected,
        throttle_reasons=("hw_thermal_slowdown",) if dev.hot else (),
        achieved_tflops_fp16=None
        if dev.lost
        else round(p.tflops_fp16 * EFFICIENCY * dev.speed * jitter, 1),
    )
    used = node.used_mib.get(dev.index, 512)
    return DeviceFingerprint(
        index=dev.index,
        uuid=_uuid(node.spec.name, dev.index, vendor=p.vendor),
        vendor=p.vendor,
        model=p.model,
        vram_total_mib=p.vram_mib,
        vram_free_mib=0 if dev.lost else p.vram_mib - used,
        compute=Compute(acu_profile=round(p.acu, 2), tflops_fp16_profile=p.tflops_fp16),
        pci_bus_id=_bus_id(dev.index),
        pcie_gen=4,
        pcie_width=16,
        numa_node=0 if dev.index < len(node.devices) // 2 else 1,
        links=_links(node, dev),
        health_score=0 if dev.lost else 100,
        telemetry=telemetry,
        error="fallen off the bus (simulated Xid 79)" if dev.lost else None,
    )


def _uuid(node: str, index: int, *, vendor: str) -> str:
    digest = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    body = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return f"GPU-{body}" if vendor == "nvidia" else f"{vendor}-{body}"


def _bus_id(index: int) -> str:
    return f"0000:{0x18 + index * 0x10:02x}:00.0"


def _links(node: SimNode, dev: SimDevice) -> tuple[Link, ...]:
    peers = [d for d in node.devices if d.index != dev.index and not d.lost]
    if dev.lost or not peers:
        return ()
    if node.links == "pcie":
        return tuple(
            Link(peer_index=d.index, type="pcie", bandwidth_gbps=31.5, peer_bus_id=_bus_id(d.index))
            for d in peers
        )
    total = dev.profile.interconnect_bandwidth_gbps
    # NVLink nodes are NVSwitch-connected (full bandwidth to each peer); the
    # other fabrics are point-to-point meshes sharing the device's total.
    each = total if node.links == "nvlink" else round(total / max(1, len(node.devices) - 1), 1)
    return tuple(
        Link(peer_index=d.index, type=node.links, bandwidth_gbps=each, peer_bus_id=_bus_id(d.index))
        for d in peers
    )


def apply(node: SimNode, failure: Failure, *, now: float) -> list[HealthEvent]:
    """Change the node's state for one script step; the events it raises."""
    dev = node.devices[failure.device] if failure.device is not None else None

    def event(kind: str, severity: Severity, message: str, **extra: int) -> HealthEvent:
        return HealthEvent(
            node=node.spec.name,
            kind=kind,
            severity=severity,
            source="agent",
            time_s=now,
            device=dev.index if dev else None,
            device_uuid=_uuid(node.spec.name, dev.index, vendor=dev.profile.vendor)
            if dev
            else None,
            code=extra.get("code"),
            message=message,
            evidence={"simulated": True},
        )

    kind = failure.kind
    if kind == "xid" and failure.code is not None:
        return [
            event(Kind.XID, xids.severity(failure.code), f"Xid {failure.code}", code=failure.code)
        ]
    if kind == "ecc_storm" and dev is not None:
        dev.ecc_corrected += failure.count
        return [
            event(Kind.ECC_CORRECTED, "warning", "single-bit ECC error")
            for _ in range(failure.count)
        ]
    if kind == "slow" and dev is not None:
        dev.speed = failure.to or 1.0
        return []
    if kind == "thermal_throttle" and dev is not None:
        dev.hot = True
        return [event(Kind.THERMAL_THROTTLE, "warning", "hw_thermal_slowdown")]
    if kind == "fall_off_bus" and dev is not None:
        dev.lost = True
        nvidia = dev.profile.vendor == "nvidia"  # Xid 79 is NVIDIA's code for it
        lost = "GPU has fallen off the bus" if nvidia else "device has fallen off the bus"
        return [event(Kind.DEVICE_LOST, "fatal", lost, **({"code": 79} if nvidia else {}))]
    if kind == "recover":
        for d in [dev] if dev else node.devices:
            d.speed, d.lost, d.hot = 1.0, False, False
        return [event(Kind.RECOVERED, "info", "device healthy again")]
    if kind == "detector_error":
        return [event(Kind.DETECTOR_ERROR, "warning", "simulated detector failure")]
    return []


async def play(
    fleet: Fleet,
    *,
    publisher: Publisher,
    report_interval_s: float,
    tick_s: float = 0.1,
    db: ProfileDB | None = None,
    wall: Callable[[], float] = time.time,
    nodes_out: list[SimNode] | None = None,
) -> None:
    """Run the fleet until cancelled: scripts on time, fingerprints when due or changed."""
    db = db or load_profiles()
    interval = fleet.report_interval_s or report_interval_s
    nodes = [
        build_node(s, publisher=publisher, db=db, interval_s=interval, seed=fleet.seed)
        for s in fleet.nodes
    ]
    if nodes_out is not None:
        nodes_out.extend(nodes)
    loop = asyncio.get_running_loop()
    start = loop.time()
    _log.info("fleet_started", nodes=len(nodes), devices=sum(len(n.devices) for n in nodes))
    while True:
        loop_s = loop.time()
        for node in nodes:
            step(
                node, elapsed_s=loop_s - start, loop_s=loop_s, now=wall(), noise_pct=fleet.noise_pct
            )
        await asyncio.sleep(tick_s)


def step(node: SimNode, *, elapsed_s: float, loop_s: float, now: float, noise_pct: float) -> None:
    """Fire the script steps that are due, then offer a fingerprint. Between
    script steps only the noise and ``used_mib`` move, and noise is never a
    material change (``agents.changes``): a fingerprint is built only when
    the report is due, a step fired or ``used_mib`` moved: one process then
    plays thousands of nodes, where building each node's telemetry at every
    tick would throw nearly all of it away."""
    changed = False
    while node.next_step < len(node.script) and node.script[node.next_step][0] <= elapsed_s:
        _, failure = node.script[node.next_step]
        node.next_step += 1
        for event in apply(node, failure, now=now):
            node.reporter.health(event)
        changed = True
        _log.info("script_step", node=node.spec.name, kind=failure.kind, device=failure.device)
    moved = node.offered_used_mib != node.used_mib
    if not (changed or moved or node.reporter.due(loop_s)):
        return
    node.offered_used_mib = dict(node.used_mib)
    node.reporter.offer(
        fingerprints(node, noise_pct=noise_pct), now=now, loop_s=loop_s, force=changed
    )
