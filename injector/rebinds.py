"""Opt-in rebinding (``injector/data/rebinding.yaml``): a vendor runtime base
image with the user's code copied in, and per-vendor inference engine builds.

Pure: reads annotations and the config, says what a container becomes.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import yaml

from hcs_bus import vocabulary
from hcs_bus.demands import ContainerRef, DemandError, split_list
from hcs_bus.errors import ConfigError

DATA = Path(__file__).with_name("data")
REBIND = vocabulary.REBIND
ENGINE = vocabulary.ENGINE
FRAMEWORK = vocabulary.FRAMEWORK
CODE_PATH = vocabulary.CODE_PATH
ENGINE_PARAM = vocabulary.ENGINE_PARAM_PREFIX
REBIND_VALUES = ("runtime",)
BUILTIN_PARAMS = ("devices",)
_PARAM = re.compile(r"^[a-z][a-z0-9-]*$")


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CodeConfig(_Strict, frozen=True):
    default_path: str
    copy_dir: str


class RuntimeImages(_Strict, frozen=True):
    default_framework: str
    frameworks: dict[str, dict[str, str]]


class EngineBuild(_Strict, frozen=True):
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    image: str | None = None


class Engine(_Strict, frozen=True):
    vendors: dict[str, EngineBuild]
    params: dict[str, str] = {}


class Rebinding(_Strict, frozen=True):
    code: CodeConfig
    runtimes: RuntimeImages
    engines: dict[str, Engine] = {}


class Choice(NamedTuple):
    runtime: bool
    framework: str
    engine: str | None
    code_path: str
    params: dict[str, str]


class Rebound(NamedTuple):
    """What one container becomes; ``init``/``volume``/``mount`` for the code copy."""

    image: str | None
    command: list[str] | None
    args: list[str] | None
    init: dict[str, Any] | None
    volume: dict[str, Any] | None
    mount: dict[str, Any] | None


def parse(text: str, *, origin: str = "<rebinding>") -> Rebinding:
    try:
        config = msgspec.convert(yaml.safe_load(text), Rebinding, strict=True)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{origin}: {exc}") from exc
    if config.runtimes.default_framework not in config.runtimes.frameworks:
        raise ConfigError(f"{origin}: default_framework is not among frameworks")
    for name, engine in config.engines.items():
        for vendor, build in engine.vendors.items():
            for text_ in (*build.command, *build.args):
                for field in _fields(text_):
                    if field not in engine.params and field not in BUILTIN_PARAMS:
                        raise ConfigError(
                            f"{origin}: engines.{name}.vendors.{vendor}: unknown placeholder "
                            f"{{{field}}} (params: {', '.join(engine.params) or 'none'})"
                        )
    return config


@functools.cache
def load(path: Path | None = None) -> Rebinding:
    path = path or DATA / "rebinding.yaml"
    try:
        return parse(path.read_text(), origin=str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read rebinding config {path}: {exc}") from exc


def _fields(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]


def choose(annotations: Mapping[str, str], config: Rebinding) -> Choice | None:
    """The rebinding a pod opts into, or None. DemandError on unknown values."""
    wanted = split_list(annotations.get(REBIND, ""))
    engine = annotations.get(ENGINE) or None
    if not wanted and engine is None:
        return None
    for value in wanted:
        if value not in REBIND_VALUES:
            raise DemandError(
                f"{REBIND}: unknown value {value!r} (known: {', '.join(REBIND_VALUES)})"
            )
    framework = annotations.get(FRAMEWORK, config.runtimes.default_framework)
    if "runtime" in wanted and framework not in config.runtimes.frameworks:
        known = ", ".join(sorted(config.runtimes.frameworks))
        raise DemandError(f"{FRAMEWORK}: unknown framework {framework!r} (known: {known})")
    if engine is not None and engine not in config.engines:
        known = ", ".join(sorted(config.engines)) or "none"
        raise DemandError(f"{ENGINE}: unknown engine {engine!r} (known: {known})")
    code_path = annotations.get(CODE_PATH, config.code.default_path)
    if not code_path.startswith("/") or code_path == "/":
        raise DemandError(f"{CODE_PATH}: {code_path!r} must be an absolute directory other than /")
    params = dict(config.engines[engine].params) if engine else {}
    for key, value in annotations.items():
        if key.startswith(ENGINE_PARAM):
            name = key[len(ENGINE_PARAM) :]
            if engine is None or name not in params:
                raise DemandError(f"{key}: no such parameter of engine {engine or '(none)'}")
            params[name] = value
    return Choice("runtime" in wanted, framework, engine, code_path, params)


def vendors(choice: Choice, config: Rebinding) -> set[str]:
    """The vendors that have a build for everything ``choice`` asks."""
    found: set[str] | None = None
    if choice.runtime:
        found = set(config.runtimes.frameworks[choice.framework])
    if choice.engine is not None:
        builds = set(config.engines[choice.engine].vendors)
        found = builds if found is None else found & builds
    return found or set()


def restrict(asked: tuple[str, ...], choice: Choice, config: Rebinding) -> tuple[str, ...]:
    """Vendor policy narrowed to the vendors rebinding can serve."""
    able = vendors(choice, config)
    kept = tuple(v for v in asked if v in able) if asked else tuple(sorted(able))
    if not kept:
        raise DemandError(
            f"no vendor both allowed by hcs.io/vendors ({', '.join(asked) or 'any'}) and "
            f"served by the requested rebinding ({', '.join(sorted(able)) or 'none'})"
        )
    return kept


def rebind(
    ref: ContainerRef,
    container: Mapping[str, Any],
    *,
    choice: Choice,
    vendor: str,
    devices: int,
    config: Rebinding,
    init_names: set[str],
) -> Rebound:
    """What container ``ref`` becomes on ``vendor``. KeyError when no build exists."""
    image: str | None = None
    command = args = None
    init = volume = mount = None
    name = f"hcs-code-{ref.index}"
    if choice.runtime and name not in init_names:
        image = config.runtimes.frameworks[choice.framework][vendor]
        init, volume, mount = _code_copy(name, container, choice=choice, config=config)
    if choice.engine is not None:
        build = config.engines[choice.engine].vendors[vendor]
        values = {**choice.params, "devices": str(devices)}
        command = [part.format_map(values) for part in build.command]
        args = [part.format_map(values) for part in build.args]
        image = build.image or image
    return Rebound(image, command, args, init, volume, mount)


def _code_copy(
    name: str, container: Mapping[str, Any], *, choice: Choice, config: Rebinding
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    copy_dir = config.code.copy_dir
    init: dict[str, Any] = {
        "name": name,
        "image": container.get("image", ""),
        "command": ["sh", "-c", 'cp -a "$HCS_CODE_PATH"/. "$HCS_CODE_COPY"/'],
        "env": [
            {"name": "HCS_CODE_PATH", "value": choice.code_path},
            {"name": "HCS_CODE_COPY", "value": copy_dir},
        ],
        "volumeMounts": [{"name": name, "mountPath": copy_dir}],
    }
    if "imagePullPolicy" in container:
        init["imagePullPolicy"] = container["imagePullPolicy"]
    volume = {"name": name, "emptyDir": {}}
    mount = {"name": name, "mountPath": choice.code_path}
    return init, volume, mount
