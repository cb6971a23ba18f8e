"""The packaged profile database: coverage, sourcing, ACU, conversions, names."""

from __future__ import annotations

import pytest

from hcs_bus import profiles
from hcs_bus.profiles import NUMERIC_FIELDS, Profile, convert_amount, equivalent

REQUIRED_MODELS = (
    "nvidia/V100", "nvidia/T4", "nvidia/A10", "nvidia/L20", "nvidia/L40S", "nvidia/A100-40G",
    "nvidia/A100-80G", "nvidia/A800", "nvidia/H100-SXM", "nvidia/H100-PCIe", "nvidia/H800",
    "nvidia/H20", "nvidia/H200", "huawei/Ascend910A", "huawei/Ascend910B1",
    "huawei/Ascend910B2", "huawei/Ascend910B3", "huawei/Ascend910B4", "huawei/Ascend910B4-1",
    "huawei/Ascend910C", "huawei/Ascend310P", "hygon/Z100", "hygon/K100", "hygon/K100-AI", "cambricon/MLU370-X8",
    "cambricon/MLU590", "mthreads/S4000", "iluvatar/BI-V100",
)  # fmt: skip

VENDOR_FACTS = {
    "nvidia": ("NVIDIA_VISIBLE_DEVICES", 0x10DE),
    "huawei": ("ASCEND_VISIBLE_DEVICES", 0x19E5),
    "hygon": ("HIP_VISIBLE_DEVICES", 0x1D94),
    "cambricon": ("MLU_VISIBLE_DEVICES", 0xCABC),
    "mthreads": ("MTHREADS_VISIBLE_DEVICES", 0x1ED5),
    "iluvatar": ("ILUVATAR_COREX_VISIBLE_DEVICES", 0x1E3E),
}


@pytest.fixture(scope="module")
def db() -> profiles.ProfileDB:
    return profiles.load()


def test_the_database_lists_at_least_25_models_including_every_required_one(
    db: profiles.ProfileDB,
) -> None:
    keys = {p.key for p in db.all()}
    assert len(keys) >= 25
    assert set(REQUIRED_MODELS) <= keys


@pytest.mark.parametrize("key", REQUIRED_MODELS)
def test_every_model_has_its_required_fields_filled(db: profiles.ProfileDB, key: str) -> None:
    p = db.get(key)
    assert p.vram_mib > 0 and p.mem_bandwidth_gbps > 0 and p.tflops_fp16 > 0
    assert p.interconnect_bandwidth_gbps > 0
    assert p.name and p.aliases
    assert p.driver_paths and p.library_paths
    assert all(path.startswith("/") for path in (*p.driver_paths, *p.library_paths))
    assert (p.visible_devices_env, p.pci_vendor_id) == VENDOR_FACTS[p.vendor]


@pytest.mark.parametrize("key", REQUIRED_MODELS)
def test_every_number_has_a_source_url_or_an_explained_unsourced_mark(
    db: profiles.ProfileDB, key: str
) -> None:
    p = db.get(key)
    for field in NUMERIC_FIELDS:
        url = p.sources.get(field)
        assert (url is not None) != (field in p.unsourced), f"{key}.{field}"
        if url is not None:
            assert url.startswith(("https://", "http://")), f"{key}.{field}: {url}"
    assert not p.unsourced or p.notes


def test_the_a100_80g_is_exactly_100_acu_and_acu_scales_with_dense_fp16(
    db: profiles.ProfileDB,
) -> None:
    assert db.get("nvidia/A100-80G").acu == 100.0
    h100 = db.get("nvidia/H100-SXM")
    assert h100.tflops_fp16 == 989.5  # the datasheet's 1,979* sparse figure, halved
    assert h100.acu == pytest.approx(989.5 / 312 * 100)


def test_one_a100_80g_needs_two_910b2_because_of_vram_not_compute(
    db: profiles.ProfileDB,
) -> None:
    result = equivalent(db.get("nvidia/A100-80G"), 1, db.get("huawei/Ascend910B2"))
    assert result.devices == 2
    assert result.exact == pytest.approx(81920 / 65536)
    assert result.arithmetic == (
        "1 × nvidia/A100-80G = 100.0 ACU, 81920 MiB; "
        "huawei/Ascend910B2 = 113.4 ACU, 65536 MiB each "
        "→ ACU needs 0.88, VRAM needs 1.25 → 2 devices"
    )


def test_equivalence_is_driven_by_compute_when_the_target_has_ample_memory(
    db: profiles.ProfileDB,
) -> None:
    result = equivalent(db.get("nvidia/H100-SXM"), 2, db.get("nvidia/H20"))
    assert result.exact == pytest.approx(2 * 989.5 / 148)
    assert result.devices == 14
    assert "2 × nvidia/H100-SXM" in result.arithmetic


def test_equal_devices_convert_one_to_one_without_float_noise(db: profiles.ProfileDB) -> None:
    a800, a100 = db.get("nvidia/A800"), db.get("nvidia/A100-80G")
    assert equivalent(a100, 3, a800).devices == 3
    assert equivalent(a100, 0, a800).devices == 0


def test_100_tflops_fp16_fits_on_one_910b2(db: profiles.ProfileDB) -> None:
    result = convert_amount(100, "tflops-fp16", db.get("huawei/Ascend910B2"))
    assert result.devices == 1
    assert result.exact == pytest.approx(100 / 353.89)
    assert result.arithmetic == (
        "100 TFLOPS FP16; huawei/Ascend910B2 = 353.9 TFLOPS FP16 each → 0.28 → 1 device"
    )


@pytest.mark.parametrize(
    ("amount", "unit", "key", "devices"),
    [
        (250, "acu", "huawei/Ascend910B2", 3),
        (163840, "vram", "huawei/Ascend910B2", 3),
        (40, "tflops-fp32", "nvidia/A100-80G", 3),
        (1000, "tflops-bf16", "nvidia/H200", 2),
    ],
)
def test_amounts_of_every_unit_convert_to_whole_devices(
    db: profiles.ProfileDB, amount: float, unit: str, key: str, devices: int
) -> None:
    assert convert_amount(amount, unit, db.get(key)).devices == devices


def test_a_unit_the_target_lacks_or_an_unknown_unit_is_refused_by_name(
    db: profiles.ProfileDB,
) -> None:
    with pytest.raises(ValueError, match="nvidia/V100 has no TFLOPS BF16"):
        convert_amount(10, "tflops-bf16", db.get("nvidia/V100"))
    with pytest.raises(ValueError, match=r"unknown unit 'tflops-fp8'.*tflops-fp16"):
        convert_amount(10, "tflops-fp8", db.get("nvidia/V100"))
    with pytest.raises(ValueError, match=">= 0"):
        convert_amount(-1, "acu", db.get("nvidia/V100"))


@pytest.mark.parametrize(
    ("vendor", "reported", "key"),
    [
        ("nvidia", "NVIDIA A100-SXM4-80GB", "nvidia/A100-80G"),
        ("nvidia", "NVIDIA A100 80GB PCIe", "nvidia/A100-80G"),
        ("nvidia", "NVIDIA A100-SXM4-40GB", "nvidia/A100-40G"),
        ("nvidia", "NVIDIA H200", "nvidia/H200"),
        ("nvidia", "NVIDIA H100 80GB HBM3", "nvidia/H100-SXM"),
        ("nvidia", "NVIDIA H100 PCIe", "nvidia/H100-PCIe"),
        ("nvidia", "Tesla V100-SXM2-32GB", "nvidia/V100"),
        ("nvidia", "Tesla T4", "nvidia/T4"),
        ("nvidia", "NVIDIA L40S", "nvidia/L40S"),
        ("nvidia", "NVIDIA A800-SXM4-80GB", "nvidia/A800"),
        ("nvidia", "NVIDIA H20", "nvidia/H20"),
        ("huawei", "910B2", "huawei/Ascend910B2"),
        ("huawei", "Ascend910B3", "huawei/Ascend910B3"),
        ("huawei", "Ascend 910B3", "huawei/Ascend910B3"),
        ("huawei", "910B4", "huawei/Ascend910B4"),
        ("huawei", "910B4-1", "huawei/Ascend910B4-1"),
        ("huawei", "Ascend910B4-1", "huawei/Ascend910B4-1"),
        ("huawei", "310P3", "huawei/Ascend310P"),
        ("huawei", "Ascend910A", "huawei/Ascend910A"),
        ("hygon", "K100_AI", "hygon/K100-AI"),
        ("hygon", "Z100L", "hygon/Z100"),
        ("hygon", "K100", "hygon/K100"),
        ("cambricon", "MLU370-X8", "cambricon/MLU370-X8"),
        ("cambricon", "mlu370 x8", "cambricon/MLU370-X8"),
        ("mthreads", "MTT S4000", "mthreads/S4000"),
        ("iluvatar", "Iluvatar BI-V100", "iluvatar/BI-V100"),
        (None, "nvidia a100-sxm4-80gb", "nvidia/A100-80G"),
        ("NVIDIA", "A100-SXM4-80GB", "nvidia/A100-80G"),
    ],
)
def test_tool_reported_names_match_their_profile(
    db: profiles.ProfileDB, vendor: str | None, reported: str, key: str
) -> None:
    found = db.match(vendor, reported)
    assert found is not None and found.key == key


def test_a_name_of_another_vendor_or_an_unknown_name_matches_nothing(
    db: profiles.ProfileDB,
) -> None:
    assert db.match("huawei", "NVIDIA H200") is None
    assert db.match("nvidia", "NVIDIA B200") is None
    assert db.match("hygon", "K100_AI_PRO") is None


def test_pci_ids_find_a_unique_model_and_refuse_to_guess_a_shared_one(
    db: profiles.ProfileDB,
) -> None:
    assert db.by_pci("0x10de", "0x2330") == db.get("nvidia/H100-SXM")
    assert db.by_pci(0x10DE, 0x20B5) == db.get("nvidia/A100-80G")
    assert db.by_pci(0x19E5, 0xD802) is None
    assert {p.model for p in db.all_by_pci(0x19E5, 0xD802)} == {
        "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910B4-1",
    }  # fmt: skip
    assert db.by_pci(0x10DE, 0xFFFF) is None


def test_an_unknown_key_raises_a_key_error_that_lists_close_names(
    db: profiles.ProfileDB,
) -> None:
    with pytest.raises(KeyError) as info:
        db.get("huawei/Ascend910B5")
    message = str(info.value)
    assert "unknown device profile 'huawei/Ascend910B5'" in message
    assert "huawei/Ascend910B2" in message


def test_the_packaged_database_is_loaded_once(db: profiles.ProfileDB) -> None:
    assert profiles.load() is profiles.load()
    assert all(isinstance(p, Profile) for p in db.all())
