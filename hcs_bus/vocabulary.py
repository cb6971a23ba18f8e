"""The words every part shares (pure): ``hcs.io/*`` names, health kinds, Xids.

* **Names.** Every ``hcs.io/*`` annotation, label and taint key, spelled once;
  and the other projects' job and pod-group keys HCS reads (``hcs_bus.jobs``).
  ``COLLECTIVE_LIBRARY``: each vendor's collective library, as the agent
  labels nodes (``ai.compute/collective``) and the gang planner keeps one per job.
* **Health kinds.** ``Kind`` enumerates every ``HealthEvent.kind`` an agent,
  a kernel probe, the simulator or the healer emits; ``KIND_CLASSES`` says how
  the healer takes each one: ``fatal`` (the device fails at once), ``warning``
  (counted, lowers the score, a burst degrades) or ``info`` (never acted on).
  ``NODE_WIDE`` names the kinds that take the whole node out (NVSwitch or
  fabric down, PCIe root port, driver): the node is isolated, not a device.
  Rules that look past one event (thresholds, storms, fatal at a severity)
  live in ``healer/data/rules.yaml``.
* **Xids.** One NVIDIA Xid table (``hcs_bus/data/xids.json``, each entry with
  its source in NVIDIA's documentation): the agent stamps ``xid_severity`` on
  what it emits and the healer classifies a lone Xid by ``xid_class``; both
  read the same entry, so the alert feed and the healer cannot disagree.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Final, Literal

import msgspec

from hcs_bus.messages import Severity

__all__ = [
    "KIND_CLASSES",
    "NODE_WIDE",
    "PREFIX",
    "XIDS",
    "HealthClass",
    "Kind",
    "XidEntry",
    "kind_class",
    "node_wide",
    "xid_class",
    "xid_severity",
]

PREFIX: Final = "hcs.io/"

# -- pod annotations: written by users (the injector lets them) ----------------
VENDORS: Final = "hcs.io/vendors"
MODELS: Final = "hcs.io/models"
SUBSTITUTION: Final = "hcs.io/substitution"
JOB: Final = "hcs.io/job"
# pod phases after which a pod holds nothing (core/v1 PodStatus.phase)
POD_FINISHED: Final = ("Succeeded", "Failed")
TOPOLOGY: Final = "hcs.io/topology"
REBIND: Final = "hcs.io/rebind"
ENGINE: Final = "hcs.io/engine"
FRAMEWORK: Final = "hcs.io/framework"
CODE_PATH: Final = "hcs.io/code-path"
REPLAN: Final = "hcs.io/replan"  # "recreate": a stranded bare pod is deleted and created again
REPLAN_RECREATE: Final = "recreate"
ENGINE_PARAM_PREFIX: Final = "hcs.io/engine-"
JOB_SIZE: Final = "hcs.io/job-size"  # how many pods the job has (``hcs_bus.jobs``)
JOB_MIN: Final = "hcs.io/job-min"  # an elastic job: the fewest pods it runs with
JOB_MAX: Final = "hcs.io/job-max"  # an elastic job: the most pods it runs with
CHECKPOINT_DIR: Final = "hcs.io/checkpoint-dir"  # where the trainer writes checkpoints
RESUME_RUN: Final = "hcs.io/resume-run"  # resume another run's checkpoint (its run id)

# -- pod annotations: written by HCS only --------------------------------------
PLAN: Final = "hcs.io/plan"
PLAN_SIG: Final = "hcs.io/plan-sig"
PLEDGE: Final = "hcs.io/pledge"
DEVICES: Final = "hcs.io/devices"
VRAM_QUOTA: Final = "hcs.io/vram-quota"
RESUME_FROM: Final = "hcs.io/resume-from"
COLLECTIVE_P2P_DISABLE: Final = "hcs.io/collective-p2p-disable"
COLLECTIVE_IB_DISABLE: Final = "hcs.io/collective-ib-disable"
COLLECTIVE_INTRA_PCIE: Final = "hcs.io/collective-intra-pcie"
COLLECTIVE_INTRA_ROCE: Final = "hcs.io/collective-intra-roce"
WAKE: Final = "hcs.io/wake"  # changed by the scheduler so kube-scheduler retries a parked pod
TRACEPARENT: Final = "hcs.io/traceparent"  # W3C trace of the admission; the bind continues it
SUBMITTED: Final = "hcs.io/submitted"  # the pod as submitted, kept for hcs.io/replan: recreate
GANG: Final = "hcs.io/gang"  # a gang member: its gang's run key (namespace/job/run)
GANG_SIZE: Final = "hcs.io/gang-size"  # a gang member: how many members its gang has
GANG_GATE: Final = "hcs.io/gang"  # the scheduling gate a gang member waits behind

# -- node labels and taints ------------------------------------------------------
VENDOR_LABEL: Final = "hcs.io/vendor"
MODEL_LABEL: Final = "hcs.io/model"
NETWORK_GROUP_LABEL: Final = "hcs.io/network-group"
RDMA_FABRIC_LABEL: Final = "hcs.io/rdma-fabric"
# written by the agent: the node's collective library (``COLLECTIVE_LIBRARY``) and
# ``<library>.<RDMA fabric, else network group>``, one domain a gang's ranks can share
COLLECTIVE_LABEL: Final = "ai.compute/collective"
FABRIC_LABEL: Final = "ai.compute/fabric"
NATS_NKEY_LABEL: Final = "hcs.io/nats-nkey"
# a Namespace whose checkpoint sidecars get NATS user sidecar:<ns> and Secret
# CHECKPOINT_SECRET (key CHECKPOINT_SEED_KEY) from the hcs-nats-auth Job
CHECKPOINTS_LABEL: Final = "hcs.io/checkpoints"
CHECKPOINT_SECRET: Final = "hcs-checkpoint-nats"
CHECKPOINT_SEED_KEY: Final = "seed.nk"
UNHEALTHY_TAINT: Final = "hcs.io/unhealthy"

# -- other projects' job and pod-group keys on pods (read by hcs_bus.jobs) --------
# Kubernetes Job: the pod's rank in an Indexed Job (annotation, and label since 1.28)
JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
# JobSet: labels (and annotations of the same names) on every pod of a JobSet
JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID: Final = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_REPLICATED_JOB: Final = "jobset.sigs.k8s.io/replicatedjob-name"
# Kueue plain-pod groups: the group's name (label) and its pod count (annotation)
KUEUE_POD_GROUP: Final = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_TOTAL: Final = "kueue.x-k8s.io/pod-group-total-count"
# scheduler-plugins coscheduling: the PodGroup's name (label)
COSCHEDULING_POD_GROUP: Final = "scheduling.x-k8s.io/pod-group"
# Volcano: the PodGroup's name (annotation)
VOLCANO_POD_GROUP: Final = "scheduling.k8s.io/group-name"
# NVIDIA KAI scheduler: the PodGroup's name (annotation; some tools set a label)
KAI_POD_GROUP: Final = "pod-group-name"
# API groups of the PodGroup objects of each (their spec.minMember)
COSCHEDULING_API_GROUP: Final = "scheduling.x-k8s.io"
VOLCANO_API_GROUP: Final = "scheduling.volcano.sh"
KAI_API_GROUP: Final = "scheduling.run.ai"

# -- collective libraries ------------------------------------------------------
# Each vendor's own collective library; a vendor not listed speaks its own.
COLLECTIVE_LIBRARY: Final[Mapping[str, str]] = MappingProxyType(
    {
        "nvidia": "nccl",
        "huawei": "hccl",
        "cambricon": "cncl",
        "hygon": "rccl",
        "amd": "rccl",
        "mthreads": "mccl",
        "iluvatar": "ixccl",
    }
)


def collective_library(vendor: str) -> str:
    """The collective library a vendor's devices speak (``COLLECTIVE_LIBRARY``)."""
    return COLLECTIVE_LIBRARY.get(vendor.lower(), vendor.lower())


HealthClass = Literal["fatal", "warning", "info"]
# Evidence key of every healer verdict: the device indices the healer holds
# failed (out of placement) when it published, comma-separated, "" for none.
DEVICES_OUT: Final = "devices_out"


class Kind(enum.StrEnum):
    """Every health event kind; a member is its own wire string."""

    # NVIDIA (NVML events, kernel probes, simulator)
    XID = "xid"
    SXID = "sxid"
    ECC_CORRECTED = "ecc_corrected"
    ECC_UNCORRECTED = "ecc_uncorrected"
    # device presence and state changes (agents.changes, simulator)
    DEVICE_LOST = "device_lost"
    FALLEN_OFF_BUS = "fallen_off_bus"
    DEVICE_ADDED = "device_added"
    DEVICE_UNREADABLE = "device_unreadable"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    THERMAL_THROTTLE = "thermal_throttle"
    THERMAL_THROTTLE_CLEARED = "thermal_throttle_cleared"
    HEALTH_DEGRADED = "health_degraded"
    RECOVERED = "recovered"
    # the agent itself (agents.detecting, agents.backstopping)
    DETECTOR_ERROR = "detector_error"
    DETECTOR_RECOVERED = "detector_recovered"
    VRAM_OVER_QUOTA = "vram_over_quota"
    # PCIe AER and vendor driver faults (kernel probes)
    AER_CORRECTABLE = "aer_correctable"
    AER_NONFATAL = "aer_nonfatal"
    AER_FATAL = "aer_fatal"
    ASCEND_FAULT = "ascend_fault"
    ASCEND_HEALTH = "ascend_health"
    HYGON_FAULT = "hygon_fault"
    CAMBRICON_FAULT = "cambricon_fault"
    TEST_PROBE = "test_probe"
    # faults of the whole node, whatever device index they carry (NODE_WIDE)
    NODE_LOST = "node_lost"
    NVSWITCH_DOWN = "nvswitch_down"
    FABRIC_DOWN = "fabric_down"
    PCIE_ROOT_DOWN = "pcie_root_down"
    DRIVER_FAILURE = "driver_failure"
    # telemetry signal names the healer also accepts as event kinds
    REMAP_FAILED = "remap_failed"
    REMAP_PENDING = "remap_pending"
    RETIRED_PAGES = "retired_pages"
    PCIE_REPLAY = "pcie_replay"
    NVLINK_DOWN = "nvlink_down"
    HCCS_DOWN = "hccs_down"
    THERMAL = "thermal"
    POWER = "power"
    THROTTLE = "throttle"
    # the healer's own events (ignored by its judge, read by subscribers)
    VERDICT = "verdict"
    ACTION = "action"
    BREAKER_OPEN = "breaker_open"
    ISOLATED = "isolated"  # an isolation the breaker counted (its window, kept on the bus)


_FATAL = (
    Kind.DEVICE_LOST,
    Kind.FALLEN_OFF_BUS,
    Kind.ROW_REMAP_FAILURE,
    Kind.REMAP_FAILED,
    Kind.AER_FATAL,
    Kind.NVLINK_DOWN,
    Kind.HCCS_DOWN,
    Kind.NODE_LOST,
    Kind.NVSWITCH_DOWN,
    Kind.FABRIC_DOWN,
    Kind.PCIE_ROOT_DOWN,
    Kind.DRIVER_FAILURE,
)
# Kinds that take the whole node out: the healer isolates the node (taint),
# not only the device an event names. Every other kind is about its device.
NODE_WIDE: Final = frozenset(
    k.value
    for k in (
        Kind.NODE_LOST,
        Kind.NVSWITCH_DOWN,
        Kind.FABRIC_DOWN,
        Kind.PCIE_ROOT_DOWN,
        Kind.DRIVER_FAILURE,
    )
)
_INFO = (
    Kind.DEVICE_ADDED,
    Kind.THERMAL_THROTTLE_CLEARED,
    Kind.RECOVERED,
    Kind.DETECTOR_RECOVERED,
    Kind.VRAM_OVER_QUOTA,  # the pod overran its quota; the device is fine
    Kind.TEST_PROBE,
    Kind.VERDICT,
    Kind.ACTION,
    Kind.BREAKER_OPEN,
    Kind.ISOLATED,
)

KIND_CLASSES: Final[Mapping[str, HealthClass]] = MappingProxyType(
    {
        kind.value: ("fatal" if kind in _FATAL else "info" if kind in _INFO else "warning")
        for kind in Kind
    }
)


def node_wide(kind: str) -> bool:
    """Whether an event of ``kind`` is about the whole node, not one device."""
    return kind in NODE_WIDE


def kind_class(kind: str) -> HealthClass | None:
    """How the healer takes one event of ``kind``; None for a kind nobody emits."""
    return KIND_CLASSES.get(kind)


class XidEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One Xid code: its class, what it is, and where the class comes from."""

    cls: HealthClass = msgspec.field(name="class")
    what: str
    source: str


class _XidTable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    doc: str
    default: HealthClass
    codes: dict[int, XidEntry]


def _load_xids() -> _XidTable:
    text = (resources.files("hcs_bus") / "data" / "xids.json").read_bytes()
    return msgspec.json.decode(text, type=_XidTable, strict=False)


_XID_TABLE: Final = _load_xids()
XIDS: Final[Mapping[int, XidEntry]] = MappingProxyType(_XID_TABLE.codes)
XID_FATAL: Final = frozenset(c for c, e in XIDS.items() if e.cls == "fatal")
XID_INFO: Final = frozenset(c for c, e in XIDS.items() if e.cls == "info")


def xid_class(code: int) -> HealthClass:
    """The class of one Xid code (unlisted codes: the table's default)."""
    entry = XIDS.get(code)
    return entry.cls if entry is not None else _XID_TABLE.default


def xid_severity(code: int) -> Severity:
    """The severity an agent stamps on an Xid event: its class."""
    return xid_class(code)
