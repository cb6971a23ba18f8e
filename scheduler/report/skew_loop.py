"""The HCS kube-scheduler's version against the API server's, checked at
start and every ``every_s`` (``hcs_bus.versions``: the skew policy). Outside
the policy: one error line naming both versions and the image to set, each
time the verdict changes, and the gauge ``hcs_kube_scheduler_skew`` at 1.
Nothing is refused: kube-scheduler runs as its Deployment says."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from hcs_bus import versions
from hcs_bus.errors import HcsError
from hcs_bus.telemetry import logger, meter

_log = logger("hcs.scheduler.skew")
_skewed: dict[str, int] = {}
meter("hcs.scheduler").create_observable_gauge(
    "hcs_kube_scheduler_skew",
    callbacks=[lambda _options: _observations()],
    description="1 while the HCS kube-scheduler's version is outside the skew policy",
)


def _observations() -> list[Any]:
    from opentelemetry.metrics import Observation

    return [Observation(v, {"deployment": k}) for k, v in _skewed.items()]


class Kube(Protocol):
    async def get_version(self) -> str: ...

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any]: ...


def scheduler_image(deployment: dict[str, Any]) -> str:
    """The image of the Deployment's ``kube-scheduler`` container (else its first)."""
    containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    found = containers.get("containers") or []
    named = [c for c in found if c.get("name") == "kube-scheduler"] or found
    return str(named[0].get("image") or "") if named else ""


async def check(kube: Kube, *, deployment: str) -> str | None:
    """One check of ``deployment`` (``namespace/name``): the skew, or None."""
    namespace, _, name = deployment.partition("/")
    try:
        api = await kube.get_version()
        image = scheduler_image(await kube.get_deployment(namespace, name))
    except HcsError as exc:
        _log.info("kube_scheduler_version_unknown", deployment=deployment, error=str(exc))
        return None
    problem = versions.scheduler_skew(api_server=api, scheduler_image=image)
    was = _skewed.get(deployment)
    _skewed[deployment] = 1 if problem else 0
    if problem and was != 1:
        _log.error("kube_scheduler_version_skew", deployment=deployment, problem=problem)
    return problem


async def skew_loop(kube: Kube, *, deployment: str, every_s: float = 600.0) -> None:
    """Check now and every ``every_s``."""
    while True:
        await check(kube, deployment=deployment)
        await asyncio.sleep(every_s)
