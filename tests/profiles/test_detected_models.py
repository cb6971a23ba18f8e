"""Models the agent detects resolve to their profiles by the names the parsers
yield, and models with no published figures stay unknown (VRAM only).

Each name goes through the parser that meets it (npu-smi, cnmon) on a
recorded-shape fixture with only the name changed.
"""

from __future__ import annotations

import pytest

from agents.parsing import cnmon, npu_smi
from hcs_bus import profiles
from tests.agents.conftest import fixture_text


@pytest.fixture(scope="module")
def db() -> profiles.ProfileDB:
    return profiles.load()


def _parsed(db: profiles.ProfileDB, tool: str, name: str) -> list:
    if tool == "cnmon":
        text = fixture_text("cnmon-mlu370-x4-v4.txt").replace("MLU370-X4", name)
        parsed = cnmon.parse_table(text, db=db)
    elif name.startswith("Ascend950"):
        text = fixture_text("npu-smi-info-950.txt").replace("Ascend950DT", name)
        parsed = npu_smi.parse_info(text, db=db)
    else:
        text = fixture_text("npu-smi-info-910b.txt").replace("910B2  ", f"{name:<7}")
        parsed = npu_smi.parse_info(text, db=db)
    assert parsed.errors == () and parsed.devices
    return list(parsed.devices)


@pytest.mark.parametrize(
    ("tool", "reported", "key"),
    [
        ("npu-smi", "910B2", "huawei/Ascend910B2"),
        ("npu-smi", "910B4", "huawei/Ascend910B4"),
        ("npu-smi", "910B4-1", "huawei/Ascend910B4-1"),
        ("npu-smi", "Ascend950DT", "huawei/Ascend950DT"),
        ("npu-smi", "Ascend950PR", "huawei/Ascend950PR"),
        ("cnmon", "MLU370-X8", "cambricon/MLU370-X8"),
        ("cnmon", "MLU370-X4", "cambricon/MLU370-X4"),
        ("cnmon", "MLU370-S4", "cambricon/MLU370-S4"),
        ("cnmon", "MLU590-M9", "cambricon/MLU590"),
        ("cnmon", "MLU590-H8", "cambricon/MLU590-H8"),
    ],
)
def test_a_detected_model_resolves_to_its_profile_and_its_acu(
    db: profiles.ProfileDB, tool: str, reported: str, key: str
) -> None:
    profile = db.get(key)
    for device in _parsed(db, tool, reported):
        assert device.model == profile.model, reported
        assert device.compute.acu_profile == round(profile.acu, 2) > 0
        assert device.compute.tflops_fp16_profile == profile.tflops_fp16


@pytest.mark.parametrize(
    ("tool", "reported"),
    [
        # no public primary figure for their compute (see the fixtures' README and
        # hcs_bus/data/profiles.yaml): named as the tool names them, VRAM only
        ("cnmon", "MLU590-M9DG"),
    ],
)
def test_a_model_without_published_figures_offers_its_vram_and_no_compute(
    db: profiles.ProfileDB, tool: str, reported: str
) -> None:
    for device in _parsed(db, tool, reported):
        assert device.model == reported
        assert device.vram_total_mib > 0
        assert (device.compute.acu_profile, device.compute.tflops_fp16_profile) == (0, 0)


def test_the_910b4_1_is_a_64_gib_910b4(db: profiles.ProfileDB) -> None:
    b4_1, b4 = db.get("huawei/Ascend910B4-1"), db.get("huawei/Ascend910B4")
    assert (b4_1.vram_mib, b4.vram_mib) == (65536, 32768)
    assert (b4_1.tflops_fp16, b4_1.tops_int8) == (b4.tflops_fp16, b4.tops_int8)
    assert db.match("huawei", "Ascend910B4-1") is b4_1
    assert db.match("huawei", "Ascend910B4") is b4


# (cube cores, cube_freq MHz) of each chip's CANN platform file (hicann/runtime,
# src/platform/platform_config/cann/<SoC>.ini), the source the profiles cite
CANN_CUBES = {
    "huawei/Ascend910B1": (24, 1850),
    "huawei/Ascend910B2": (24, 1800),
    "huawei/Ascend910B3": (20, 1800),
    "huawei/Ascend910B4": (20, 1500),
    "huawei/Ascend910B4-1": (20, 1500),
    "huawei/Ascend910_9391": (24, 1850),
    "huawei/Ascend910_9392": (24, 1850),
    "huawei/Ascend910_9381": (24, 1800),
    "huawei/Ascend910_9382": (24, 1800),
    "huawei/Ascend910_9372": (20, 1800),
    "huawei/Ascend910_9362": (20, 1500),
    "huawei/Ascend910_9363": (20, 1500),
    "huawei/Ascend910C-die": (20, 1500),  # an A3 die of unknown bin: the least
}
# the 950 (cann-dev/ files): npu-smi names no bin, so the least product bin
CANN_950 = {"huawei/Ascend950PR": (28, 1650), "huawei/Ascend950DT": (28, 1650)}


@pytest.mark.parametrize("key", sorted(CANN_CUBES | CANN_950))
def test_an_ascend_peak_is_its_cube_cores_at_their_clock(db: profiles.ProfileDB, key: str) -> None:
    cores, mhz = (CANN_CUBES | CANN_950)[key]
    profile = db.get(key)
    # each AI core a 16x16x16 cube, two operations per multiply-add; BF16 at the FP16 rate
    assert profile.tflops_fp16 == pytest.approx(cores * 16**3 * 2 * mhz / 1e6, abs=0.01)
    assert profile.tflops_bf16 == profile.tflops_fp16
    assert "hicann/runtime" in profile.sources["tflops_fp16"]
    if key in CANN_CUBES:  # INT8 at twice it (DT_INT8=16,32,16); the 950's files give none
        assert profile.tops_int8 == pytest.approx(2 * profile.tflops_fp16, abs=0.01)
    else:
        assert profile.tops_int8 is None


def test_first_generation_910_parts_never_get_more_than_their_cubes(
    db: profiles.ProfileDB,
) -> None:
    # 910ProA 32 cores at 1.1 GHz, 910ProB 30 at 1.15, 910PremiumA 32 at 1.22 (CANN's files):
    # they share the 910A's profile, a floor for each
    for name, (cores, mhz) in {
        "910ProA": (32, 1100),
        "910ProB": (30, 1150),
        "910PremiumA": (32, 1220),
    }.items():
        profile = db.match("huawei", name)
        assert profile is not None and profile.model == "Ascend910A", name
        assert profile.tflops_fp16 <= cores * 16**3 * 2 * mhz / 1e6, name


# (clusters of 4 MLU cores, FP16 multiply-adds per core and cycle, clock GHz) from
# Cambricon's driver tables (attr/cndrv_attr_mlu*.c, mcu/cndrv_mcu_info.c)
CAMBRICON_CORES = {
    "cambricon/MLU370-X4": (8, 1536, 1.0),
    "cambricon/MLU370-S4": (6, 1536, 1.0),
    "cambricon/MLU590": (12, 2048, 1.6),
    "cambricon/MLU590-H8": (12, 2048, 1.5),
}


@pytest.mark.parametrize("key", sorted(CAMBRICON_CORES))
def test_a_cambricon_peak_is_its_cores_at_their_clock(db: profiles.ProfileDB, key: str) -> None:
    clusters, macs, ghz = CAMBRICON_CORES[key]
    profile = db.get(key)
    assert profile.tflops_fp16 == pytest.approx(clusters * 4 * macs * 2 * ghz / 1e3, abs=0.01)
    assert profile.tflops_bf16 == profile.tflops_fp16
    # INT8: 4096 multiply-adds a core on both generations; FP32 a quarter of FP16's
    assert profile.tops_int8 == pytest.approx(clusters * 4 * 4096 * 2 * ghz / 1e3, abs=0.01)
    assert profile.tflops_fp32 == pytest.approx(profile.tflops_fp16 / 4, abs=0.01)
    assert "cambricon-mlu-driver" in profile.sources["tflops_fp16"]


def test_an_mlu370_x8_device_is_one_chip_half_the_card(db: profiles.ProfileDB) -> None:
    # cnmon lists each of an X8 card's two chips (23,374 MiB each): a device is promised
    # half the card's 96 TFLOPS FP16 and 48 GB, never the whole card
    [device, *_] = cnmon.parse_table(fixture_text("cnmon-mlu370-x8.txt"), db=db).devices
    x8 = db.get("cambricon/MLU370-X8")
    assert device.model == "MLU370-X8" and device.vram_total_mib <= x8.vram_mib == 24 * 1024
    assert (x8.tflops_fp16, x8.tops_int8) == (96 / 2, 256 / 2)
    assert x8.tflops_fp16 <= 4 * 4 * 1536 * 2 * 1.0 / 1e3  # 4 clusters at 1.0 GHz
