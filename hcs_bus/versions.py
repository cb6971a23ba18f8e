"""Kubernetes version skew between HCS's kube-scheduler and the API server
(pure). The policy (kubernetes.io/releases/version-skew-policy): kube-scheduler
must not be newer than kube-apiserver and may be at most one minor version
older. The HCS kube-scheduler is a separate Deployment whose image tag is
edited by hand (or by a kustomize ``images:`` override), so a cluster upgrade
easily leaves it behind or ahead; the scheduler checks it at start and then
every few minutes (``scheduler.report.skew_loop``)."""

from __future__ import annotations

import re

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?")


def minor_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of ``v1.30.14``, ``1.30`` or ``v1.30.2-gke.1``; None otherwise."""
    found = _VERSION.match(version.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def image_version(image: str) -> str | None:
    """The tag of ``registry.k8s.io/kube-scheduler:v1.30.14`` (a digest only: None)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def scheduler_skew(*, api_server: str, scheduler_image: str) -> str | None:
    """Why the kube-scheduler image is outside the skew policy against the API
    server's version, or None when it is within it (or cannot be told)."""
    tag = image_version(scheduler_image)
    if tag is None:
        return None
    api, sched = minor_of(api_server), minor_of(tag)
    if api is None or sched is None or api[0] != sched[0]:
        return None
    if sched[1] > api[1]:
        return (
            f"kube-scheduler {tag} is newer than the API server {api_server}: "
            f"set its image to registry.k8s.io/kube-scheduler:v{api[0]}.{api[1]}.x"
        )
    if api[1] - sched[1] > 1:
        return (
            f"kube-scheduler {tag} is {api[1] - sched[1]} minor versions older than the API "
            f"server {api_server} (at most 1 is allowed): set its image to "
            f"registry.k8s.io/kube-scheduler:v{api[0]}.{api[1]}.x"
        )
    return None
