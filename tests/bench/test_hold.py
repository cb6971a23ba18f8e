"""bench.hold's shapes: the injector's own pods, which a hollow node admits."""

from __future__ import annotations

from bench.hold import shapes
from injector import runtimes


def test_each_vendor_shape_is_the_injectors_pod_and_the_old_ledger_adds_one_volume() -> None:
    found = {s.name: s for s in shapes()}
    vendors = runtimes.load().vendors
    assert set(found) == {"plain", *vendors, f"{next(iter(vendors))}, ledger emptyDir"}
    assert found["plain"].volumes == 1 and found["plain"].env == 0
    for name, profile in vendors.items():
        spec = found[name].pod["spec"]
        names = {v["name"] for v in spec["volumes"]}
        assert "hcs-interceptor" in names and "hcs-shm" not in names
        assert len(names) == 1 + len(profile.mounts) + len(profile.devices.nodes)
        assert spec.get("runtimeClassName") == profile.runtime_class
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert env["HCS_SHM_PATH"]["value"] == "/dev/shm/hcs-vram.shm"
        # what a hollow node (no devices, no labels) would refuse is gone
        assert "affinity" not in spec and "resources" not in spec["containers"][0]
    first = next(iter(vendors))
    old = found[f"{first}, ledger emptyDir"]
    assert old.volumes == found[first].volumes + 1
    assert {"name": "hcs-shm", "mountPath": "/var/run/hcs"} in old.pod["spec"]["containers"][0][
        "volumeMounts"
    ]
