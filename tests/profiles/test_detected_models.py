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
        ("cnmon", "MLU370-X8", "cambricon/MLU370-X8"),
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
        ("cnmon", "MLU370-X4"),
        ("cnmon", "MLU590-M9DG"),
        ("npu-smi", "Ascend950DT"),
        ("npu-smi", "910ProB"),
    ],
)
def test_a_model_without_published_figures_offers_its_vram_and_no_compute(
    db: profiles.ProfileDB, tool: str, reported: str
) -> None:
    for device in _parsed(db, tool, reported):
        assert device.model == reported
        assert device.vram_total_mib > 0
        assert (device.compute.acu_profile, device.compute.tflops_fp16_profile) == (0, 0)


def test_the_910b4_1_is_a_64_gib_910b4_and_never_promises_more_compute(
    db: profiles.ProfileDB,
) -> None:
    b4_1, b4 = db.get("huawei/Ascend910B4-1"), db.get("huawei/Ascend910B4")
    assert (b4_1.vram_mib, b4.vram_mib) == (65536, 32768)
    # 20 AI cores x a 16x16x16 cube x 2 x 1.5 GHz, from CANN's platform file
    assert b4_1.tflops_fp16 == pytest.approx(20 * 16**3 * 2 * 1.5e9 / 1e12)
    assert b4_1.tflops_fp16 <= b4.tflops_fp16
    assert db.match("huawei", "Ascend910B4-1") is b4_1
    assert db.match("huawei", "Ascend910B4") is b4
