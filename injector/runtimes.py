"""Vendor runtime profiles (``injector/data/runtimes.yaml``), decoded strictly.

What the injector puts into a pod for each vendor: RuntimeClass, the env names
that carry the visible devices, how the device nodes get into the container
(``devices``), driver hostPath mounts, library paths, static env and env taken
from reserved ``hcs.io/*`` annotations (downward API).

``devices.via``:

- ``runtime``: the RuntimeClass's container runtime reads the visible-devices
  env (its value resolved from ``hcs.io/devices`` when the container starts,
  after bind) and adds those device nodes and their device-cgroup rules, as
  nvidia-container-runtime and Ascend Docker Runtime do;
- ``host-path``: every device node of the vendor (``nodes``) is mounted from
  the host into each asking container and the visible-devices env narrows the
  vendor library to the bound devices. The device cgroup must admit those
  nodes: that is the node's runtime handler's job (named by ``runtime_class``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

import msgspec
import yaml

from hcs_bus.errors import ConfigError
from injector import guarding

DATA = Path(__file__).with_name("data")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

HostPathType = Literal["Directory", "File", "DirectoryOrCreate", "FileOrCreate", ""]
DeviceVia = Literal["runtime", "host-path"]
DeviceNodeType = Literal["CharDevice", "Directory"]


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Mount(_Strict, frozen=True):
    name: str
    host_path: str
    mount_path: str
    type: HostPathType = "Directory"


class DeviceNode(_Strict, frozen=True):
    """A host device node (or a folder of them, ``/dev/dri``) mounted at its own path."""

    name: str
    path: str
    type: DeviceNodeType = "CharDevice"


class Devices(_Strict, frozen=True):
    via: DeviceVia
    nodes: tuple[DeviceNode, ...] = ()


class VendorRuntime(_Strict, frozen=True):
    visible_devices_env: tuple[str, ...]
    devices: Devices
    runtime_class: str | None = None
    library_paths: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = {}
    annotation_env: dict[str, str] = {}


class Interceptor(_Strict, frozen=True):
    library: str
    mount_path: str
    shm_dir: str
    shm_file: str
    shm_size_limit: str = "16Mi"
    # a pod with one asking container, in its own IPC namespace: the ledger
    # sits in the pod's /dev/shm, no volume (None: always the emptyDir)
    ipc_shm_path: str | None = None

    @property
    def library_path(self) -> str:
        return f"{self.mount_path.rstrip('/')}/{self.library}"

    @property
    def shm_path(self) -> str:
        return f"{self.shm_dir.rstrip('/')}/{self.shm_file}"


class Runtimes(_Strict, frozen=True):
    interceptor: Interceptor
    vendors: dict[str, VendorRuntime]
    common_annotation_env: dict[str, str] = {}

    def vendor(self, name: str) -> VendorRuntime:
        found = self.vendors.get(name)
        if found is None:
            known = ", ".join(sorted(self.vendors))
            raise KeyError(f"no runtime profile for vendor {name!r} (known: {known})")
        return found


def parse(text: str, *, origin: str = "<runtimes>") -> Runtimes:
    """Decode and check a runtimes file; ConfigError names the problem."""
    try:
        raw = yaml.safe_load(text)
        runtimes = msgspec.convert(raw, Runtimes, strict=True)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{origin}: {exc}") from exc
    _check(runtimes, origin=origin)
    return runtimes


@functools.cache
def load(path: Path | None = None) -> Runtimes:
    path = path or DATA / "runtimes.yaml"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read runtime profiles {path}: {exc}") from exc
    return parse(text, origin=str(path))


def _check(runtimes: Runtimes, *, origin: str) -> None:
    problems: list[str] = []
    _check_env(runtimes.common_annotation_env, "common_annotation_env", problems)
    for vendor, profile in runtimes.vendors.items():
        where = f"vendors.{vendor}"
        if not profile.visible_devices_env:
            problems.append(f"{where}.visible_devices_env is empty")
        for name in profile.visible_devices_env:
            if not _ENV_NAME.match(name):
                problems.append(f"{where}.visible_devices_env: {name!r} is not an env name")
        _check_env(profile.annotation_env, f"{where}.annotation_env", problems)
        for mount in profile.mounts:
            if not (_DNS_LABEL.match(mount.name) and mount.name.startswith("hcs-")):
                problems.append(f"{where}.mounts: name {mount.name!r} must be a DNS label hcs-…")
            if not (mount.host_path.startswith("/") and mount.mount_path.startswith("/")):
                problems.append(f"{where}.mounts.{mount.name}: paths must be absolute")
        _check_devices(profile, where=f"{where}.devices", problems=problems)
    if problems:
        raise ConfigError(f"{origin}: " + "; ".join(problems))


def _check_devices(profile: VendorRuntime, *, where: str, problems: list[str]) -> None:
    devices = profile.devices
    if devices.via == "runtime":
        if not profile.runtime_class:
            problems.append(f"{where}: via runtime needs the runtime_class whose runtime adds them")
        if devices.nodes:
            problems.append(f"{where}: via runtime takes no nodes (the runtime adds them)")
        return
    if not devices.nodes:
        problems.append(f"{where}: via host-path needs the device nodes to mount")
    for node in devices.nodes:
        if not (_DNS_LABEL.match(node.name) and node.name.startswith("hcs-")):
            problems.append(f"{where}.nodes: name {node.name!r} must be a DNS label hcs-…")
        if not node.path.startswith("/dev/"):
            problems.append(f"{where}.nodes.{node.name}: {node.path!r} is not under /dev/")


def _check_env(mapping: dict[str, str], where: str, problems: list[str]) -> None:
    for name, annotation in mapping.items():
        if not _ENV_NAME.match(name):
            problems.append(f"{where}: {name!r} is not an env name")
        if not guarding.is_reserved(annotation):
            problems.append(
                f"{where}.{name}: {annotation!r} is not a reserved hcs.io/* annotation "
                "(env from a user-settable annotation would let users pick devices)"
            )
