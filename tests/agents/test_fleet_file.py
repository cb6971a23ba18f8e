"""Fleet files decode strictly; a bad one is ONE line naming field path and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import fleet
from agents.__main__ import main
from hcs_bus.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "fleet.yaml"
GOOD = """
nodes:
  - name: n1
    devices: {model: nvidia/A100-80G, count: 2}
    failures:
      - {at_s: 0.2, device: 1, kind: xid, code: 79}
"""


def test_the_example_fleet_has_four_vendors_in_two_network_groups(db) -> None:
    spec = fleet.load(EXAMPLE, db=db)
    assert len(spec.nodes) >= 4
    assert all(sum(g.count for g in n.device_groups) == 8 for n in spec.nodes)
    vendors = {g.model.split("/")[0] for n in spec.nodes for g in n.device_groups}
    assert vendors == {"nvidia", "huawei", "hygon", "cambricon"}
    assert {n.network_group for n in spec.nodes} == {"ng-a", "ng-b"}
    kinds = {(f.kind, f.at_s) for n in spec.nodes for f in n.failures}
    assert {("xid", 30.0), ("slow", 45.0), ("fall_off_bus", 60.0)} <= kinds


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (("nvidia/A100-80G", "nvidia/A999"), ["nodes[0].devices.model", "'nvidia/A999'"]),
        (("count: 2", "count: two"), ["nodes[0].devices.count", "'two'"]),
        (("kind: xid", "kind: meltdown"), ["nodes[0].failures[0].kind", "'meltdown'"]),
        (("code: 79", "colour: 79"), ["nodes[0].failures[0]", "colour"]),
        (("device: 1", "device: 5"), ["nodes[0].failures[0].device", "5"]),
        ((", code: 79", ""), ["nodes[0].failures[0].code", "xid"]),
        (("name: n1", "name: 'bad name'"), ["nodes[0].name", "'bad name'"]),
        (("name: n1", "name: n1\n    labels: {'bad key': x}"), ["nodes[0].labels", "'bad key'"]),
        (("name: n1", "name: n1\n    labels: {zone: 'z 1'}"), ["nodes[0].labels.zone", "'z 1'"]),
        (("name: n1", "name: n1\n    network_group: 'ng a'"), ["nodes[0].network_group", "'ng a'"]),
        (("name: n1", "name: n1\n    rdma_fabric: ib/a"), ["nodes[0].rdma_fabric", "'ib/a'"]),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field_and_the_value(db, edit, names) -> None:
    with pytest.raises(ConfigError) as caught:
        fleet.loads(GOOD.replace(*edit), db=db, origin="f.yaml")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("f.yaml: ")
    for name in names:
        assert name in message


def test_broken_yaml_names_the_line(db) -> None:
    with pytest.raises(ConfigError, match=r"f.yaml: line \d+"):
        fleet.loads("nodes:\n  - name: [unclosed\n", db=db, origin="f.yaml")


def test_the_cli_exits_2_on_a_bad_fleet_file(tmp_path, capsys) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text(GOOD.replace("count: 2", "count: -1"))
    assert main(["--fleet", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "nodes[0].devices.count" in err and "-1" in err
