"""Every device allocation entry point of HIP, ACL and CNRT is charged,
refused over the quota with the vendor's code, and refunded when freed."""

from __future__ import annotations

import pytest

from .conftest import Env, GiB, MiB

OOM = {"hip": 2, "acl": 207001, "cnrt": 100100}
INFO = {"hip": ["hip.info"], "acl": ["acl.info", 1], "cnrt": ["cnrt.info"]}


def free_of(line: dict[str, str]) -> int:
    assert line["rc"] == "0", line
    return int(line["free"])


# (vendor, allocation ops charging `used` bytes, the op that fills the rest)
PATHS = [
    ("hip", ["hip.managed", "600Mi"], 600 * MiB),
    ("hip", ["hip.ext", "600Mi"], 600 * MiB),
    ("hip", ["hip.async", "600Mi"], 600 * MiB),
    ("hip", ["hip.poolasync", "600Mi"], 600 * MiB),
    ("hip", ["hip.pitch", 1000, 1000], 1024 * 1000),
    ("hip", ["hip.mempitch", 1000, 1000], 1024 * 1000),
    ("hip", ["hip.array", 8192, 8192], 256 * MiB),
    ("acl", ["acl.cached", "600Mi"], 600 * MiB),
    ("acl", ["acl.align32", "600Mi"], 600 * MiB),
    ("acl", ["acl.cfg", "600Mi"], 600 * MiB),
    ("cnrt", ["cnrt.constant", "600Mi"], 600 * MiB),
    ("cnrt", ["cnrt.async", "600Mi"], 600 * MiB),
]


@pytest.mark.parametrize(("vendor", "alloc", "used"), PATHS, ids=[p[1][0] for p in PATHS])
def test_vendor_allocation_path_is_charged_refused_and_refunded(
    vram: Env, vendor: str, alloc: list[object], used: int
) -> None:
    info = INFO[vendor]
    r = vram.cli(*alloc, *info, f"{vendor}.alloc", GiB - used + 1, "freeall", *info)
    assert r.op(0)["rc"] == "0"
    infos = r.ops(str(info[0]))
    assert free_of(infos[0]) == GiB - used
    assert r.ops(f"{vendor}.alloc")[0]["rc"] == str(OOM[vendor])
    assert r.ops("freeall")[0]["rc"] == "0"
    assert free_of(infos[1]) == GiB


@pytest.mark.parametrize("vendor", ["hip", "acl"])
def test_vendor_vmm_memory_counts_while_mapped_after_its_handle_is_released(
    vram: Env, vendor: str
) -> None:
    info = INFO[vendor]
    r = vram.cli(f"{vendor}.vmm", "768Mi", *info, f"{vendor}.alloc", "768Mi", "free", *info)
    assert r.op(0)["rc"] == "0"
    assert free_of(r.ops(str(info[0]))[0]) == GiB - 768 * MiB
    assert r.ops(f"{vendor}.alloc")[0]["rc"] == str(OOM[vendor])
    assert free_of(r.ops(str(info[0]))[1]) == GiB  # unmapped: gone


@pytest.mark.parametrize("vendor", ["hip", "cnrt"])
def test_vendor_pool_keeps_freed_memory_charged_until_trimmed(vram: Env, vendor: str) -> None:
    info = INFO[vendor]
    r = vram.cli(
        f"{vendor}.threshold", "1Gi", f"{vendor}.async", "600Mi", "free",
        *info, f"{vendor}.alloc", "600Mi", f"{vendor}.trim", 0, *info,
    )  # fmt: skip
    infos = r.ops(str(info[0]))
    assert free_of(infos[0]) == GiB - 600 * MiB
    assert r.ops(f"{vendor}.alloc")[0]["rc"] == str(OOM[vendor])
    assert free_of(infos[1]) == GiB
