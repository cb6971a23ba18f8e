"""The mixed burst of ``python -m bench.burst --mix``, whether the fleet can
hold it, and which allowed classes still had room for a pod left Pending.

Each kind of request is a share of the pods (``MIX``, in 5 % steps): VRAM
slices of three sizes, FP16 TFLOPS, ACU, a whole device, and pods pinned to a
vendor (``hcs.io/vendors``) or a model (``hcs.io/models``, substitution off).
Every 20 consecutive pods hold each kind by its share, in a seeded order.

Sizing is the planner's own (``scheduler.plan.rules.size`` and ``has_room``),
so the offline fit and the end-of-burst room check count a pod as the
extender would: a slice needs one device with that much VRAM free, ``n``
whole devices need ``n`` idle devices on one node.
"""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hcs_bus import demands, vocabulary
from hcs_bus.messages import Policy
from hcs_bus.profiles import ProfileDB
from scheduler.plan.rules import ClassStats, Sizing, Summary, has_room, named, size

BLOCK = 20  # pods per block; every share is a multiple of 100 / BLOCK %


@dataclass(frozen=True)
class Kind:
    name: str
    share_pct: int
    requests: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)


MIX: tuple[Kind, ...] = (
    Kind("vram 8Gi", 35, {"ai.compute/vram": "8Gi"}),
    Kind("vram 16Gi", 20, {"ai.compute/vram": "16Gi"}),
    Kind("vram 24Gi", 10, {"ai.compute/vram": "24Gi"}),
    Kind("tflops-fp16 32", 10, {"ai.compute/tflops-fp16": "32"}),
    Kind("acu 20", 10, {"ai.compute/acu": "20"}),
    Kind("devices 1 (whole)", 5, {"ai.compute/devices": "1"}),
    Kind("vram 16Gi, huawei", 5, {"ai.compute/vram": "16Gi"}, {vocabulary.VENDORS: "huawei"}),
    Kind(
        "vram 16Gi, nvidia/H100-SXM",
        5,
        {"ai.compute/vram": "16Gi"},
        {vocabulary.MODELS: "nvidia/H100-SXM", vocabulary.SUBSTITUTION: "deny"},
    ),
)


def kinds_for(pods: int, *, mix: tuple[Kind, ...] = MIX, seed: int = 7) -> list[Kind]:
    """The kind of each pod in creation order."""
    step = 100 // BLOCK
    assert sum(k.share_pct for k in mix) == 100, "shares must add up to 100 %"
    assert all(k.share_pct % step == 0 for k in mix), f"shares in steps of {step} %"
    block = [k for k in mix for _ in range(k.share_pct // step)]
    rng = random.Random(seed)
    out: list[Kind] = []
    while len(out) < pods:
        rng.shuffle(block)
        out += block
    return out[:pods]


def demand_of(pod: Mapping[str, Any]) -> demands.Demand:
    """A pod's demand as the webhook and the extender read it."""
    found = demands.read(pod)
    if found is None:
        raise ValueError(f"pod {pod.get('metadata', {}).get('name')} asks for no ai.compute/*")
    return found


def bare_pod(kind: Kind) -> dict[str, Any]:
    asked = dict(kind.requests)
    resources = {"requests": asked, "limits": asked}
    return {
        "metadata": {"annotations": dict(kind.annotations)},
        "spec": {"containers": [{"name": "main", "resources": resources}]},
    }


def allowed(policy: Policy, stats: ClassStats, profiles: ProfileDB) -> bool:
    """Whether the pod's policy lets it run on this class at all."""
    if policy.vendors and stats.vendor.lower() not in {v.lower() for v in policy.vendors}:
        return False
    if policy.models and policy.substitution != "allow":
        return named(stats, policy.models, profiles)
    return True


def sizings(
    demand: demands.Demand, classes: Iterable[ClassStats], profiles: ProfileDB
) -> list[tuple[ClassStats, Sizing]]:
    """Allowed classes that can size the pod, best first as the planner ranks
    them (named models first, then least over-provisioning, then least ACU)."""
    out = []
    for stats in classes:
        if not allowed(demand.policy, stats, profiles):
            continue
        try:
            profile = profiles.get(stats.key)
        except KeyError:
            profile = None
        sizing = size(demand.requests, stats, profile)
        if isinstance(sizing, Sizing):
            out.append((stats, sizing))
    models = demand.policy.models

    def rank(item: tuple[ClassStats, Sizing]) -> tuple[bool, float, float, str]:
        stats, sizing = item
        return (
            bool(models) and not named(stats, models, profiles),
            sizing.waste,
            stats.acu,
            stats.key,
        )

    return sorted(out, key=rank)


# ------------------------------------------------------------ offline fit --


@dataclass
class Fit:
    """The mix packed first-fit onto the fleet, the planner's class order."""

    placed: collections.Counter[str] = field(default_factory=collections.Counter)
    unplaced: collections.Counter[str] = field(default_factory=collections.Counter)
    vram_mib: int = 0  # committed
    vram_total_mib: int = 0
    whole_devices: int = 0
    devices: int = 0
    by_kind: dict[str, tuple[int, str]] = field(default_factory=dict)  # kind → (pods, sizes)


def fit(kinds: list[Kind], *, models: list[str], per_node: int, profiles: ProfileDB) -> Fit:
    """Pack ``kinds`` onto nodes of ``models`` (one model key per node)."""
    free: dict[str, list[list[int]]] = collections.defaultdict(list)  # class → node → free MiB
    classes: dict[str, ClassStats] = {}
    out = Fit()
    for key in models:
        p = profiles.get(key)
        classes[key] = ClassStats(vendor=p.vendor, model=p.model, vram_mib=p.vram_mib, acu=p.acu)
        free[key].append([p.vram_mib] * per_node)
        out.vram_total_mib += p.vram_mib * per_node
        out.devices += per_node
    for kind in kinds:
        options = sizings(demand_of(bare_pod(kind)), classes.values(), profiles)
        if kind.name not in out.by_kind:
            sizes = ", ".join(f"{s.key} {_show(z)}" for s, z in options)
            out.by_kind[kind.name] = (0, sizes)
        count, sizes = out.by_kind[kind.name]
        out.by_kind[kind.name] = (count + 1, sizes)
        for stats, sizing in options:
            if _take(free[stats.key], stats, sizing, out):
                out.placed[stats.key] += 1
                break
        else:
            out.unplaced[kind.name] += 1
    return out


def _take(nodes: list[list[int]], stats: ClassStats, sizing: Sizing, out: Fit) -> bool:
    for devices in nodes:
        if sizing.whole:
            idle = [i for i, mib in enumerate(devices) if mib == stats.vram_mib]
            if len(idle) >= sizing.devices:
                for i in idle[: sizing.devices]:
                    devices[i] = 0
                out.vram_mib += sizing.devices * stats.vram_mib
                out.whole_devices += sizing.devices
                return True
            continue
        for i, mib in enumerate(devices):
            if mib >= sizing.vram_mib_per_device:
                devices[i] -= sizing.vram_mib_per_device
                out.vram_mib += sizing.vram_mib_per_device
                return True
    return False


def _show(sizing: Sizing) -> str:
    if sizing.whole:
        return f"{sizing.devices} whole"
    return f"{sizing.vram_mib_per_device / 1024:.1f}Gi slice"


# ------------------------------------------------------- room at the end --


def with_room(pod: Mapping[str, Any], summary: Summary, profiles: ProfileDB) -> list[str]:
    """The classes the pod's policy allows that have room for it now (the
    reservations in the view; outstanding pledges not counted)."""
    demand = demand_of(pod)
    return [
        stats.key
        for stats, sizing in sizings(demand, summary.classes.values(), profiles)
        if has_room(stats, sizing)
    ]


def planned_class(pod: Mapping[str, Any]) -> str:
    """The class in the pod's plan note (``hcs.io/plan``), or "" when none."""
    notes = pod.get("metadata", {}).get("annotations") or {}
    try:
        note = json.loads(notes.get(vocabulary.PLAN, ""))
    except ValueError:
        return ""
    return f"{note.get('vendor', '')}/{note.get('model', '')}" if isinstance(note, dict) else ""
