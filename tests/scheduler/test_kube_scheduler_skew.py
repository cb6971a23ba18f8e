"""The HCS kube-scheduler's image against the API server's version: the skew
policy (never newer, at most one minor older), said once with the fix."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from hcs_bus import versions
from hcs_bus.kube import Kube
from scheduler.report import skew_loop
from tests.apiserver import ApiServer

IMAGE = "registry.k8s.io/kube-scheduler:{}"


@pytest.mark.parametrize(
    ("api", "tag", "skewed"),
    [
        ("v1.30.2", "v1.30.14", False),
        ("v1.30.2", "v1.29.9", False),  # one minor older: allowed
        ("v1.30.2", "v1.28.0", True),  # two older
        ("v1.30.2", "v1.31.0", True),  # newer
        ("v1.30.2-gke.1100", "v1.30.0", False),
        ("v1.30.2", None, False),  # a digest only: cannot tell
    ],
)
def test_the_skew_policy_against_the_api_server(api: str, tag: str | None, skewed: bool) -> None:
    image = IMAGE.format(tag) if tag else "registry.k8s.io/kube-scheduler@sha256:ab12"
    problem = versions.scheduler_skew(api_server=api, scheduler_image=image)
    assert (problem is not None) == skewed
    if problem:
        assert tag in problem and api in problem and "kube-scheduler:v1.30.x" in problem


def _deployment(tag: str) -> dict[str, Any]:
    containers = [{"name": "kube-scheduler", "image": IMAGE.format(tag)}]
    return {
        "metadata": {"name": "hcs-kube-scheduler"},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


async def test_a_kube_scheduler_newer_than_the_api_server_is_said_once(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.store("deployments", ("hcs-system", "hcs-kube-scheduler"), _deployment("v1.31.9"))
    with structlog.testing.capture_logs() as logs:
        for _ in range(2):
            problem = await skew_loop.check(kube, deployment="hcs-system/hcs-kube-scheduler")
            assert problem is not None and "newer than the API server v1.26.0" in problem
    said = [e for e in logs if e["event"] == "kube_scheduler_version_skew"]
    assert len(said) == 1 and said[0]["log_level"] == "error"
    apiserver.store("deployments", ("hcs-system", "hcs-kube-scheduler"), _deployment("v1.26.3"))
    assert await skew_loop.check(kube, deployment="hcs-system/hcs-kube-scheduler") is None


async def test_no_deployment_to_read_is_no_verdict(kube: Kube) -> None:
    assert await skew_loop.check(kube, deployment="hcs-system/absent") is None
