"""CUDA runtime, Ascend ACL, AMD HIP and Cambricon CNRT hooks (linked path)."""

from __future__ import annotations

import pytest

from .conftest import Env, GiB, MiB

cudaErrorMemoryAllocation = 2
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
hipErrorOutOfMemory = 2
cnrtErrorNoMem = 100100


def free_total(line: dict[str, str]) -> tuple[int, int]:
    assert line["rc"] == "0"
    return int(line["free"]), int(line["total"])


def test_cuda_malloc_beyond_quota_returns_cuda_error_memory_allocation(vram: Env) -> None:
    r = vram.cli("rt.alloc", "700Mi", "rt.alloc", "700Mi")
    assert r.rcs() == [0, cudaErrorMemoryAllocation]


def test_runtime_allocation_is_charged_once_although_the_runtime_calls_the_driver(
    vram: Env,
) -> None:
    # the stub runtime allocates through cuGetProcAddress'ed (wrapped) driver calls
    r = vram.cli("rt.alloc", "700Mi", "rt.info", "cu.info", "freeall", "rt.info")
    assert free_total(r.ops("rt.info")[0]) == (GiB - 700 * MiB, GiB)
    assert free_total(r.ops("cu.info")[0]) == (GiB - 700 * MiB, GiB)
    assert free_total(r.ops("rt.info")[1]) == (GiB, GiB)


def test_runtime_managed_and_async_allocations_are_accounted(vram: Env) -> None:
    r = vram.cli(
        "rt.managed",
        "400Mi",
        "rt.async",
        "400Mi",
        "rt.async",
        "400Mi",
        "rt.info",
        "freeall",
        "rt.info",
    )
    assert r.rcs()[:3] == [0, 0, cudaErrorMemoryAllocation]
    assert free_total(r.ops("rt.info")[0]) == (GiB - 800 * MiB, GiB)
    assert free_total(r.ops("rt.info")[1]) == (GiB, GiB)


def test_pointer_from_the_runtime_can_be_freed_through_the_driver(vram: Env) -> None:
    r = vram.cli("rt.alloc", "100Mi", "cu.info")
    assert free_total(r.ops("cu.info")[0]) == (GiB - 100 * MiB, GiB)


@pytest.mark.parametrize(
    ("vendor", "oom", "info_args"),
    [
        ("acl", ACL_ERROR_RT_MEMORY_ALLOCATION, ["acl.info", 1]),
        ("hip", hipErrorOutOfMemory, ["hip.info"]),
        ("cnrt", cnrtErrorNoMem, ["cnrt.info"]),
    ],
)
def test_vendor_allocation_beyond_quota_returns_the_vendor_oom_code(
    vram: Env, vendor: str, oom: int, info_args: list[object]
) -> None:
    alloc = f"{vendor}.alloc"
    r = vram.cli(alloc, "600Mi", alloc, "600Mi", *info_args, "freeall", *info_args)
    assert r.rcs()[:2] == [0, oom]
    infos = r.ops(info_args[0])
    assert free_total(infos[0]) == (GiB - 600 * MiB, GiB)
    assert free_total(infos[1]) == (GiB, GiB)


@pytest.mark.parametrize("vendor", ["acl", "hip", "cnrt"])
def test_vendor_quota_follows_the_current_device(vram: Env, vendor: str) -> None:
    info = ["acl.info", 1] if vendor == "acl" else [f"{vendor}.info"]
    r = vram.cli(
        f"{vendor}.alloc",
        "1Gi",
        "setdev",
        vendor,
        1,
        f"{vendor}.alloc",
        "1536Mi",
        *info,
        HCS_VRAM_QUOTA="0:1Gi,1:2Gi",
    )
    assert r.rcs()[0] == 0 and r.rcs()[2] == 0
    assert free_total(r.ops(str(info[0]))[0]) == (512 * MiB, 2 * GiB)


def test_acl_host_memory_info_is_not_sliced(vram: Env) -> None:
    r = vram.cli("acl.info", 0)  # ACL_DDR_MEM
    assert free_total(r.op(0)) == (64 * GiB, 64 * GiB)
