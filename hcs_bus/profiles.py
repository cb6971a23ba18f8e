"""The device profile database and compute units (docs/architecture.md#compute-units).

One data file inside the package (``hcs_bus/data/profiles.yaml``) lists each
known accelerator model: VRAM, memory bandwidth, dense peak throughput, the
interconnect, the driver/library paths and env names a container needs, the
PCI ids, and for every number the public page it came from (``sources``) or
an explicit admission that it has none (``unsourced`` plus ``notes``).

Units: ``vram_mib`` in MiB (a datasheet "80 GB" of HBM is 80 GiB = 81920 MiB,
as vendors count it); bandwidths in GB/s (gigabytes per second, as
vendors quote them; interconnect = the total per device); throughput dense,
i.e. without 2:4 sparsity. ``None`` means the device has no such data type or
no published figure (``notes`` says which).

1 ACU (accelerator compute unit) = 1 % of an NVIDIA A100-80G's dense FP16
tensor peak (312 TFLOPS), so an A100-80G is exactly 100 ACU.

Pure: the only I/O is reading the package data file once (or a file given to
``load(path=...)``, for tests and operators' own databases).
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from hcs_bus.errors import ConfigError
from hcs_bus.messages import LinkType

Vendor = Literal["nvidia", "huawei", "hygon", "cambricon", "mthreads", "iluvatar"]
Unit = Literal["tflops-fp16", "tflops-bf16", "tflops-fp32", "acu", "vram"]

REFERENCE_KEY = "nvidia/A100-80G"
REFERENCE_TFLOPS_FP16 = 312.0
UNITS: tuple[str, ...] = ("tflops-fp16", "tflops-bf16", "tflops-fp32", "acu", "vram")
NUMERIC_FIELDS: tuple[str, ...] = (
    "vram_mib",
    "mem_bandwidth_gbps",
    "tflops_fp32",
    "tflops_fp16",
    "tflops_bf16",
    "tops_int8",
    "interconnect_bandwidth_gbps",
    "pci_vendor_id",
    "pci_device_ids",
)
_EPSILON = 1e-9


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """One accelerator model, every number with its source."""

    vendor: Vendor
    model: str
    name: str
    aliases: tuple[str, ...]
    vram_mib: int
    mem_bandwidth_gbps: float
    tflops_fp32: float | None
    tflops_fp16: float
    tflops_bf16: float | None
    tops_int8: float | None
    interconnect: LinkType
    interconnect_bandwidth_gbps: float
    visible_devices_env: str
    driver_paths: tuple[str, ...]
    library_paths: tuple[str, ...]
    pci_vendor_id: int
    pci_device_ids: tuple[int, ...]
    sources: dict[str, str]
    unsourced: tuple[str, ...] = ()
    notes: str = ""
    # What agents.benchmark.measure() achieves on a healthy device of this
    # model; None where nobody has run it on one.
    bench_tflops_fp16: float | None = None

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.model}"

    @property
    def acu(self) -> float:
        return self.tflops_fp16 / REFERENCE_TFLOPS_FP16 * 100.0


class Conversion(msgspec.Struct, frozen=True, kw_only=True):
    """How many target devices serve a request, and the sum that says why."""

    devices: int
    exact: float
    arithmetic: str


# ---------------------------------------------------------------- the file --


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class _VendorEntry(_Strict, frozen=True, kw_only=True):
    """What every model of a vendor shares; a model entry may override it."""

    visible_devices_env: str
    driver_paths: tuple[str, ...]
    library_paths: tuple[str, ...]
    pci_vendor_id: int
    sources: dict[str, str] = {}


class _ModelEntry(_Strict, frozen=True, kw_only=True):
    vendor: Vendor
    model: str
    name: str
    aliases: tuple[str, ...] = ()
    vram_mib: int
    mem_bandwidth_gbps: float
    tflops_fp32: float | None
    tflops_fp16: float
    tflops_bf16: float | None
    tops_int8: float | None
    interconnect: LinkType
    interconnect_bandwidth_gbps: float
    pci_device_ids: tuple[int, ...] = ()
    bench_tflops_fp16: float | None = None
    sources: dict[str, str] = {}
    unsourced: tuple[str, ...] = ()
    notes: str = ""
    visible_devices_env: str | None = None
    driver_paths: tuple[str, ...] | None = None
    library_paths: tuple[str, ...] | None = None


class _File(_Strict, frozen=True, kw_only=True):
    version: Literal[1]
    vendors: dict[Vendor, _VendorEntry]
    profiles: tuple[_ModelEntry, ...]


# ---------------------------------------------------------------- the db ----


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


_PREFIXES = (
    "nvidia",
    "tesla",
    "huawei",
    "ascend",
    "hygon",
    "cambricon",
    "moorethreads",
    "mthreads",
    "mtt",
    "iluvatar",
)


def _stripped(norm: str) -> str:
    for prefix in _PREFIXES:
        if norm.startswith(prefix) and len(norm) > len(prefix):
            return _stripped(norm[len(prefix) :])
    return norm


class ProfileDB:
    """All known profiles, by key, by tool-reported name and by PCI id."""

    def __init__(self, profiles: Iterable[Profile]) -> None:
        self._by_key: dict[str, Profile] = {}
        self._by_name: dict[tuple[str, str], tuple[Profile, str]] = {}
        self._by_pci: dict[tuple[int, int], list[Profile]] = {}
        for profile in profiles:
            self._add(profile)

    def _add(self, profile: Profile) -> None:
        if profile.key in self._by_key:
            raise ConfigError(f"profile {profile.key}: listed twice")
        self._by_key[profile.key] = profile
        for name in (profile.model, profile.name, *profile.aliases):
            for form in {_norm(name), _stripped(_norm(name))}:
                other, other_name = self._by_name.setdefault(
                    (profile.vendor, form), (profile, name)
                )
                if other is not profile:
                    raise ConfigError(
                        f"profile {profile.key}: name {name!r} is the same to match() as "
                        f"{other.key}'s {other_name!r}"
                    )
        for device_id in profile.pci_device_ids:
            self._by_pci.setdefault((profile.pci_vendor_id, device_id), []).append(profile)

    def find(self, key: str) -> Profile | None:
        """A profile by ``vendor/model``, or None."""
        return self._by_key.get(key)

    def get(self, key: str) -> Profile:
        """A profile by ``vendor/model``; KeyError naming the close ones."""
        found = self.find(key)
        if found is not None:
            return found
        close = difflib.get_close_matches(key, self._by_key, n=5, cutoff=0.4)
        if not close:
            close = [k for k in self._by_key if key.split("/")[0] == k.split("/")[0]][:8]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown device profile {key!r} (keys are vendor/model){hint}")

    def all(self) -> tuple[Profile, ...]:
        return tuple(self._by_key.values())

    def match(self, vendor: str | None, name: str) -> Profile | None:
        """The profile a tool-reported name (NVML, npu-smi, hy-smi, cnmon…) means.

        Case, spaces, hyphens and underscores do not matter, nor a leading
        vendor word ("NVIDIA", "Tesla", "Ascend"…). ``vendor=None`` searches all.
        """
        norm = _norm(name)
        vendors = [vendor.lower()] if vendor else sorted({v for v, _ in self._by_name})
        for form in (norm, _stripped(norm)):
            for v in vendors:
                found = self._by_name.get((v, form))
                if found is not None:
                    return found[0]
        return None

    def by_pci(self, vendor_id: int | str, device_id: int | str) -> Profile | None:
        """By PCI ids as ints or as sysfs writes them (``"0x10de"``).

        ``None`` when unknown or ambiguous: several SKUs share one device id
        (every Ascend 910B variant is 19e5:d802); ``match`` by name decides those.
        """
        found = self.all_by_pci(vendor_id, device_id)
        return found[0] if len(found) == 1 else None

    def all_by_pci(self, vendor_id: int | str, device_id: int | str) -> tuple[Profile, ...]:
        """Every profile carrying this PCI id."""
        return tuple(self._by_pci.get((_pci_int(vendor_id), _pci_int(device_id)), ()))


def _pci_int(value: int | str) -> int:
    return value if isinstance(value, int) else int(value.strip(), 16)


# ---------------------------------------------------------------- loading ---


def load(path: str | Path | None = None) -> ProfileDB:
    """The profile database: the package's own (cached) or the file at ``path``."""
    if path is None:
        return _packaged()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"profile database {path}: cannot read: {exc}") from exc
    return parse(text, origin=str(path))


@functools.cache
def _packaged() -> ProfileDB:
    data = resources.files("hcs_bus") / "data" / "profiles.yaml"
    return parse(data.read_text(encoding="utf-8"), origin="hcs_bus/data/profiles.yaml")


def parse(text: str, *, origin: str = "<profiles>") -> ProfileDB:
    """Decode a profile database strictly; ConfigError names model and field."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not YAML: {exc}") from exc
    try:
        file = msgspec.convert(raw, type=_File, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{origin}: {_where(raw, str(exc))}") from exc
    db = ProfileDB(_build(file, entry) for entry in file.profiles)
    _check_reference(db)
    return db


def _where(raw: Any, message: str) -> str:
    """Put the model's name in front of msgspec's ``$.profiles[3].field`` path."""
    found = re.search(r"\$\.profiles\[(\d+)\]", message)
    if not found or not isinstance(raw, dict):
        return message
    try:
        entry = raw["profiles"][int(found.group(1))]
        name = f"{entry.get('vendor')}/{entry.get('model')}"
    except (KeyError, IndexError, TypeError, AttributeError):
        return message
    return f"profile {name}: {message}"


def _build(file: _File, entry: _ModelEntry) -> Profile:
    key = f"{entry.vendor}/{entry.model}"
    vendor = file.vendors.get(entry.vendor)
    if vendor is None:
        raise ConfigError(f"profile {key}: vendor {entry.vendor!r} has no entry under vendors")
    sources = {**vendor.sources, **entry.sources}
    profile = Profile(
        vendor=entry.vendor,
        model=entry.model,
        name=entry.name,
        aliases=entry.aliases,
        vram_mib=entry.vram_mib,
        mem_bandwidth_gbps=entry.mem_bandwidth_gbps,
        tflops_fp32=entry.tflops_fp32,
        tflops_fp16=entry.tflops_fp16,
        tflops_bf16=entry.tflops_bf16,
        tops_int8=entry.tops_int8,
        interconnect=entry.interconnect,
        interconnect_bandwidth_gbps=entry.interconnect_bandwidth_gbps,
        visible_devices_env=entry.visible_devices_env or vendor.visible_devices_env,
        driver_paths=_pick(entry.driver_paths, vendor.driver_paths),
        library_paths=_pick(entry.library_paths, vendor.library_paths),
        pci_vendor_id=vendor.pci_vendor_id,
        pci_device_ids=entry.pci_device_ids,
        sources=sources,
        unsourced=entry.unsourced,
        notes=entry.notes,
        bench_tflops_fp16=entry.bench_tflops_fp16,
    )
    _check_profile(profile)
    return profile


def _pick(own: tuple[str, ...] | None, shared: tuple[str, ...]) -> tuple[str, ...]:
    return shared if own is None else own


def _check_profile(profile: Profile) -> None:
    key = profile.key
    for field in (*profile.sources, *profile.unsourced):
        if field not in Profile.__struct_fields__:
            raise ConfigError(f"profile {key}: sources/unsourced name unknown field {field!r}")
    for field, url in profile.sources.items():
        if not url.startswith(("https://", "http://")):
            raise ConfigError(f"profile {key}: sources.{field} is not a URL: {url!r}")
    for field in NUMERIC_FIELDS:
        if field not in profile.sources and field not in profile.unsourced:
            raise ConfigError(f"profile {key}: {field} has neither a source nor an unsourced mark")
        if field in profile.unsourced and not profile.notes:
            raise ConfigError(f"profile {key}: {field} is unsourced but notes do not say why")
    for field in ("vram_mib", "mem_bandwidth_gbps", "tflops_fp16"):
        if getattr(profile, field) <= 0:
            raise ConfigError(f"profile {key}: {field} must be positive")
    bench = profile.bench_tflops_fp16
    if bench is not None:
        if (
            "bench_tflops_fp16" not in profile.sources
            and "bench_tflops_fp16" not in profile.unsourced
        ):
            raise ConfigError(
                f"profile {key}: bench_tflops_fp16 has neither a source nor an unsourced mark"
            )
        if not 0 < bench <= profile.tflops_fp16:
            raise ConfigError(
                f"profile {key}: bench_tflops_fp16 must be positive and at most the peak "
                f"tflops_fp16 {profile.tflops_fp16}, got {bench}"
            )


def _check_reference(db: ProfileDB) -> None:
    try:
        reference = db.get(REFERENCE_KEY)
    except KeyError as exc:
        raise ConfigError(f"profile database lacks the ACU reference {REFERENCE_KEY}") from exc
    if reference.tflops_fp16 != REFERENCE_TFLOPS_FP16:
        raise ConfigError(
            f"profile {REFERENCE_KEY}: tflops_fp16 must be {REFERENCE_TFLOPS_FP16} "
            f"(it defines 100 ACU), got {reference.tflops_fp16}"
        )


# ---------------------------------------------------------------- conversion


def equivalent(source: Profile, count: int, target: Profile) -> Conversion:
    """How many ``target`` devices match ``count`` × ``source`` in both ACU and VRAM."""
    if count < 0:
        raise ValueError(f"device count must be >= 0, got {count}")
    by_acu = count * source.acu / target.acu
    by_vram = count * source.vram_mib / target.vram_mib
    exact = max(by_acu, by_vram)
    devices = _ceil(exact)
    arithmetic = (
        f"{count} × {source.key} = {count * source.acu:.1f} ACU, {count * source.vram_mib} MiB; "
        f"{target.key} = {target.acu:.1f} ACU, {target.vram_mib} MiB each "
        f"→ ACU needs {by_acu:.2f}, VRAM needs {by_vram:.2f} → {_devices(devices)}"
    )
    return Conversion(devices=devices, exact=exact, arithmetic=arithmetic)


_UNIT_LABEL = {
    "tflops-fp16": ("TFLOPS FP16", "tflops_fp16"),
    "tflops-bf16": ("TFLOPS BF16", "tflops_bf16"),
    "tflops-fp32": ("TFLOPS FP32", "tflops_fp32"),
    "acu": ("ACU", "acu"),
    "vram": ("MiB", "vram_mib"),
}


def convert_amount(amount: float, unit: str, target: Profile) -> Conversion:
    """How many ``target`` devices supply ``amount`` of ``unit`` (vram in MiB)."""
    if unit not in _UNIT_LABEL:
        raise ValueError(f"unknown unit {unit!r}; expected one of {', '.join(UNITS)}")
    if amount < 0 or not math.isfinite(amount):
        raise ValueError(f"amount of {unit} must be a finite number >= 0, got {amount}")
    label, attribute = _UNIT_LABEL[unit]
    each = getattr(target, attribute)
    if not each:
        raise ValueError(f"{target.key} has no {label} figure (see its notes: {target.notes})")
    exact = amount / each
    devices = _ceil(exact)
    arithmetic = (
        f"{_num(amount)} {label}; {target.key} = {_num(each)} {label} each "
        f"→ {exact:.2f} → {_devices(devices)}"
    )
    return Conversion(devices=devices, exact=exact, arithmetic=arithmetic)


def _ceil(value: float) -> int:
    """Round up, forgiving float noise (2.0000000001 is 2 devices, not 3)."""
    return math.ceil(value - _EPSILON) if value > _EPSILON else 0


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"


def _num(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"
