"""``hcs kueue``: Kueue objects (``kueue.x-k8s.io/v1beta1``) that state the
shared pool's quotas in ACU, for clusters that queue jobs with Kueue and
let HCS place the pods.

* One ``ResourceFlavor`` per collective class (``nccl``, ``hccl``,
  ``cncl``, ``rccl`` ...: a gang runs in one), without node labels: HCS's
  extender chooses the nodes; the flavors only split ACU by library.
* One ``ClusterQueue`` per namespace with a ComputeQuota, all in the cohort
  ``hcs``: covered resource ``ai.compute/acu``; per flavor the
  ``nominalQuota`` is the namespace's guarantee there (its class guarantees
  mapped to their library, the rest of its guarantee split by each
  library's share of the pool's ACU, evenly when the fleet is unknown) and
  the ``borrowingLimit`` what its ceiling leaves above its guarantee
  (omitted without a ceiling); ``fairSharing.weight`` its weight;
  preemption reclaims within the cohort, as the shared pool does.
* One ``LocalQueue`` (``hcs``) per namespace pointing at its ClusterQueue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from hcs import queue
from hcs_bus.bus import Bus
from hcs_bus.settings import Settings
from scheduler.ledger import audit_store
from scheduler.plan.gang_rules import LIBRARY, library_of
from scheduler.plan.rules import ClassStats, QuotaLimits

API = "kueue.x-k8s.io/v1beta1"
COHORT = "hcs"
RESOURCE = "ai.compute/acu"
LOCAL_QUEUE = "hcs"


def libraries_of(classes: Mapping[str, ClassStats]) -> dict[str, float]:
    """Each collective library's ACU in the fleet (all known ones, 0, when
    the fleet is unknown)."""
    if not classes:
        return {lib: 0.0 for lib in sorted(set(LIBRARY.values()))}
    out: dict[str, float] = {}
    for c in classes.values():
        lib = library_of(c.vendor)
        out[lib] = out.get(lib, 0.0) + c.acu * c.devices
    return dict(sorted(out.items()))


def _library_of_key(key: str) -> str:
    return library_of(key.partition("/")[0]) if "/" in key else key.lower()


def nominal(limits: QuotaLimits, libraries: Mapping[str, float]) -> dict[str, float]:
    """The namespace's guarantee per library."""
    out = {lib: 0.0 for lib in libraries}
    for key, _, acu in limits.guaranteed_classes:
        lib = _library_of_key(key)
        if lib in out and acu is not None:
            out[lib] += acu
    rest = max((limits.guaranteed_acu or 0.0) - sum(out.values()), 0.0)
    total = sum(libraries.values())
    for lib, acu in libraries.items():
        out[lib] += rest * (acu / total if total > 0 else 1 / len(libraries))
    return {lib: round(v, 3) for lib, v in out.items()}


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def manifests(
    limits: Mapping[str, QuotaLimits | None], libraries: Mapping[str, float]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": lib}}
        for lib in libraries
    ]
    for ns, lim in sorted(limits.items()):
        if lim is None:
            continue
        out += [_cluster_queue(ns, lim, libraries), _local_queue(ns)]
    return out


def _cluster_queue(ns: str, lim: QuotaLimits, libraries: Mapping[str, float]) -> dict[str, Any]:
    quota = nominal(lim, libraries)
    borrow = None
    if lim.acu is not None:
        borrow = max(lim.acu - (lim.guaranteed_acu or 0.0), 0.0)
    flavors = []
    for lib in libraries:
        resource: dict[str, Any] = {"name": RESOURCE, "nominalQuota": _number(quota[lib])}
        if borrow is not None:
            resource["borrowingLimit"] = _number(round(borrow, 3))
        flavors.append({"name": lib, "resources": [resource]})
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": f"hcs-{ns}"},
        "spec": {
            "cohort": COHORT,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": [RESOURCE], "flavors": flavors}],
            "fairSharing": {"weight": str(_number(lim.weight))},
            "preemption": {
                "reclaimWithinCohort": "Any",
                "withinClusterQueue": "LowerPriority",
                "borrowWithinCohort": {"policy": "Never"},
            },
        },
    }


def _local_queue(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": ns},
        "spec": {"clusterQueue": f"hcs-{ns}"},
    }


def render(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False)


async def run(bus: Bus, settings: Settings, *, namespaces: Iterable[str]) -> int:
    """Prints the objects for the namespaces named, those the ledger holds
    devices or pledges for, and (without a cluster) those of the quota file."""
    ledger = await audit_store.read_ledger(bus)
    pledges = await audit_store.read_pledges(bus)
    seen = {r.pod.namespace for doc in ledger.values() for r in doc.reservations}
    limits = await queue.quota_limits(settings, set(namespaces) | seen | set(pledges))
    classes = await queue.pool_and_classes(bus, settings)
    print(render(manifests(limits, libraries_of(classes))), end="")
    return 0
