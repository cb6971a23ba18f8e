"""The plumbing under ``hcs_bus.kube``: one wrapped call, the error mapping and
client configuration.

Every request goes out with ``_preload_content=False`` and we decode the JSON
body ourselves: the generated deserialisers choke on some real answers (the
Binding call answers a ``Status``, not a ``V1Binding``) and we hand plain
dicts to the parts anyway.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import aiohttp
import msgspec
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.client.exceptions import ApiException, ApiTypeError, ApiValueError
from kubernetes_asyncio.config.config_exception import ConfigException

from hcs_bus.errors import (
    ConfigError,
    KubeConflict,
    KubeError,
    KubeInvalid,
    KubeNotFound,
    KubeTooManyRequests,
    KubeUnavailable,
)
from hcs_bus.settings import KubeSettings

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

_JSON = msgspec.json.Decoder()  # answers decoded once, faster than json.loads
_BY_STATUS: dict[int, type[KubeError]] = {
    400: KubeInvalid,
    404: KubeNotFound,
    409: KubeConflict,
    422: KubeInvalid,
    429: KubeTooManyRequests,
    502: KubeUnavailable,
    503: KubeUnavailable,
    504: KubeUnavailable,
}

Caller = Callable[..., Awaitable[Any]]


async def call(
    what: str,
    fn: Caller,
    /,
    *args: Any,
    timeout_s: float,
    decoder: msgspec.json.Decoder[Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Run one generated API method; return its decoded JSON body (a dict,
    or what ``decoder`` makes of a successful one).

    Raises the ``hcs_bus.errors`` Kube* type for the HTTP status, chained
    from the third-party error.
    """
    try:
        resp = await fn(*args, _preload_content=False, _request_timeout=timeout_s, **kwargs)
        try:
            raw = await resp.read()
            status = int(resp.status)
            reason = str(resp.reason or "")
        finally:
            resp.release()
    except (ApiTypeError, ApiValueError) as exc:
        raise KubeInvalid(f"{what}: bad arguments: {exc}") from exc
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise KubeUnavailable(f"{what}: API server unreachable: {exc!r}") from exc
    if decoder is not None and status < 300:
        try:
            return decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise KubeError(f"{what}: answer is not what was asked: {raw[:200]!r}") from exc
    body = decode(raw, what=what)
    if status >= 300:
        raise_status(what, status=status, reason=reason, body=body)
    return body


def decode(raw: bytes, *, what: str) -> Any:
    if not raw:
        return {}
    try:
        return _JSON.decode(raw)
    except msgspec.DecodeError as exc:
        raise KubeError(f"{what}: answer is not JSON: {raw[:200]!r}") from exc


def raise_status(what: str, *, status: int, reason: str, body: Any) -> NoReturn:
    """Raise the Kube* error for an HTTP status and its ``Status`` body."""
    message = body.get("message") if isinstance(body, dict) else None
    cls = _BY_STATUS.get(status, KubeError)
    cause = ApiException(status=status, reason=reason)
    cause.body = json.dumps(body).encode()
    raise cls(f"{what}: HTTP {status} {reason}: {message or body}", status=status) from cause


def status_error(what: str, exc: ApiException) -> KubeError:
    """The Kube* error for an ``ApiException`` raised inside a watch stream."""
    status = int(exc.status or 0)
    cls = _BY_STATUS.get(status, KubeError)
    return cls(f"{what}: HTTP {status}: {exc.reason}", status=status)


def configuration_for_url(url: str) -> Configuration:
    """A plain, unauthenticated configuration (tests, ``kubectl proxy``)."""
    cfg = Configuration(host=url.rstrip("/"))
    return cfg


async def load_configuration(settings: KubeSettings) -> Configuration | None:
    """The client configuration ``settings.mode`` asks for; None when none applies."""
    if settings.mode == "none":
        return None
    if settings.mode == "incluster" or (
        settings.mode == "auto" and os.environ.get("KUBERNETES_SERVICE_HOST")
    ):
        return _incluster()
    paths = settings.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not _any_exists(paths):
        if settings.mode == "kubeconfig":
            raise ConfigError(f"kube.kubeconfig: no kubeconfig file at {paths!r}")
        return None
    cfg = Configuration()
    try:
        await kube_config.load_kube_config(
            config_file=paths,
            context=settings.context,
            client_configuration=cfg,
            persist_config=False,
        )
    except (ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"kube.kubeconfig {paths!r}: {exc}") from exc
    return cfg


def _any_exists(paths: str) -> bool:
    """Whether one of the ``os.pathsep``-separated kubeconfig paths exists."""
    return any(os.path.exists(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p)


def _incluster() -> Configuration:
    cfg = Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=cfg)
    except ConfigException as exc:
        raise ConfigError(f"kube.mode incluster: {exc}") from exc
    return cfg
