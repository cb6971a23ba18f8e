"""connect(settings): in-cluster, kubeconfig, or None with one log line; and
errors when the API server cannot be reached."""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from hcs_bus import kube as kube_module
from hcs_bus.errors import ConfigError, KubeUnavailable
from hcs_bus.kube import connect, connect_url
from hcs_bus.settings import KubeSettings
from tests.apiserver import ApiServer


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No in-cluster environment and no kubeconfig anywhere."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """Captured log entries of hcs.kube at every level."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as entries:
            # a fresh proxy: the cached module logger would bypass the capture
            monkeypatch.setattr(kube_module, "_log", structlog.get_logger("hcs.kube"))
            yield entries
    finally:
        structlog.configure(**saved)


@pytest.mark.parametrize("mode", ["auto", "none"])
async def test_without_a_cluster_connect_returns_none_and_says_so_once(
    no_cluster: Path, logs: list[MutableMapping[str, Any]], mode: str
) -> None:
    client = await connect(KubeSettings(mode=mode))  # type: ignore[arg-type]

    assert client is None
    assert [e["event"] for e in logs] == ["kube_not_configured"]
    assert logs[0]["note"] == "no cluster configured"


async def test_a_kubeconfig_file_is_used_when_not_in_a_cluster(
    no_cluster: Path, apiserver: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = no_cluster / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: double\n"
        f"clusters: [{{name: double, cluster: {{server: '{apiserver.url}'}}}}]\n"
        "users: [{name: nobody, user: {}}]\n"
        "contexts: [{name: double, context: {cluster: double, user: nobody}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    apiserver.add_node("gpu-node-a")

    client = await connect(KubeSettings())
    assert client is not None
    try:
        assert (await client.get_node("gpu-node-a"))["metadata"]["name"] == "gpu-node-a"
    finally:
        await client.close()


async def test_a_kubeconfig_mode_without_the_file_is_a_config_error(no_cluster: Path) -> None:
    with pytest.raises(ConfigError, match="no kubeconfig"):
        await connect(KubeSettings(mode="kubeconfig", kubeconfig=str(no_cluster / "missing")))


async def test_an_unreachable_api_server_is_kube_unavailable_chained_from_the_cause() -> None:
    client = await connect_url("http://127.0.0.1:9", timeout_s=2.0)
    try:
        with pytest.raises(KubeUnavailable) as caught:
            await client.get_node("gpu-node-a")
    finally:
        await client.close()
    assert isinstance(caught.value.__cause__, OSError)
