"""Every message that crosses the bus (docs/architecture.md#subjects).

Frozen, tagged msgspec Structs encoded as JSON. Each carries ``v``, its schema
version. Evolution rules: new fields get defaults, a field never changes type,
a tag is never reused.

Bus messages are decoded leniently (a newer agent may add fields);
``decode_strict`` refuses unknown fields and is what tests run over every
captured message, so schema drift fails CI.

Times are Unix seconds (float) taken from the producer's clock and named
``*_s``; memory is MiB (``*_mib``).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec

LinkType = Literal["nvlink", "hccs", "xgmi", "mlulink", "pcie"]
Severity = Literal["info", "warning", "critical", "fatal"]
Source = Literal["agent", "probe", "healer"]
Verdict = Literal["healthy", "degraded", "failed"]
AllocState = Literal["reserved", "bound", "released", "expired"]
Substitution = Literal["allow", "ask", "deny"]
Topology = Literal["high-bandwidth", "any"]

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2, "fatal": 3}


class _Frozen(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """``gc=False``: immutable messages hold no cycles, so the garbage collector
    need not track them; tens of thousands decoded a second then no longer
    trigger full collections (a healer holding 5,000 nodes paused 0.2 s idle,
    1-2 s on a busy CPU, while a fatal event waited)."""


class Link(_Frozen, frozen=True):
    """A link from one device to a peer device on the same node."""

    peer_index: int
    type: LinkType
    bandwidth_gbps: float
    peer_bus_id: str | None = None


class Telemetry(_Frozen, frozen=True):
    utilisation_pct: float = 0.0
    sm_clock_mhz: float = 0.0
    max_sm_clock_mhz: float = 0.0
    power_w: float = 0.0
    power_limit_w: float = 0.0
    temperature_c: float = 0.0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_rows: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    pcie_replay: int = 0
    throttle_reasons: tuple[str, ...] = ()
    achieved_tflops_fp16: float | None = None


class Compute(_Frozen, frozen=True):
    """Compute capacity: from the profile database and, where run, measured."""

    acu_profile: float
    tflops_fp16_profile: float
    acu_measured: float | None = None
    tflops_fp16_measured: float | None = None

    @property
    def acu(self) -> float:
        return self.acu_measured if self.acu_measured is not None else self.acu_profile


class DeviceFingerprint(_Frozen, frozen=True):
    index: int
    uuid: str
    vendor: str
    model: str
    vram_total_mib: int
    vram_free_mib: int
    compute: Compute
    # what the driver and firmware hold outside every process (NVML's v2
    # ``reserved``; for other tools, used less what processes hold): never
    # handed out, so slices are counted against ``vram_usable_mib``
    vram_driver_mib: int = 0
    pci_bus_id: str = ""
    pcie_gen: int | None = None
    pcie_width: int | None = None
    numa_node: int | None = None
    compute_capability: str | None = None
    links: tuple[Link, ...] = ()
    health_score: int = 100
    telemetry: Telemetry = Telemetry()
    error: str | None = None

    @property
    def vram_usable_mib(self) -> int:
        """What tenants can be promised: the total less the driver's hold."""
        return max(self.vram_total_mib - self.vram_driver_mib, 0)


class NodeFingerprint(_Frozen, frozen=True, tag="node_fingerprint", tag_field="type"):
    """A full snapshot of one node's devices (stream HCS_FP, last per subject).

    ``seq`` numbers the snapshots of one ``boot_id`` (one agent process) from 1;
    (boot, seq) is their order (``hcs_bus.ordering``). ``time_s`` and
    ``boot_s`` (when the boot began; 0: not said) are on the agent's clock,
    informational only: freshness is the server's receive time
    (``hcs_bus.clocks``)."""

    node: str
    agent_version: str
    boot_id: str
    seq: int
    time_s: float
    devices: tuple[DeviceFingerprint, ...] = ()
    labels: dict[str, str] = {}
    simulated: bool = False
    boot_s: float = 0.0
    v: int = 1


class HealthEvent(_Frozen, frozen=True, tag="health_event", tag_field="type"):
    """A discrete health event or verdict (stream HCS_HEALTH; the alert feed).

    ``device`` is the device index, ``None`` for the whole node. ``kind`` is an
    open vocabulary (``xid``, ``ecc_uncorrected``, ``device_lost``, ``verdict``
    …); consumers must tolerate kinds they do not know.
    """

    node: str
    kind: str
    severity: Severity
    source: Source
    time_s: float
    device: int | None = None
    device_uuid: str | None = None
    code: int | None = None
    verdict: Verdict | None = None
    health_score: int | None = None
    evidence: dict[str, str | int | float | bool] = {}
    message: str = ""
    id: str = ""
    v: int = 1


class Requests(_Frozen, frozen=True):
    """What a pod asks for, per pod (not per device unless named so)."""

    vram_mib: int = 0
    tflops_fp16: float = 0.0
    tflops_bf16: float = 0.0
    tflops_fp32: float = 0.0
    acu: float = 0.0
    devices: int | None = None


class Policy(_Frozen, frozen=True):
    vendors: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    substitution: Substitution = "deny"
    job: str | None = None
    topology: Topology = "any"


class PlanRequest(_Frozen, frozen=True, tag="plan_request", tag_field="type"):
    namespace: str
    requests: Requests
    policy: Policy = Policy()
    pod_name: str = ""
    dry_run: bool = False
    generate_name: str = ""  # the pod's generateName when it has no name yet
    # the AdmissionReview that asks (request.uid): a pledging plan names it, so
    # its pledge is tied to one admission (docs/architecture.md#ledger)
    admission_uid: str = ""
    # a gang member (docs/architecture.md#gangs): its gang's run key (namespace/job/run)
    # and size; its class is the gang's, pinned by the first member, and no pledge is made
    gang_key: str = ""
    gang_size: int = 0
    # an elastic gang: the fewest members it runs with (0: a fixed gang of gang_size)
    gang_min: int = 0
    # the pod's spec.priority (its PriorityClass's value, set by the API server
    # before webhooks run): a gang's place in the queue
    priority: int = 0
    v: int = 1


class Rejection(_Frozen, frozen=True):
    vendor: str
    model: str
    reason: str


class QuotaVerdict(_Frozen, frozen=True):
    ok: bool = True
    reason: str = ""
    vram_mib_used: int = 0
    vram_mib_hard: int | None = None
    acu_used: float = 0.0
    acu_hard: float | None = None


class Offer(_Frozen, frozen=True):
    vendor: str
    model: str
    devices: int
    vram_mib_per_device: int
    arithmetic: str = ""


class Plan(_Frozen, frozen=True, tag="plan", tag_field="type"):
    ok: bool
    reason: str = ""
    vendor: str = ""
    model: str = ""
    models: tuple[str, ...] = ()
    devices: int = 0
    vram_mib_per_device: int = 0
    whole_device: bool = False
    acu_per_device: float = 0.0
    runtime_profile: str = ""
    quota: QuotaVerdict = QuotaVerdict()
    rejected: tuple[Rejection, ...] = ()
    substituted_from: str | None = None
    offer: Offer | None = None
    # the most of each extended resource one schedulable node of the planned
    # class advertises, in the node's unit (ai.compute/vram bytes, acu, devices);
    # empty when the planner does not say. The injector refuses a pod asking for
    # more, which the kubelet would refuse (OutOf<key>).
    node_capacity: dict[str, int] = {}
    # the pledge a non-dry-run plan made in the ledger (``hcs.io/pledge``); "" for none
    pledge: str = ""
    v: int = 1


class DeviceSlice(_Frozen, frozen=True):
    index: int
    uuid: str
    vram_mib: int
    whole: bool = False


class PodRef(_Frozen, frozen=True):
    namespace: str
    name: str
    uid: str = ""


class AllocationEvent(_Frozen, frozen=True, tag="allocation_event", tag_field="type"):
    node: str
    pod: PodRef
    state: AllocState
    time_s: float
    devices: tuple[DeviceSlice, ...] = ()
    vendor: str = ""
    model: str = ""
    acu: float = 0.0
    job: str | None = None
    priority: int = 0
    reason: str = ""
    annotations: dict[str, str] = {}
    v: int = 1


class Reservation(_Frozen, frozen=True):
    """One pod's devices on a node, as stored in KV ``hcs_alloc``."""

    pod: PodRef
    devices: tuple[DeviceSlice, ...]
    state: AllocState
    time_s: float
    vendor: str = ""
    model: str = ""
    acu: float = 0.0
    job: str | None = None
    priority: int = 0
    pledge: str = ""  # the admission pledge this reservation was made from


class NodeReservations(_Frozen, frozen=True, tag="node_reservations", tag_field="type"):
    """The value under a node's key in KV ``hcs_alloc`` (written with
    compare-and-set on the revision; the key's history is the audit)."""

    node: str
    reservations: tuple[Reservation, ...] = ()
    v: int = 1


class ReleaseRequest(_Frozen, frozen=True, tag="release_request", tag_field="type"):
    """An explicit release of a pod's devices (core subject ``hcs.release``)."""

    pod: PodRef
    reason: str = ""
    v: int = 1


class CheckpointEvent(_Frozen, frozen=True, tag="checkpoint_event", tag_field="type"):
    namespace: str
    job: str
    uri: str
    step: int
    time_s: float
    framework: str = ""
    complete: bool = True
    run: str = ""  # the run of the job (hcs_bus.jobs.JobIdentity.run); "" when unknown
    v: int = 1


class CheckpointRequest(_Frozen, frozen=True, tag="checkpoint_request", tag_field="type"):
    namespace: str
    job: str
    reason: str
    request_id: str
    deadline_s: float = 300.0
    v: int = 1


class UsageAlert(_Frozen, frozen=True, tag="usage_alert", tag_field="type"):
    """A namespace holds at least ``threshold`` of its ComputeQuota (VRAM or
    ACU, whichever is tighter): core subject ``hcs.usage.<namespace>``, once
    per crossing (the metering service, ``scheduler.report.usage_service``).
    ``kind`` "reclaim": a gang of the namespace was taken back by the shared
    pool (the scheduler's gang loop), one alert per gang."""

    namespace: str
    resource: str
    share: float
    threshold: float
    time_s: float
    held_devices: int = 0
    held_vram_mib: int = 0
    held_acu: float = 0.0
    vram_mib_hard: int | None = None
    acu_hard: float | None = None
    severity: Severity = "warning"
    message: str = ""
    # "usage" (above): a crossing; "reclaim": the scheduler took back the borrowed
    # gang ``gang`` of this namespace for ``reclaimed_for`` (held_*: what it took)
    kind: str = "usage"
    gang: str = ""
    reclaimed_for: str = ""
    v: int = 1


Message = (
    NodeFingerprint
    | HealthEvent
    | PlanRequest
    | Plan
    | AllocationEvent
    | NodeReservations
    | ReleaseRequest
    | CheckpointEvent
    | CheckpointRequest
    | UsageAlert
)
ALL_MESSAGES: tuple[type[Any], ...] = (
    NodeFingerprint,
    HealthEvent,
    PlanRequest,
    Plan,
    AllocationEvent,
    NodeReservations,
    ReleaseRequest,
    CheckpointEvent,
    CheckpointRequest,
    UsageAlert,
)

T = TypeVar("T")

ENCODER = msgspec.json.Encoder()


class Decoder(Generic[T]):
    """A JSON decoder for one message type whose every failure is a
    ``msgspec.DecodeError``: msgspec itself lets deep nesting out as
    ``RecursionError`` (and, before 0.23, invalid UTF-8 as
    ``UnicodeDecodeError``), which a
    caller catching msgspec's errors would not expect (a poisoned message must
    be a bad message, never a crashed consumer)."""

    __slots__ = ("_decoder",)

    def __init__(self, kind: type[T]) -> None:
        self._decoder = msgspec.json.Decoder(kind)

    def decode(self, data: bytes) -> T:
        try:
            return self._decoder.decode(data)
        except msgspec.MsgspecError:
            raise
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise msgspec.DecodeError(f"undecodable message: {exc!r:.200}") from exc


_DECODERS: dict[Any, Decoder[Any]] = {}


def encode(message: msgspec.Struct) -> bytes:
    return ENCODER.encode(message)


def decoder_for(kind: type[T]) -> Decoder[T]:
    """The one module-level decoder for a message type (built once, reused)."""
    found = _DECODERS.get(kind)
    if found is None:
        found = _DECODERS[kind] = Decoder(kind)
    return found


def decode(data: bytes, kind: type[T]) -> T:
    """Lenient decode: unknown fields are ignored. Raises msgspec.ValidationError
    or msgspec.DecodeError on a message that is not a ``kind``."""
    return decoder_for(kind).decode(data)


def decode_strict(data: bytes, kind: type[T]) -> T:
    """Decode and refuse any field the schema does not know (schema drift)."""
    value = decode(data, kind)
    raw = msgspec.json.decode(data)
    known = msgspec.to_builtins(value)
    unknown = _unknown_keys(raw, known, path="$")
    if unknown:
        raise msgspec.ValidationError(f"unknown fields: {', '.join(unknown)}")
    return value


def _unknown_keys(raw: Any, known: Any, *, path: str) -> list[str]:
    if isinstance(raw, dict) and isinstance(known, dict):
        out: list[str] = []
        for key, value in raw.items():
            if key not in known:
                # A field equal to its default is omitted by nothing; a key the
                # struct does not define never appears in to_builtins output.
                out.append(f"{path}.{key}")
            else:
                out.extend(_unknown_keys(value, known[key], path=f"{path}.{key}"))
        return out
    if isinstance(raw, list) and isinstance(known, list):
        out = []
        for i, (a, b) in enumerate(zip(raw, known, strict=False)):
            out.extend(_unknown_keys(a, b, path=f"{path}[{i}]"))
        return out
    return []
