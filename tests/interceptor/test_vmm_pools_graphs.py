"""Memory whose lifetime is not one alloc/free pair: VMM handles that stay
allocated while mapped, pools that keep freed memory, graph memory nodes;
and the legacy (v1) entry points and cuGetProcAddress at old versions."""

from __future__ import annotations

import pytest

from .conftest import Env, GiB, MiB

OOM = "2"


def free_of(line: dict[str, str]) -> int:
    assert line["rc"] == "0", line
    return int(line["free"])


def test_vmm_memory_released_while_mapped_counts_until_unmapped(vram: Env) -> None:
    # NVIDIA's own pattern: create, map, release the handle, keep using the mapping
    r = vram.cli(
        "cu.vmm", "768Mi", 0, "cu.map", "cu.release",
        "cu.vmm", "768Mi", 0,  # still 768 MiB allocated: refused
        "cu.info", "stats", 0,
        "free",  # unmap: now the memory is gone
        "cu.info", "cu.vmm", "768Mi", 0,
    )  # fmt: skip
    assert [x["rc"] for x in r.ops("cu.vmm")] == ["0", OOM, "0"]
    assert [x["rc"] for x in r.ops("cu.map") + r.ops("cu.release")] == ["0", "0"]
    assert free_of(r.ops("cu.info")[0]) == GiB - 768 * MiB
    assert int(r.ops("stats")[0]["used"]) == 768 * MiB  # what the driver holds
    assert r.ops("free")[0]["rc"] == "0"
    assert free_of(r.ops("cu.info")[1]) == GiB


def test_vmm_handle_unmapped_but_not_released_still_counts(vram: Env) -> None:
    r = vram.cli(
        "cu.vmm", "600Mi", 0, "cu.map", "free",  # unmap only
        "cu.info", "free",  # release the handle
        "cu.info",
    )  # fmt: skip
    infos = r.ops("cu.info")
    assert free_of(infos[0]) == GiB - 600 * MiB
    assert free_of(infos[1]) == GiB


def test_pool_keeps_freed_memory_up_to_its_release_threshold_until_trimmed(vram: Env) -> None:
    r = vram.cli(
        "cu.pool_threshold", "1Gi",
        "cu.async", "600Mi", "free",  # the pool keeps the 600 MiB
        "cu.info", "stats", 0,
        "cu.alloc", "600Mi",  # refused: the pool still holds it
        "cu.async", "600Mi", "free",  # reuses what the pool kept: allowed
        "cu.trim", 0,
        "cu.info", "cu.alloc", "600Mi",
    )  # fmt: skip
    infos = r.ops("cu.info")
    assert free_of(infos[0]) == GiB - 600 * MiB
    assert int(r.ops("stats")[0]["used"]) == 600 * MiB
    assert [x["rc"] for x in r.ops("cu.alloc")] == [OOM, "0"]
    assert [x["rc"] for x in r.ops("cu.async")] == ["0", "0"]
    assert free_of(infos[1]) == GiB


def test_pool_with_the_default_threshold_returns_freed_memory_at_once(vram: Env) -> None:
    r = vram.cli("cu.async", "600Mi", "free", "cu.info", "cu.alloc", "600Mi", "stats", 0)
    assert free_of(r.ops("cu.info")[0]) == GiB
    assert r.ops("cu.alloc")[0]["rc"] == "0"


def test_lowering_the_release_threshold_refunds_what_the_pool_gives_back(vram: Env) -> None:
    r = vram.cli(
        "cu.pool_threshold", "1Gi", "cu.async", "500Mi", "free",
        "cu.pool_threshold", "100Mi", "cu.info",
    )  # fmt: skip
    assert free_of(r.ops("cu.info")[0]) == GiB - 100 * MiB


@pytest.mark.parametrize("mode", ["flags", "params", "legacy", "v2", "gpa"])
def test_graph_memory_nodes_are_charged_at_instantiation(vram: Env, mode: str) -> None:
    r = vram.cli(
        "cu.graph", "700Mi", "cu.instantiate", mode,
        "cu.info", "cu.alloc", "700Mi",
        "cu.instantiate", mode,  # a second executable graph would not fit
        "free",  # destroy the first executable graph
        "cu.info",
    )  # fmt: skip
    assert r.ops("cu.graph")[0]["rc"] == "0"
    assert [x["rc"] for x in r.ops("cu.instantiate")] == ["0", OOM]
    assert r.ops("cu.alloc")[0]["rc"] == OOM
    assert free_of(r.ops("cu.info")[0]) == GiB - 700 * MiB
    assert free_of(r.ops("cu.info")[1]) == GiB


def test_legacy_v1_entry_points_are_charged(vram: Env) -> None:
    r = vram.cli(
        "cu.v1.alloc", "600Mi", "cu.v1.alloc", "600Mi",
        "cu.v1.info", "cu.v1.pitch", 1000, 1000,
        "cu.v1.array", 4096, 4096, "cu.v1.array3d", 256, 256, 256,
        "cu.info", "freeall", "cu.info",
    )  # fmt: skip
    assert [x["rc"] for x in r.ops("cu.v1.alloc")] == ["0", OOM]
    v1 = r.ops("cu.v1.info")[0]
    assert (int(v1["free"]), int(v1["total"])) == (GiB - 600 * MiB, GiB)
    # pitch 1024 x 1000 rows, 64 MiB 2D array, 64 MiB 3D array
    used = 600 * MiB + 1024 * 1000 + 64 * MiB + 64 * MiB
    assert free_of(r.ops("cu.info")[0]) == GiB - used
    assert free_of(r.ops("cu.info")[1]) == GiB


@pytest.mark.parametrize("indirect", ["0", "1"])
def test_cu_get_proc_address_at_an_old_version_is_routed_through_the_hooks(
    vram: Env, indirect: str
) -> None:
    # version 3000 predates the _v2 entry points: the driver hands out cuMemAlloc v1
    r = vram.cli(
        "gpa1", 3000, "g1.alloc", "700Mi", "g1.alloc", "700Mi", "g1.info", "freeall", "g1.info",
        STUB_GPA_INDIRECT=indirect,
    )  # fmt: skip
    assert r.ops("gpa1")[0]["rc"] == "0"
    if indirect == "0":
        assert r.ops("gpa1")[0]["wrapped"] == "1"
    assert [x["rc"] for x in r.ops("g1.alloc")] == ["0", OOM]
    assert [int(x["free"]) for x in r.ops("g1.info")] == [GiB - 700 * MiB, GiB]


def test_runtime_stream_ordered_allocations_follow_the_pool(vram: Env) -> None:
    r = vram.cli(
        "cu.pool_threshold", "1Gi", "rt.async", "600Mi", "free",
        "rt.info", "cu.trim", 0, "rt.info",
    )  # fmt: skip
    assert [free_of(x) for x in r.ops("rt.info")] == [GiB - 600 * MiB, GiB]
