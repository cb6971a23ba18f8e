"""Settings: one typed, grouped object, decoded once at start.

Sources, later wins: defaults, a YAML file (``HCS_CONFIG`` or ``--config``;
decoded strictly, unknown keys are an error), then environment variables
``HCS_<GROUP>__<FIELD>`` (e.g. ``HCS_BUS__URL``). ``NATS_URL`` is honoured for
``bus.url``, which is one server or a comma-separated list of the servers of a
cluster (every part connects to any of them). Every field carries its unit in
its name.

Secrets never leave in a dump: ``repr()`` of the bus group masks its
password, token and the credentials of its URL, and ``redacted(settings)`` is
the form to print or log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from hcs_bus.errors import ConfigError
from hcs_bus.redacting import MASK, is_secret_key, redact_url


class _Group(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class BusSettings(_Group, frozen=True, forbid_unknown_fields=True):
    url: str = "nats://127.0.0.1:4222"
    name: str = "hcs"
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    inbox_prefix: str | None = None
    replicas: int = 1
    connect_timeout_s: float = 2.0
    drain_timeout_s: float = 5.0
    ping_interval_s: float = 20.0
    reconnect_wait_s: float = 2.0
    reconnect_jitter_s: float = 1.0
    health_max_age_s: float = 7 * 24 * 3600.0
    health_max_per_node: int = 10_000
    alloc_max_age_s: float = 30 * 24 * 3600.0
    checkpoint_ttl_s: float = 7 * 24 * 3600.0  # a run's checkpoint entry expires this long after

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in _redacted_fields(self).items())
        return f"BusSettings({shown})"


class TelemetrySettings(_Group, frozen=True, forbid_unknown_fields=True):
    log_level: str = "info"
    log_format: Literal["json", "console"] = "json"
    service_name: str = "hcs"
    otlp_endpoint: str | None = None  # e.g. http://otel-collector:4318 (OTLP over HTTP)
    metrics_port: int | None = None  # serve Prometheus /metrics on this port


class KubeSettings(_Group, frozen=True, forbid_unknown_fields=True):
    """``mode``: ``auto`` (in-cluster, then kubeconfig, else none), ``none``."""

    mode: Literal["auto", "none", "kubeconfig", "incluster"] = "auto"
    kubeconfig: str | None = None
    context: str | None = None
    request_timeout_s: float = 5.0


class AgentSettings(_Group, frozen=True, forbid_unknown_fields=True):
    node_name: str | None = None
    report_interval_s: float = 10.0
    buffer_max_events: int = 10_000
    vendor_tool_timeout_s: float = 5.0
    measure_acu: bool = True
    measure_timeout_s: float = 120.0  # one benchmark child, for all the devices it measures
    # each device again after this long, at the first poll that finds it idle
    # (a device that slows down in service); 0: once per agent start
    remeasure_interval_s: float = 21_600.0
    fleet_file: str | None = None
    # node-side VRAM backstop (agents/backstopping.py): per-process device memory
    # against each pod's hcs.io/vram-quota; "off" disables it
    vram_backstop_action: Literal["off", "report", "evict", "kill"] = "report"
    vram_backstop_interval_s: float = 10.0
    vram_backstop_slack_mib: int = (
        512  # per process: the driver's context, not seen by the interceptor
    )
    vram_backstop_confirm_sweeps: int = 2  # act after this many sweeps in a row over quota
    proc_root: str = "/proc"  # the host's /proc (hostPID, or a hostPath mount)


class SchedulerSettings(_Group, frozen=True, forbid_unknown_fields=True):
    extender_host: str = "127.0.0.1"
    extender_port: int = 8888
    # HTTPS for the extender (kube-scheduler's tlsConfig); without a pair it
    # serves plain HTTP, and only on a loopback extender_host
    extender_cert_file: str | None = None
    extender_key_file: str | None = None
    # mutual TLS: /filter, /prioritize, /bind, /preempt and /metrics want a
    # client certificate chaining to this CA (required off loopback) ...
    extender_client_ca_file: str | None = None
    # ... whose Common Name or a DNS/URI name is one of these (empty: any it signed)
    extender_client_names: tuple[str, ...] = ()
    # over HTTPS, HTTP/2 for a client that offers it by ALPN (kube-scheduler):
    # its calls share one connection instead of a handshake per parallel bind
    extender_http2: bool = True
    # the read-only console and /api/* on a port of their own, behind a bearer
    # token (console_token, or the first line of console_token_file; none: every
    # request is refused); HTTPS with console_cert_file and console_key_file
    console_host: str = "127.0.0.1"
    console_port: int = 8889
    console_token: str | None = None
    console_token_file: str | None = None
    console_cert_file: str | None = None
    console_key_file: str | None = None
    stale_after_s: float = 35.0
    # a fingerprint claiming a boot later than the server received it by more
    # than this is dead-lettered (hcs_bus.clocks); agents' clocks are not judged
    clock_skew_tolerance_s: float = 30.0
    quota_file: str | None = None
    replica_id: str = ""
    weight_binpack: float = 1.0
    weight_health: float = 1.0
    weight_job_affinity: float = 1.0
    weight_right_size: float = 1.0
    weight_topology: float = 1.0
    reserve_ttl_s: float = 60.0
    pledge_ttl_s: float = 600.0  # an admission's pledge whose pod is never bound expires
    # a pledge whose pod never appears (no pod carries its hcs.io/pledge) is
    # released this long after its admission, and counts against no quota after
    pledge_unclaimed_s: float = 10.0
    # the HCS kube-scheduler Deployment ("namespace/name") whose image version
    # is checked against the API server's (skew policy); "" checks nothing
    kube_scheduler_deployment: str = "hcs-system/hcs-kube-scheduler"
    replan_after_s: float = 30.0  # a pod stranded this long on a full class is re-planned
    stranding_scan_s: float = 2.0  # how often pending HCS pods are looked at
    wake_min_interval_s: float = 5.0  # a parked pod is woken at most this often
    # filter answers only HCS's best node for a pod kube-scheduler's scoring has
    # no preference for (``pods.kube_prefers``): kube-scheduler then skips its
    # scoring and the prioritize call (docs/architecture.md#kubernetes-wire-facts)
    pick_in_filter: bool = True
    # where pods go among what fits: "pack" (the cheapest class that fits, its
    # fullest nodes first: big holes stay whole) or "spread" (the class with
    # the largest free share, its emptiest nodes first: a burst is spread
    # over the fleet, each kubelet starting fewer pods)
    placement: Literal["pack", "spread"] = "pack"
    # the shared pool takes back at most this share of the pool's ACU a
    # minute per replica (whole gangs or an elastic gang's ranks), and asks
    # each victim job to checkpoint first, waiting at most reclaim_checkpoint_s
    reclaim_pool_share_per_min: float = 0.25
    reclaim_checkpoint_s: float = 30.0

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in _redacted_fields(self).items())
        return f"SchedulerSettings({shown})"


class InjectorSettings(_Group, frozen=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8443
    cert_file: str | None = None
    key_file: str | None = None
    # what an admission waits for its plan, cut to the API server's webhook timeout
    # (5 s) less 0.5 s; a replica answers within its own 0.8 s once a request reaches it
    plan_timeout_s: float = 4.0
    failure_policy: Literal["fail-closed", "fail-open"] = "fail-closed"
    scheduler_name: str = "hcs-scheduler"
    interceptor_host_path: str = "/usr/local/hcs/lib"
    max_body_bytes: int = 3 * 1024 * 1024
    service_accounts: tuple[str, ...] = (
        "system:serviceaccount:hcs-system:hcs-scheduler",
        "system:serviceaccount:hcs-system:hcs-injector",
        "system:serviceaccount:hcs-system:hcs-healer",
    )
    # "namespace/name" of the service accounts whose pods HCS places may still
    # run privileged containers or share the host's PID/IPC namespace
    privileged_service_accounts: tuple[
        Annotated[str, msgspec.Meta(pattern=r"^[^/\s]+/[^/\s]+$")], ...
    ] = ()
    # the checkpoint sidecar of a pod that sets hcs.io/checkpoint-dir
    # (injector.sidecars): a native sidecar (an init container with
    # restartPolicy Always, Kubernetes >= 1.28) unless false (a plain extra
    # container, for older clusters); its image and the NATS it reports to
    native_sidecars: bool = True
    checkpoint_image: str = "ghcr.io/hcs-project/hcs-healer:0.1.0"
    checkpoint_bus_url: str = "nats://hcs-nats.hcs-system.svc:4222"


class HealerSettings(_Group, frozen=True, forbid_unknown_fields=True):
    dry_run: bool = False
    breaker_max_fraction: float = 0.10
    breaker_window_s: float = 600.0
    degraded_window_s: float = 60.0
    recovery_window_s: float = 300.0
    checkpoint_wait_s: float = 120.0
    taint_failed_share: float = 0.5  # taint a node once this share of its devices is out (0, 1]
    lease_name: str = "hcs-healer"
    lease_namespace: str = "hcs-system"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


class Settings(_Group, frozen=True, forbid_unknown_fields=True):
    bus: BusSettings = BusSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    kube: KubeSettings = KubeSettings()
    agent: AgentSettings = AgentSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    injector: InjectorSettings = InjectorSettings()
    healer: HealerSettings = HealerSettings()


ENV_PREFIX = "HCS_"


def load(
    *, path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Defaults ← YAML file ← environment. Raises ConfigError naming the field."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = path or env.get("HCS_CONFIG")
    if path:
        raw = _read_yaml(Path(path))
    _overlay_env(raw, env)
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"settings file {path}: top level must be a mapping")
    return data


def _overlay_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    if "NATS_URL" in env:
        raw.setdefault("bus", {})["url"] = env["NATS_URL"]
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        group, _, field = key[len(ENV_PREFIX) :].lower().partition("__")
        if group not in Settings.__struct_fields__:
            continue
        parsed = _env_value(value)
        if isinstance(parsed, str) and isinstance(_default(group, field), tuple):
            parsed = [parsed] if parsed else []  # a list of one, or none
        elif isinstance(parsed, list) and isinstance(_default(group, field), str):
            parsed = value  # a text with commas in it: a NATS server list (bus.url)
        raw.setdefault(group, {})[field] = parsed


def _default(group: str, field: str) -> Any:
    return getattr(getattr(Settings(), group), field, None)


def _env_value(value: str) -> Any:
    if "," in value:
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def redacted(settings: msgspec.Struct) -> dict[str, Any]:
    """Settings (or one group) as plain data with every secret masked."""
    return {
        name: redacted(value) if isinstance(value, msgspec.Struct) else value
        for name, value in _redacted_fields(settings).items()
    }


def _redacted_fields(group: msgspec.Struct) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for name in group.__struct_fields__:
        value = getattr(group, name)
        if value is not None and is_secret_key(name):
            value = MASK
        elif name == "url" and isinstance(value, str):
            value = redact_url(value)
        shown[name] = value
    return shown


def replace(settings: Settings, **groups: Mapping[str, Any]) -> Settings:
    """A copy with some fields of some groups changed (for flags and tests)."""
    raw = msgspec.to_builtins(settings)
    for group, fields in groups.items():
        raw[group].update(fields)
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc
