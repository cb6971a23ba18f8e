"""What the agent puts on its Node: labels and extended resources (pure).

Labels ``hcs.io/vendor``, ``hcs.io/model`` (from the usable devices),
``hcs.io/network-group`` and ``hcs.io/rdma-fabric`` (given by the operator or
the fleet file), plus any labels the fleet file lists. From those,
:func:`collective_labels`: ``ai.compute/collective``, the vendor's collective
library (``hcs_bus.vocabulary.COLLECTIVE_LIBRARY``: nccl, hccl, cncl ...),
and ``ai.compute/fabric``, ``<library>.<group>`` where the group is the node's
RDMA fabric, else its network group (the order the scheduler reads them in):
one value per set of nodes whose devices can run one collective together,
for other schedulers' topology rules (Kueue, KAI, Volcano). Capacity, in the unit
pods request (the kubelet compares the two numbers as they are):

=======================  ==========================================
``ai.compute/vram``      bytes: sum of the usable devices' MiB × 2^20
``ai.compute/acu``       whole ACU of the usable devices (rounded down)
``ai.compute/devices``   count of usable devices
=======================  ==========================================

A usable device is one without ``error``. Label keys and values follow the
Kubernetes rules (``[prefix/]name``, name and value ≤ 63 characters of
``[A-Za-z0-9._-]`` starting and ending alphanumeric, prefix a DNS subdomain).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

from hcs_bus import vocabulary
from hcs_bus.messages import DeviceFingerprint
from hcs_bus.profiles import Profile
from hcs_bus.units import ACU_RESOURCE, DEVICES_RESOURCE, VRAM_RESOURCE, mib_to_bytes

VENDOR = vocabulary.VENDOR_LABEL
MODEL = vocabulary.MODEL_LABEL
NETWORK_GROUP = vocabulary.NETWORK_GROUP_LABEL
RDMA_FABRIC = vocabulary.RDMA_FABRIC_LABEL
COLLECTIVE = vocabulary.COLLECTIVE_LABEL
FABRIC = vocabulary.FABRIC_LABEL
# the labels naming a node's group, in the order the scheduler reads them
GROUP_LABELS = (RDMA_FABRIC, NETWORK_GROUP)
VRAM = VRAM_RESOURCE
ACU = ACU_RESOURCE
DEVICES = DEVICES_RESOURCE
MIXED = "mixed"

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key, or None when it is."""
    prefix, slash, name = key.rpartition("/")
    if not _NAME.match(name):
        return "the name part must be 1-63 characters of [A-Za-z0-9._-], alphanumeric at both ends"
    if slash and not prefix:
        return "the prefix before '/' is empty"
    if prefix and (len(prefix) > 253 or not all(_DNS_LABEL.match(p) for p in prefix.split("."))):
        return "the prefix must be a lower-case DNS subdomain (at most 253 characters)"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value, or None when it is ("" is valid)."""
    if value == "" or _NAME.match(value):
        return None
    return "must be at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends"


def label_safe(text: str) -> str:
    """``text`` as a valid label value: runs of other characters become one
    ``-``, the ends are trimmed to alphanumerics, at most 63 characters
    (``"AMD Instinct MI300X"`` → ``"AMD-Instinct-MI300X"``; ``""`` if nothing is left)."""
    safe = _UNSAFE.sub("-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", safe)


def valid_labels(labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the valid labels, {key: why} for the ones Kubernetes would refuse)."""
    good: dict[str, str] = {}
    bad: dict[str, str] = {}
    for key, value in labels.items():
        problem = label_key_problem(key)
        if problem is None and (why := label_value_problem(value)) is not None:
            problem = f"value {value!r} {why}"
        if problem is None:
            good[key] = value
        else:
            bad[key] = problem
    return good, bad


def _class_labels(models: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Vendor and model labels of these (vendor, model) pairs; ``mixed`` when several."""
    if not models:
        return {}
    vendors = {v for v, _ in models}
    return {
        VENDOR: models[0][0] if len(vendors) == 1 else MIXED,
        MODEL: models[0][1] if len(models) == 1 else MIXED,
    }


def node_labels(
    base: Mapping[str, str],
    *,
    profiles: Iterable[Profile],
    network_group: str | None,
    rdma_fabric: str | None = None,
) -> dict[str, str]:
    """Labels of a (simulated) node whose devices have these profiles."""
    out = dict(base)
    out.update(_class_labels(sorted({(p.vendor, p.model) for p in profiles})))
    if network_group:
        out[NETWORK_GROUP] = network_group
    if rdma_fabric:
        out[RDMA_FABRIC] = rdma_fabric
    return out


def collective_labels(
    labels: Mapping[str, str], *, node: Mapping[str, str]
) -> dict[str, str | None]:
    """``ai.compute/collective`` and ``ai.compute/fabric`` of a node about to carry
    ``labels`` whose Node has ``node`` (the operator's network labels there
    count where ``labels`` has none). None for a label the node no longer
    has (a mixed node has no one library; a node without a group no
    fabric); nothing while the node's vendor is not known."""
    vendor = labels.get(VENDOR)
    if not vendor:
        return {}
    if vendor == MIXED:
        return {COLLECTIVE: None, FABRIC: None}
    library = label_safe(vocabulary.collective_library(vendor))
    both = {**node, **labels}
    group = next((both[key] for key in GROUP_LABELS if both.get(key)), "")
    return {COLLECTIVE: library, FABRIC: fabric_value(library, group) if group else None}


def fabric_value(library: str, group: str) -> str:
    """``<library>.<group>``; past 63 characters, cut and ended by a hash of
    the group, so that two long groups stay two fabrics."""
    value = label_safe(f"{library}.{group}")
    if len(f"{library}.{group}") <= 63 and value == f"{library}.{group}":
        return value
    digest = hashlib.sha256(group.encode()).hexdigest()[:8]
    return f"{value[: 63 - 9].rstrip('-_.')}-{digest}"


def labels_of_devices(
    devices: Sequence[DeviceFingerprint], *, base: Mapping[str, str]
) -> dict[str, str]:
    """``base`` plus vendor and model of the usable devices (``base`` alone
    when none is usable: labels are merged, so the Node keeps its last ones)."""
    out = dict(base)
    out.update(_class_labels(sorted({(d.vendor, d.model) for d in devices if not d.error})))
    return out


def capacity(devices: Sequence[DeviceFingerprint]) -> dict[str, int]:
    """Extended resources of the usable devices, in the units pods request."""
    usable = [d for d in devices if not d.error]
    return {
        VRAM: mib_to_bytes(sum(d.vram_usable_mib for d in usable)),
        ACU: int(round(sum(d.compute.acu for d in usable), 6)),  # float noise, then down
        DEVICES: len(usable),
    }
