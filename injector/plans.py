"""The plan note a pod carries (``hcs.io/plan``) and its signature.

The note tells bind which class was planned; ``hcs.io/pledge`` names the
pledge the plan made in the ledger (spent once, at bind). The note is signed
(HMAC-SHA256 over namespace, note, the pod's demand, the pledge id and the
pod's name or generateName, ``hcs.io/plan-sig``) so that when the API server
invokes the webhook again (reinvocation) the injector recognises its own
note and does not plan twice, while a note a user wrote, or copied from
another pod, is refused. The note's schema is ``hcs_bus.plannotes``, the
one the scheduler reads.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable

import msgspec

from hcs_bus import plannotes
from hcs_bus.demands import Demand
from hcs_bus.plannotes import PlanNote, encode, note_of
from injector.guarding import PLAN, PLAN_SIG, PLEDGE

__all__ = ["PlanNote", "decode", "encode", "note_annotations", "note_of", "signature", "verified"]

_ENCODER = msgspec.json.Encoder(order="deterministic")  # what the signature covers


def signature(
    text: str, *, namespace: str, demand: Demand, key: bytes, pledge: str = "", pod: str = ""
) -> str:
    digest = _ENCODER.encode((namespace, text, demand.requests, demand.policy, pledge, pod))
    mac = hmac.new(key, digest, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def note_annotations(
    note: PlanNote, *, namespace: str, demand: Demand, key: bytes, pledge: str = "", pod: str = ""
) -> dict[str, str]:
    """``hcs.io/plan``, its signature and (when the plan made one) ``hcs.io/pledge``;
    ``pod`` is the pod's name, or its generateName when it has none."""
    text = encode(note)
    sig = signature(text, namespace=namespace, demand=demand, key=key, pledge=pledge, pod=pod)
    out = {PLAN: text, PLAN_SIG: sig}
    if pledge:
        out[PLEDGE] = pledge
    return out


def verified(
    found: dict[str, str],
    *,
    namespace: str,
    demand: Demand,
    keys: Iterable[bytes],
    pod: str = "",
) -> PlanNote | None:
    """The note in ``found`` if one of ``keys`` signed it for this demand, this
    pledge and this pod (name or generateName), else None."""
    text, sig = found.get(PLAN), found.get(PLAN_SIG)
    if text is None or sig is None:
        return None
    pledge = found.get(PLEDGE, "")
    for key in keys:
        expected = signature(
            text, namespace=namespace, demand=demand, key=key, pledge=pledge, pod=pod
        )
        if hmac.compare_digest(expected, sig):
            return decode(text)
    return None


def decode(text: str) -> PlanNote | None:
    """The note in ``text``, or None when it is not one."""
    try:
        return plannotes.decode(text)
    except msgspec.MsgspecError:
        return None
