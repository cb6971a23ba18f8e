"""``admission.k8s.io/v1`` AdmissionReview: decode the envelope, build answers.

The envelope is decoded with msgspec; the pod stays raw bytes (``msgspec.Raw``)
until it must be read, so a pass-through answer costs one small decode. The
API server may add fields in later versions, so unknown fields are ignored.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Final, NamedTuple

import msgspec

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
_UID = re.compile(rb'"uid"\s*:\s*"([^"\\]{1,128})"')
_NULL = msgspec.Raw(b"null")


class BadReview(ValueError):
    """Not an AdmissionReview we can answer: HTTP 400 with this text."""

    def __init__(self, message: str, *, uid: str | None = None) -> None:
        super().__init__(f"{message} (uid {uid})" if uid else message)
        self.uid = uid


class _Lenient(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class GroupVersionKind(_Lenient, frozen=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Lenient, frozen=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Lenient, frozen=True):
    username: str = ""
    groups: list[str] | None = None


class Request(_Lenient, frozen=True):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: str
    user_info: UserInfo = UserInfo()
    namespace: str = ""
    name: str = ""
    sub_resource: str = ""
    dry_run: bool | None = False
    object: msgspec.Raw = _NULL
    old_object: msgspec.Raw = _NULL


class Review(_Lenient, frozen=True):
    api_version: str = ""
    kind: str = ""
    request: Request | None = None


_DECODER = msgspec.json.Decoder(Review)
_ENCODER = msgspec.json.Encoder()


def decode(body: bytes) -> Request:
    """The request inside ``body``; BadReview naming what is wrong."""
    try:
        review = _DECODER.decode(body)
    except msgspec.ValidationError as exc:  # a DecodeError subclass: first
        raise BadReview(f"not an AdmissionReview: {exc}", uid=_uid(body)) from exc
    except msgspec.DecodeError as exc:
        raise BadReview(f"malformed JSON: {exc}", uid=_uid(body)) from exc
    except (ValueError, RecursionError) as exc:  # msgspec lets these out on hostile bytes
        raise BadReview(f"malformed JSON: {exc!r:.200}", uid=_uid(body)) from exc
    uid = review.request.uid if review.request else _uid(body)
    if review.kind != KIND:
        raise BadReview(f"kind must be {KIND}, got {review.kind!r}", uid=uid)
    if review.api_version != API_VERSION:
        raise BadReview(f"apiVersion must be {API_VERSION}, got {review.api_version!r}", uid=uid)
    request = review.request
    if request is None:
        raise BadReview("AdmissionReview has no request")
    if not request.uid:
        raise BadReview("request.uid is empty")
    if (request.kind.group, request.kind.kind) != ("", "Pod") or (
        request.resource.resource != "pods" or request.sub_resource
    ):
        what = f"{request.kind.group or 'core'}/{request.kind.kind} " + "/".join(
            p for p in (request.resource.resource, request.sub_resource) if p
        )
        raise BadReview(f"only pods are handled, got {what}", uid=uid)
    return request


def _uid(body: bytes) -> str | None:
    match = _UID.search(body[:65536])
    return match.group(1).decode(errors="replace") if match else None


class Answer(NamedTuple):
    """What to send back: HTTP status and body, plus labels for metrics
    (``result``; ``reason`` for a refusal) and whether to close the connection."""

    status: int
    body: bytes
    result: str
    content_type: str = "application/json"
    reason: str = ""
    close: bool = False


def _review(response: dict[str, Any]) -> bytes:
    return _ENCODER.encode({"apiVersion": API_VERSION, "kind": KIND, "response": response})


def allow(
    uid: str, *, ops: list[dict[str, Any]] | None = None, warnings: list[str] | None = None
) -> Answer:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(_ENCODER.encode(ops)).decode()
    if warnings:
        response["warnings"] = warnings
    return Answer(200, _review(response), "patched" if ops else "allowed")


_REASONS = {400: "BadRequest", 403: "Forbidden", 422: "Invalid", 503: "ServiceUnavailable"}


def deny(
    uid: str,
    message: str,
    *,
    reason: str,
    code: int = 403,
    warnings: list[str] | None = None,
) -> Answer:
    """A refusal; ``reason`` labels it in the refusal counter."""
    status = {"code": code, "reason": _REASONS.get(code, "Forbidden"), "message": message}
    response: dict[str, Any] = {"uid": uid, "allowed": False, "status": status}
    if warnings:
        response["warnings"] = warnings
    return Answer(200, _review(response), "denied", reason=reason)


def bad(error: BadReview) -> Answer:
    return Answer(400, f"{error}\n".encode(), "bad_request", "text/plain", reason="bad_review")
