"""CUDA driver API: quota enforcement, accounting and the memory view, through
an application linked against libcuda.so.1."""

from __future__ import annotations

import struct

from .conftest import Env, GiB, MiB

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2


def info(result, index: int = -1) -> tuple[int, int]:
    line = result.ops("cu.info")[index]
    assert line["rc"] == "0"
    return int(line["free"]), int(line["total"])


def test_allocation_within_quota_succeeds_and_is_reported_as_used(vram: Env) -> None:
    r = vram.cli("cu.alloc", "512Mi", "cu.info")
    assert r.op(0)["rc"] == "0"
    assert info(r) == (GiB - 512 * MiB, GiB)


def test_allocation_beyond_quota_returns_cuda_oom(vram: Env) -> None:
    r = vram.cli("cu.alloc", "512Mi", "cu.alloc", "600Mi", "cu.alloc", "512Mi", "cu.alloc", "1")
    assert r.rcs() == [
        CUDA_SUCCESS,
        CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_SUCCESS,
        CUDA_ERROR_OUT_OF_MEMORY,
    ]


def test_refused_allocation_never_reaches_the_driver(vram: Env) -> None:
    r = vram.cli("cu.alloc", "2Gi", "stats", 0)
    assert r.op(0)["rc"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert r.op(1)["peak"] == "0"


def test_free_returns_quota_to_the_device(vram: Env) -> None:
    r = vram.cli("cu.alloc", "1Gi", "cu.alloc", "1Mi", "free", "free", "cu.alloc", "1Gi", "cu.info")
    assert r.op(0)["rc"] == "0" and r.op(1)["rc"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert r.op(4)["rc"] == "0"
    assert info(r) == (0, GiB)


def test_free_memory_is_clamped_to_physical_free(vram: Env) -> None:
    r = vram.cli(
        "cu.alloc", "100Mi", "cu.info", HCS_VRAM_QUOTA="16Gi", STUB_TOTAL_BYTES=str(2 * GiB)
    )
    free, total = info(r)
    assert total == 16 * GiB
    assert free == 2 * GiB - 100 * MiB


def test_nvml_and_cu_mem_get_info_report_identical_numbers(vram: Env) -> None:
    r = vram.cli("cu.alloc", "300Mi", "cu.info", "nvml.info", 0, "nvml.info2", 0)
    free, total = info(r)
    v1, v2 = r.ops("nvml.info")[0], r.ops("nvml.info2")[0]
    assert (int(v1["free"]), int(v1["total"])) == (free, total) == (GiB - 300 * MiB, GiB)
    assert (int(v2["free"]), int(v2["total"])) == (free, total)
    assert int(v1["used"]) == int(v2["used"]) == 300 * MiB
    assert v2["reserved"] == "0"


def test_nvml_index_maps_through_cuda_visible_devices(vram: Env) -> None:
    # ordinal 0 is NVML index 1: its quota (0:1Gi) must show on index 1
    r = vram.cli(
        "nvml.info", 1, "nvml.info", 0, HCS_VRAM_QUOTA="0:1Gi,1:2Gi", CUDA_VISIBLE_DEVICES="1,0"
    )
    assert int(r.op(0)["total"]) == GiB
    assert int(r.op(1)["total"]) == 2 * GiB


def test_zero_size_allocation_is_passed_to_the_driver_unaccounted(vram: Env) -> None:
    r = vram.cli("cu.alloc", 0, "cu.info")
    assert r.op(0)["rc"] == str(CUDA_ERROR_INVALID_VALUE)
    assert info(r) == (GiB, GiB)


def test_huge_allocation_returns_oom_without_overflow(vram: Env) -> None:
    r = vram.cli(
        "cu.alloc",
        "1Mi",
        "cu.alloc",
        0xFFFFFFFFFFFFFFFF,
        "cu.alloc",
        0xFFFFFFFFFFFFFFFF - 4096,
        "cu.info",
    )
    assert r.rcs()[:3] == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY]
    assert info(r) == (GiB - MiB, GiB)


def test_free_of_unknown_pointer_passes_through_without_changing_accounting(vram: Env) -> None:
    r = vram.cli("cu.alloc", "256Mi", "cu.free_raw", "0xdeadbeef", "cu.free_raw", 0, "cu.info")
    assert r.op(1)["rc"] == str(CUDA_ERROR_INVALID_VALUE)  # the stub driver's answer
    assert info(r) == (GiB - 256 * MiB, GiB)


def test_double_free_is_refunded_only_once(vram: Env) -> None:
    r = vram.cli("cu.alloc", "256Mi", "cu.alloc", "256Mi", "free_first", "cu.info")
    assert info(r) == (GiB - 256 * MiB, GiB)


def test_per_device_quotas_are_enforced_independently(vram: Env) -> None:
    r = vram.cli(
        "cu.alloc",
        "1Gi",
        "cu.alloc",
        "1Mi",
        "dev",
        1,
        "cu.alloc",
        "2Gi",
        "cu.alloc",
        "1Mi",
        "cu.info",
        HCS_VRAM_QUOTA="0:1Gi,1:2Gi",
    )
    assert [int(x["rc"]) for x in r.lines if x["op"] == "cu.alloc"] == [0, 2, 0, 2]
    assert info(r) == (0, 2 * GiB)


def test_device_without_a_listed_quota_is_not_limited(vram: Env) -> None:
    r = vram.cli("dev", 1, "cu.alloc", "6Gi", "cu.info", HCS_VRAM_QUOTA="0:1Gi")
    assert r.ops("cu.alloc")[0]["rc"] == "0"
    assert info(r) == (2 * GiB, 8 * GiB)  # the stub's physical numbers


def test_pitch_allocation_is_charged_by_the_pitch_the_driver_chose(vram: Env) -> None:
    r = vram.cli("cu.pitch", 1000, 1000, "cu.info", STUB_PITCH_ALIGN="4096")
    assert r.op(0)["rc"] == "0" and r.op(0)["pitch"] == "4096"
    assert info(r) == (GiB - 4096 * 1000, GiB)
    r = vram.cli("cu.pitch", 300000, 4000, HCS_VRAM_QUOTA="1Gi", STUB_PITCH_ALIGN="512")
    assert r.op(0)["rc"] == str(CUDA_ERROR_OUT_OF_MEMORY)


def test_managed_async_and_pool_allocations_count_against_quota(vram: Env) -> None:
    r = vram.cli(
        "cu.managed",
        "200Mi",
        "cu.async",
        "200Mi",
        "cu.async_ptsz",
        "200Mi",
        "cu.pool",
        "200Mi",
        "cu.pool_ptsz",
        "200Mi",
        "cu.async",
        "100Mi",
        "cu.info",
        "freeall",
        "cu.info",
    )
    assert r.rcs()[:6] == [0, 0, 0, 0, 0, CUDA_ERROR_OUT_OF_MEMORY]
    assert info(r, 0) == (GiB - 1000 * MiB, GiB)
    assert r.ops("freeall")[0]["rc"] == "0"
    assert info(r, 1) == (GiB, GiB)


def test_vmm_allocations_are_charged_to_the_device_they_are_created_on(vram: Env) -> None:
    r = vram.cli(
        "cu.vmm",
        "1536Mi",
        1,
        "cu.info",
        "dev",
        1,
        "cu.info",
        "cu.vmm",
        "600Mi",
        1,
        "free",
        "cu.vmm",
        "600Mi",
        1,
        "cu.info",
        HCS_VRAM_QUOTA="2Gi",
    )
    assert r.op(0)["rc"] == "0"
    assert info(r, 0) == (2 * GiB, 2 * GiB)  # device 0 untouched
    assert info(r, 1) == (512 * MiB, 2 * GiB)
    assert r.ops("cu.vmm")[1]["rc"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert r.ops("cu.vmm")[2]["rc"] == "0"  # after cuMemRelease


def test_arrays_are_charged_by_their_size_and_released_on_destroy(vram: Env) -> None:
    # 8192 x 8192 float = 256 MiB; 3D 256^3 float = 64 MiB; mipmap 4096^2 float, 2 levels = 64 + 16 MiB
    r = vram.cli(
        "cu.array",
        8192,
        8192,
        "cu.array3d",
        256,
        256,
        256,
        "cu.mipmap",
        4096,
        4096,
        0,
        2,
        "cu.info",
        "cu.array",
        32768,
        32768,
        "freeall",
        "cu.info",
    )
    assert r.rcs()[:3] == [0, 0, 0]
    assert info(r, 0) == (GiB - 400 * MiB, GiB)
    assert r.ops("cu.array")[1]["rc"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert info(r, 1) == (GiB, GiB)


def test_without_quota_everything_passes_through(vram: Env) -> None:
    r = vram.cli("cu.alloc", "6Gi", "cu.info", "nvml.info", 0, HCS_VRAM_QUOTA=None)
    assert r.op(0)["rc"] == "0"
    assert info(r) == (2 * GiB, 8 * GiB)
    assert not vram.shm.exists()


def test_invalid_quota_fails_closed(vram: Env) -> None:
    r = vram.cli("cu.alloc", "1Mi", HCS_VRAM_QUOTA="lots", HCS_INTERCEPTOR_LOG="error")
    assert r.op(0)["rc"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert "invalid HCS_VRAM_QUOTA" in r.stderr


def test_quota_units_are_understood(vram: Env) -> None:
    for quota, expected in [
        ("1073741824", GiB),
        ("1024Mi", GiB),
        ("1048576Ki", GiB),
        ("0.5Gi", GiB // 2),
        ("2G", 2_000_000_000),
        ("0:1Ti", 1 << 40),
    ]:
        # a fresh accounting file each: a file keeps the smallest quota it saw
        shm = vram.tmp_path / f"units-{len(quota)}-{quota.replace(':', '_')}.shm"
        r = vram.cli(
            "cu.info", HCS_VRAM_QUOTA=quota, HCS_SHM_PATH=str(shm), STUB_TOTAL_BYTES=str(2 << 40)
        )
        assert info(r)[1] == expected, quota


def test_logging_is_silent_by_default_and_reports_refusals_at_info(vram: Env) -> None:
    quiet = vram.cli("cu.alloc", "2Gi")
    assert quiet.stderr == ""
    loud = vram.cli("cu.alloc", "2Gi", HCS_INTERCEPTOR_LOG="info")
    assert "refused" in loud.stderr


def test_accounting_file_with_another_layout_version_is_refused(vram: Env) -> None:
    header = struct.pack("<QIIII", 0x4D415256534348, 99, 64, 16, 1024) + bytes(64 - 24)
    vram.shm.write_bytes(header + bytes(4096))
    r = vram.cli("cu.alloc", "700Mi", "cu.alloc", "700Mi", HCS_INTERCEPTOR_LOG="error")
    assert "layout version mismatch" in r.stderr and "found version 99" in r.stderr
    # still enforced, per process
    assert r.rcs() == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert vram.shm.read_bytes()[:24] == header[:24]  # left alone
