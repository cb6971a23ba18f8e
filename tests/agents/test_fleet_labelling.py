"""Fleet mode labels every fleet node's Node and writes its capacity (API-server double)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agents import fleet as fleet_file
from agents import simulating
from agents.labeling import FleetLabeler
from agents.labels import ACU, DEVICES, VRAM
from agents.reporting import Publisher
from agents.running import fleet_targets, run_fleet
from hcs_bus import settings as hcs_settings
from tests.agents.test_publishing import until

MIB = 2**20
FLEET = """
report_interval_s: 0.2
nodes:
  - name: hollow-0
    network_group: ng-a
    rdma_fabric: ib-a
    labels: {topology.kubernetes.io/zone: z1, rack: r7}
    devices: {model: nvidia/A100-80G, count: 4}
    failures:
      - {at_s: 1.0, device: 2, kind: fall_off_bus}
      - {at_s: 2.0, device: 2, kind: recover}
  - name: hollow-1
    network_group: ng-b
    devices: {model: huawei/Ascend910B2, count: 8}
  - name: not-in-cluster
    devices: {model: nvidia/A100-80G, count: 2}
"""


def sim_nodes(spec: fleet_file.Fleet, *, publisher: Publisher, db) -> list[simulating.SimNode]:
    return [
        simulating.build_node(s, publisher=publisher, db=db, interval_s=0.2, seed=0)
        for s in spec.nodes
    ]


def advance(nodes: list[simulating.SimNode], *, to_s: float) -> None:
    for node in nodes:
        simulating.step(node, elapsed_s=to_s, loop_s=to_s, now=1000.0 + to_s, noise_pct=1.0)


async def test_each_fleet_node_gets_its_labels_and_capacity_and_a_missing_one_is_skipped(
    apiserver, kube, bus, db, logs
) -> None:
    apiserver.add_node("hollow-0")
    apiserver.add_node("hollow-1")
    nodes = sim_nodes(fleet_file.loads(FLEET, db=db), publisher=Publisher(bus, capacity=100), db=db)
    labeler = FleetLabeler(kube, retry_s=5.0)
    advance(nodes, to_s=0.0)
    assert await labeler.label(fleet_targets(nodes), now_s=0.0) == 2
    a100 = apiserver.nodes["hollow-0"]
    labels = a100["metadata"]["labels"]
    assert labels["hcs.io/vendor"] == "nvidia" and labels["hcs.io/model"] == "A100-80G"
    assert labels["hcs.io/network-group"] == "ng-a" and labels["hcs.io/rdma-fabric"] == "ib-a"
    assert labels["topology.kubernetes.io/zone"] == "z1" and labels["rack"] == "r7"
    assert a100["status"]["capacity"][VRAM] == str(4 * 81920 * MIB)
    assert (
        a100["status"]["allocatable"][DEVICES] == "4" and a100["status"]["capacity"][ACU] == "400"
    )
    npu = apiserver.nodes["hollow-1"]
    assert npu["metadata"]["labels"]["hcs.io/vendor"] == "huawei"
    assert npu["metadata"]["labels"]["hcs.io/network-group"] == "ng-b"
    assert npu["status"]["capacity"][DEVICES] == "8"
    assert "not-in-cluster" not in apiserver.nodes
    assert labeler.labelers["not-in-cluster"].missing
    assert [e["node"] for e in logs if e["event"] == "node_missing"] == ["not-in-cluster"]
    apiserver.add_node("not-in-cluster")  # registers later: picked up after retry_s
    assert await labeler.label(fleet_targets(nodes), now_s=1.0) == 0
    assert await labeler.label(fleet_targets(nodes), now_s=5.0) == 1
    assert apiserver.nodes["not-in-cluster"]["status"]["capacity"][DEVICES] == "2"


async def test_a_device_falling_off_the_bus_lowers_capacity_and_recovery_raises_it(
    apiserver, kube, bus, db
) -> None:
    apiserver.add_node("hollow-0")
    apiserver.add_node("hollow-1")
    nodes = sim_nodes(fleet_file.loads(FLEET, db=db), publisher=Publisher(bus, capacity=100), db=db)
    labeler = FleetLabeler(kube)

    def capacity() -> dict[str, str]:
        cap = apiserver.nodes["hollow-0"]["status"]["capacity"]
        return {k: cap[k] for k in (VRAM, ACU, DEVICES)}

    advance(nodes, to_s=0.0)
    await labeler.label(fleet_targets(nodes), now_s=0.0)
    assert capacity() == {VRAM: str(4 * 81920 * MIB), ACU: "400", DEVICES: "4"}
    advance(nodes, to_s=1.0)  # fall_off_bus on device 2
    assert await labeler.label(fleet_targets(nodes), now_s=1.0) == 1
    assert capacity() == {VRAM: str(3 * 81920 * MIB), ACU: "300", DEVICES: "3"}
    assert apiserver.nodes["hollow-0"]["metadata"]["labels"]["hcs.io/model"] == "A100-80G"
    advance(nodes, to_s=2.0)  # recover
    assert await labeler.label(fleet_targets(nodes), now_s=2.0) == 1
    assert capacity() == {VRAM: str(4 * 81920 * MIB), ACU: "400", DEVICES: "4"}


def kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: t, user: {}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
    )
    return path


async def test_python_m_agents_fleet_labels_the_nodes_of_the_configured_cluster(
    apiserver, bus, db, tmp_path
) -> None:
    apiserver.add_node("hollow-0")
    apiserver.add_node("hollow-1")
    settings = hcs_settings.Settings(
        kube=hcs_settings.KubeSettings(
            mode="kubeconfig", kubeconfig=str(kubeconfig(tmp_path, apiserver.url))
        )
    )
    spec = fleet_file.loads(FLEET, db=db)
    task = asyncio.get_running_loop().create_task(
        run_fleet(bus, spec, settings=settings, tick_s=0.05)
    )

    def status() -> dict[str, str]:
        return apiserver.nodes["hollow-0"].get("status", {}).get("capacity", {})

    def model(node: str) -> str | None:
        return apiserver.nodes[node]["metadata"].get("labels", {}).get("hcs.io/model")

    try:
        await until(lambda: status().get(DEVICES) == "4" and model("hollow-1") == "Ascend910B2")
        await until(lambda: status().get(DEVICES) == "3")  # fall_off_bus at 1 s
        assert status()[VRAM] == str(3 * 81920 * MIB)
        await until(lambda: status().get(DEVICES) == "4")  # recover at 2 s
        assert not task.done()  # the Node that does not exist did not stop the agent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert model("hollow-0") == "A100-80G"
    assert "not-in-cluster" not in apiserver.nodes
