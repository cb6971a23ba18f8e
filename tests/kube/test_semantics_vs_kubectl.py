"""The double's patch semantics against the real apimachinery code:
``kubectl patch --local`` applies strategic merge / merge / JSON patches to a
Node offline with the same libraries kube-apiserver uses. Skipped without
kubectl on PATH."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.kube.semantics import json_patch, merge_patch, strategic_merge

WIRE = Path(__file__).parent / "wire"
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not on PATH")

NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-node-a", "labels": {"zone": "a", "hcs.io/vendor": "nvidia"}},
    "spec": {
        "taints": [
            {"key": "old", "effect": "NoExecute"},
            {"key": "hcs.io/gpu-node", "value": "true", "effect": "NoSchedule"},
        ]
    },
    "status": {
        "capacity": {"cpu": "16", "hcs.io/gpu": "4"},
        "allocatable": {"cpu": "16"},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "HcsGpuHealthy", "status": "True", "reason": "Fine", "message": "ok"},
        ],
        "addresses": [{"type": "Hostname", "address": "gpu-node-a"}],
    },
}


def _wire(name: str) -> Any:
    return json.loads((WIRE / name).read_text())


CASES: list[tuple[str, str, Any]] = [
    ("strategic", "taints", _wire("node-taints-strategic-merge-patch.json")),
    ("strategic", "condition", _wire("node-status-condition-strategic-merge-patch.json")),
    (
        "strategic",
        "delete-condition-and-label",
        {
            "metadata": {"labels": {"zone": None}},
            "status": {"conditions": [{"type": "HcsGpuHealthy", "$patch": "delete"}]},
        },
    ),
    (
        "strategic",
        "address-by-type",
        {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]}},
    ),
    (
        "merge",
        "labels-and-conditions",
        {
            "metadata": {"labels": {"hcs.io/vendor": None, "hcs.io/model": "H200"}},
            "status": {"conditions": [{"type": "HcsGpuHealthy", "status": "False"}]},
        },
    ),
    ("json", "capacity", _wire("node-status-capacity-json-patch.json")),
    *(
        ("strategic", f"condition-order-{i}", {"status": {"conditions": conditions}})
        for i, conditions in enumerate(
            [
                [{"type": "New", "status": "False"}],
                [{"type": "HcsGpuHealthy", "status": "False"}, {"type": "New", "status": "True"}],
                [{"type": "New", "status": "True"}, {"type": "Ready", "status": "False"}],
                [{"type": "HcsGpuHealthy", "status": "False"}, {"type": "Ready", "status": "True"}],
            ]
        )
    ),
]


def _kubectl(kind: str, patch: Any, tmp_path: Path) -> Any:
    node_file = tmp_path / "node.json"
    node_file.write_text(json.dumps(NODE))
    assert KUBECTL is not None
    args = ["patch", "--local", "-f", str(node_file), "--type", kind, "-p", json.dumps(patch)]
    out = subprocess.run(
        [KUBECTL, *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def _ours(kind: str, patch: Any) -> Any:
    base = json.loads(json.dumps(NODE))
    if kind == "strategic":
        return strategic_merge(base, patch)
    if kind == "merge":
        return merge_patch(base, patch)
    return json_patch(base, patch)


@pytest.mark.parametrize(("kind", "name", "patch"), CASES, ids=[f"{k}-{n}" for k, n, _ in CASES])
def test_the_double_patches_a_node_exactly_as_kubectl_local_does(
    kind: str, name: str, patch: Any, tmp_path: Path
) -> None:
    assert _ours(kind, patch) == _kubectl(kind, patch, tmp_path)
