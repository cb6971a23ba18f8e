"""The pod as its user submitted it, kept on the pod for re-creation
(``hcs.io/submitted``), written only when it carries ``hcs.io/replan: recreate``.

Pure (no I/O). Why keep a copy: the mutated pod cannot be turned back into
the submitted one. Env the user set is replaced or merged (LD_PRELOAD,
LD_LIBRARY_PATH, a ``valueFrom`` renamed ``HCS_USER_*``), a user's
runtimeClassName or schedulerName is overwritten, the class affinity is
ANDed into the user's own terms, and a rebinding swaps image and command;
none of that leaves a trace of what was there before.

Kept: the spec as the webhook first sees it (defaults applied), less what
the API server fills in again on create and refuses to see twice (the
service-account token volume and its mounts, ``priority``), and the user's
``hcs.io/*`` annotations (which ones are the user's is the injector's
knowledge; every other annotation the scheduler reads from the pod itself).

The value is compact JSON with an HMAC (the plan key) over namespace, pod
name (or generateName) and the content: the annotation is reserved, and on
reinvocation the injector keeps only a copy it made itself for this pod.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from hcs_bus import vocabulary
from injector import guarding

SUBMITTED: Final = vocabulary.SUBMITTED
MAX_CHARS: Final = 64 * 1024  # of 256 KiB for all annotations of a pod
TOKEN_VOLUME_PREFIX: Final = "kube-api-access-"
SERVER_FIELDS: Final = ("priority", "nodeName")


class Submitted(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``hcs.io/submitted``: version 1."""

    v: int = 1
    annotations: dict[str, str]
    spec: dict[str, Any]
    mac: str = ""


_ENCODER = msgspec.json.Encoder(order="deterministic")
_DECODER = msgspec.json.Decoder(Submitted)


def wanted(annotations: Mapping[str, str]) -> bool:
    """The pod asks to be re-created when stranded."""
    return annotations.get(vocabulary.REPLAN) == vocabulary.REPLAN_RECREATE


def record(pod: Mapping[str, Any], *, namespace: str, name: str, key: bytes) -> str | None:
    """The ``hcs.io/submitted`` value for ``pod`` (not yet mutated), or None
    when it would be larger than ``MAX_CHARS``."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    notes = {
        k: str(v)
        for k, v in annotations.items()
        if k.startswith(vocabulary.PREFIX) and not guarding.is_reserved(k)
    }
    content = Submitted(annotations=notes, spec=_submitted_spec(pod.get("spec") or {}))
    mac = _mac(content, namespace=namespace, name=name, key=key)
    text = _ENCODER.encode(msgspec.structs.replace(content, mac=mac)).decode()
    return text if len(text) <= MAX_CHARS else None


def verified(
    annotations: Mapping[str, str], *, namespace: str, name: str, keys: Iterable[bytes]
) -> bool:
    """``annotations`` hold an ``hcs.io/submitted`` one of ``keys`` signed for this pod."""
    text = annotations.get(SUBMITTED)
    if text is None:
        return False
    try:
        found = _DECODER.decode(text)
    except msgspec.MsgspecError:
        return False
    content = msgspec.structs.replace(found, mac="")
    return any(
        hmac.compare_digest(found.mac, _mac(content, namespace=namespace, name=name, key=key))
        for key in keys
    )


def _mac(content: Submitted, *, namespace: str, name: str, key: bytes) -> str:
    digest = _ENCODER.encode((namespace, name, content))
    mac = hmac.new(key, digest, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _submitted_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(spec))
    for name in SERVER_FIELDS:
        out.pop(name, None)
    tokens = {
        v.get("name")
        for v in out.get("volumes") or []
        if isinstance(v, dict)
        and str(v.get("name", "")).startswith(TOKEN_VOLUME_PREFIX)
        and "projected" in v
    }
    if not tokens:
        return out
    out["volumes"] = [v for v in out["volumes"] if v.get("name") not in tokens]
    if not out["volumes"]:
        del out["volumes"]
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in out.get(field) or []:
            mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") not in tokens]
            if mounts:
                container["volumeMounts"] = mounts
            else:
                container.pop("volumeMounts", None)
    return out
