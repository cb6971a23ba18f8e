"""The end-to-end tier: one real cluster and one HCS stack per test run, a fresh
namespace per test. Skipped, naming the missing binary, without
``HCS_KUBE_BIN``; logs of every component are kept under the run's folder and
printed (last lines) when something fails to start."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.api import wait_for
from tests.e2e.cluster import Binaries, Cluster, find_binaries
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads

FLEET = Path(__file__).with_name("fleet.yaml")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: an e2e test that fails devices or parts (runs after the others)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that inject faults run last: the nodes they fail stay tainted for a
    recovery window, and the other tests assume a healthy fleet."""
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.timeout(300))

    def order(item: pytest.Item) -> tuple[bool, bool]:
        faults = item.get_closest_marker("faults")
        return faults is not None, bool(faults and faults.kwargs.get("last"))

    items.sort(key=order)  # faults(last=True): after the other fault tests too


@pytest.fixture(scope="session")
def kube_binaries() -> Binaries:
    found = find_binaries()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def e2e_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="hcs-e2e-"))
    yield root
    if os.environ.get("HCS_E2E_KEEP"):
        print(f"\nhcs e2e: logs kept in {root / 'logs'}")
    else:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(kube_binaries: Binaries, e2e_root: Path) -> Iterator[Cluster]:
    c = Cluster(kube_binaries, root=e2e_root)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def stack(cluster: Cluster, e2e_root: Path) -> Iterator[Stack]:
    from agents import fleet as fleet_file

    names = [n.name for n in fleet_file.load(FLEET).nodes]
    cluster.add_nodes(names)
    s = Stack(cluster, fleet=FLEET, root=e2e_root)
    try:
        s.start()
        yield s
    finally:
        s.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.namespace(name)
    yield name
    stack = request.getfixturevalue("stack") if "stack" in request.fixturenames else None
    clean_namespace(cluster, stack, name)


def clean_namespace(cluster: Cluster, stack: Stack | None, *names: str) -> None:
    """Delete a test's namespaces (all first, then wait) until the next test
    starts on an empty fleet: their pods gone, and HCS holding nothing for
    them (no reservation in any replica's view, no gang record waiting or
    pledged). A failed clean-up is printed: it must not hide the test's own
    result."""
    for name in names:
        try:
            cluster.api.delete(f"/api/v1/namespaces/{name}")
        except Exception as exc:
            print(f"namespace {name} not deleted: {exc}")
    for name in names:
        try:
            wait_for(
                lambda name=name: not cluster.api.items(f"/api/v1/namespaces/{name}/pods?limit=1"),
                what=f"the pods of namespace {name} deleted",
                timeout_s=60,
            )
            if stack is not None:
                wait_for(
                    lambda name=name: stack.pods_held(name) == 0 and stack.gangs_held(name) == 0,
                    what=f"HCS releasing the pods and gangs of namespace {name}",
                    timeout_s=30,
                )
        except Exception as exc:
            print(f"namespace {name} not cleaned up: {exc}")


@pytest.fixture
def work(stack: Stack, namespace: str) -> Workloads:
    return Workloads(stack, namespace=namespace)


@pytest.fixture(autouse=True)
def _parts_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each e2e test, every component must still run (a crash is a failure)."""
    yield
    if "stack" in request.fixturenames:
        s: Stack = request.getfixturevalue("stack")
        dead = [p.name for p in s.parts.values() if not p.alive] + s.cluster.dead()
        assert not dead, f"components died during the test: {dead}\n{s.why()}\n{s.cluster.why()}"
