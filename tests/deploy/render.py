"""Rendering the overlays with ``kubectl kustomize``.

The base includes the parts' folders deploy/webhook/ and deploy/scheduler/
as kustomizations. Until their owners add the one-line ``kustomization.yaml``
there, the render runs on a temporary copy that lists their YAML files, and
``test_the_parts_folders_are_kustomizations`` fails, naming what is missing.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("dev", "production")
PART_FOLDERS = ("webhook", "scheduler")
_RENDERED: dict[str, list[dict[str, Any]]] = {}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if not found:
        pytest.skip("needs kubectl (Debian package kubernetes-client)")
    major = _kustomize_major(found)
    if major is not None and major < 4:
        pytest.skip(
            f"needs kubectl with kustomize >= v4 (labels, patches); {found} has v{major} "
            "(Debian's kubernetes-client 1.20 ships v2: install a current kubectl)"
        )
    return found


@functools.cache
def _kustomize_major(binary: str) -> int | None:
    out = subprocess.run(
        [binary, "version", "--client"], capture_output=True, text=True, timeout=30
    ).stdout
    found = re.search(r"Kustomize Version: v(\d+)", out)
    return int(found.group(1)) if found else None


def missing_part_kustomizations() -> list[str]:
    return [
        f"deploy/{p}/kustomization.yaml"
        for p in PART_FOLDERS
        if not (DEPLOY / p / "kustomization.yaml").exists()
    ]


def _tree() -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    if not missing_part_kustomizations():
        return DEPLOY, None
    tmp = tempfile.TemporaryDirectory(prefix="hcs-deploy-")
    copy = Path(tmp.name) / "deploy"
    shutil.copytree(DEPLOY, copy)
    for part in PART_FOLDERS:
        folder = copy / part
        if not (folder / "kustomization.yaml").exists():
            files = sorted(p.name for p in folder.glob("*.yaml"))
            (folder / "kustomization.yaml").write_text(yaml.safe_dump({"resources": files}))
    return copy, tmp


def render(overlay: str) -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/overlays/<overlay>`` as a list of objects (cached).

    ``"<overlay>+<component>"`` renders the overlay with an opt-in component of
    deploy/components added, as an operator's overlay would.
    """
    if overlay not in _RENDERED:
        tree, tmp = _tree()
        try:
            _RENDERED[overlay] = _build(tree, overlay)
        finally:
            if tmp is not None:
                tmp.cleanup()
    return _RENDERED[overlay]


def render_folder(folder: str) -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/<folder>`` (any kustomization folder of deploy/)."""
    key = f"folder:{folder}"
    if key not in _RENDERED:
        _RENDERED[key] = _kustomize(DEPLOY / folder)
    return _RENDERED[key]


def _build(tree: Path, overlay: str) -> list[dict[str, Any]]:
    name, _, component = overlay.partition("+")
    if not component:
        return _kustomize(tree / "overlays" / name)
    with tempfile.TemporaryDirectory(prefix="hcs-overlay-", dir=tree / "overlays") as tmp:
        (Path(tmp) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [f"../{name}"],
                    "components": [f"../../components/{component}"],
                }
            )
        )
        return _kustomize(Path(tmp))


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(folder)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}
