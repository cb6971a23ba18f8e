"""The multi-stage Dockerfile, checked statically (no Docker engine here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.deploy.render import ROOT, by_kind, render

DOCKERFILE = ROOT / "Dockerfile"
PARTS = {"agent": "agents", "scheduler": "scheduler", "injector": "injector", "healer": "healer"}


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name → its instructions (FROM included)."""
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in instructions():
        if word == "FROM":
            match = re.match(r"\S+\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert match, f"unnamed stage: FROM {rest}"
            current = found.setdefault(match.group(1), [])
        current.append((word, rest))
    return found


def test_every_part_has_a_target_built_from_the_common_python_base() -> None:
    found = stages()
    assert {"c-build", "python-build", "python-base", *PARTS} <= set(found)
    for target in PARTS:
        assert found[target][0][1].split()[0] == "python-base", target


def test_every_copy_from_names_an_earlier_stage() -> None:
    seen: list[str] = []
    for name, body in stages().items():
        for word, rest in body:
            match = re.search(r"--from=(\S+)", rest) if word == "COPY" else None
            if match:
                assert match.group(1) in seen, f"{name}: COPY --from={match.group(1)}"
        seen.append(name)


def test_each_entrypoint_runs_an_existing_module() -> None:
    found = stages()
    for target, package in PARTS.items():
        entry = [rest for word, rest in found[target] if word == "ENTRYPOINT"]
        assert entry, target
        command = eval(entry[-1])  # JSON array form
        assert command[:2] == ["python", "-m"] and command[2] == package
        assert (ROOT / package / "__main__.py").exists()


def test_the_native_stage_builds_the_interceptor_and_probes_into_the_agent() -> None:
    build = " ".join(rest for word, rest in stages()["c-build"] if word == "RUN")
    assert "make -C interceptor_c" in build and "make -C ebpf" in build
    for package in ("clang", "libbpf-dev", "bpftool"):
        assert package in shlex.split(build)
    copies = [rest for word, rest in stages()["agent"] if word == "COPY"]
    daemonset = str(by_kind(render("production"), "DaemonSet")["hcs-agent"])
    for built, used in (
        ("libhcs_interceptor.so", "/opt/hcs/lib/libhcs_interceptor.so"),
        ("hcs-probe", "/opt/hcs/bin/hcs-probe"),
    ):
        assert any(built in c and c.endswith(used) for c in copies), built
        assert used in daemonset


def test_only_the_agent_runs_as_root() -> None:
    found = stages()
    for target in PARTS:
        users = [rest for word, rest in found[target] if word == "USER"]
        assert users, f"{target}: no USER"
        assert (users[-1].split(":")[0] == "0") == (target == "agent"), target


def test_the_build_context_leaves_out_the_virtualenv_and_build_outputs() -> None:
    ignored = set(Path(ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".git", "interceptor_c/build", "ebpf/build"} <= ignored
