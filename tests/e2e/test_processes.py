"""The tier's own failure messages: a component that dies while the cluster
starts is named with its binary and the last lines of its log (no cluster
binaries needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import find_binaries
from tests.e2e.processes import ClusterError, Process


def test_a_component_that_dies_at_start_is_named_with_its_binary_and_its_last_log_lines(
    tmp_path: Path,
) -> None:
    script = tmp_path / "fake-apiserver"
    script.write_text(
        "#!/bin/sh\necho 'starting'\necho 'E0101 bind: address already in use' >&2\nexit 3\n"
    )
    script.chmod(0o755)
    process = Process("kube-apiserver", [str(script)], logs=tmp_path / "logs")
    with pytest.raises(ClusterError) as failed:
        process.wait_until(lambda: False, what="ready (/readyz)", timeout_s=10)
    message = str(failed.value)
    assert "kube-apiserver" in message and str(script) in message
    assert "exited with 3" in message and "address already in use" in message


def test_a_missing_binary_folder_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HCS_KUBE_BIN", raising=False)
    assert "HCS_KUBE_BIN is not set" in str(find_binaries())
    (tmp_path / "kube-apiserver").write_text("")
    monkeypatch.setenv("HCS_KUBE_BIN", str(tmp_path))
    assert find_binaries() == f"kube-apiserver not found in HCS_KUBE_BIN={tmp_path}"
