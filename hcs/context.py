"""Where the running ``hcs up`` is, for every other ``hcs`` command.

Like kubeconfig's current context: ``hcs up`` writes its bus URL, its
endpoints, the console's token and its logs folder to one per-user file, and
a command given no ``--nats-url`` (nor ``HCS_BUS__URL``) talks to that bus.
The file is ``$HCS_CONTEXT``, else ``$XDG_STATE_HOME/hcs/context.json``, else
``~/.local/state/hcs/context.json`` (mode 0600: it holds the console token).
``hcs up`` removes it when it stops; one whose process is gone (killed
outright) is stale and ignored.

``hcs up``'s logs are kept beside it, in ``logs/<start time>/``, and survive
the run.
"""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path

import msgspec

from hcs_bus.errors import ConfigError

ENV = "HCS_CONTEXT"
KEEP_LOG_RUNS = 20  # older runs' log folders are removed when a new run starts


class Context(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One running ``hcs up``."""

    bus_url: str
    pid: int
    started: str  # ISO 8601, UTC
    extender_url: str = ""
    webhook_url: str = ""
    console_url: str = ""
    console_token: str = ""
    logs: str = ""
    metrics: dict[str, str] = {}
    v: int = 1


def state_home() -> Path:
    """``$XDG_STATE_HOME/hcs``, else ``~/.local/state/hcs``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hcs"


def path() -> Path:
    return Path(os.environ.get(ENV) or state_home() / "context.json")


def write(context: Context) -> Path:
    """Write the context (0600, replaced whole, never half-written)."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(msgspec.json.format(msgspec.json.encode(context)))
    os.replace(partial, target)
    return target


def read() -> Context | None:
    """The running ``hcs up``'s context; None when there is none or it is stale."""
    target = path()
    try:
        raw = target.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{target}: cannot read the hcs context: {exc.strerror}") from exc
    try:
        context = msgspec.json.decode(raw, type=Context)
    except msgspec.DecodeError as exc:
        raise ConfigError(
            f"{target}: not an hcs context ({exc}); remove it or point {ENV} elsewhere"
        ) from exc
    return context if _alive(context.pid) else None


def remove(*, pid: int) -> None:
    """Remove the context if it is still the one process ``pid`` wrote."""
    target = path()
    try:
        context = msgspec.json.decode(target.read_bytes(), type=Context)
    except (OSError, msgspec.DecodeError):
        return
    if context.pid == pid:
        target.unlink(missing_ok=True)


def new_logs_dir(*, now: datetime.datetime) -> Path:
    """A fresh ``logs/<time>/`` folder in the state home; old runs pruned."""
    logs = state_home() / "logs"
    folder = logs / now.strftime("%Y%m%dT%H%M%S")
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = logs / f"{now.strftime('%Y%m%dT%H%M%S')}-{suffix}"
    folder.mkdir(parents=True)
    for old in sorted(p for p in logs.iterdir() if p.is_dir())[:-KEEP_LOG_RUNS]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True
