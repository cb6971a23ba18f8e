"""``hcs models`` lists what the profile database knows; ``hcs convert``
takes VRAM and model names as a user types them."""

from __future__ import annotations

import json

import pytest

from hcs_bus import profiles
from tests.cli.running import hcs


def test_models_lists_every_known_model_with_vendor_vram_fp16_and_acu() -> None:
    done = hcs("models")
    assert done.code == 0, done.err
    lines = done.out.strip().splitlines()
    assert lines[0].split() == ["MODEL", "VENDOR", "VRAM", "FP16", "TFLOPS", "ACU"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    db = profiles.load()
    assert set(rows) == {p.key for p in db.all()}
    for p in db.all():
        vendor, vram, fp16, acu = rows[p.key]
        assert vendor == p.vendor
        assert vram == f"{p.vram_mib // 1024}Gi"
        assert float(fp16) == pytest.approx(p.tflops_fp16, abs=0.005)
        assert float(acu) == pytest.approx(p.acu, abs=0.05)
    assert lines[-1].startswith(f"{len(db.all())} models")


def test_models_as_json_filtered_by_vendor_in_any_case() -> None:
    done = hcs("models", "--vendor", "HUAWEI", "--json")
    assert done.code == 0, done.err
    found = json.loads(done.out)
    assert found and {m["vendor"] for m in found} == {"huawei"}
    a910b2 = next(m for m in found if m["model"] == "huawei/Ascend910B2")
    # 353.89 TFLOPS FP16: 24 cube cores at 1.8 GHz (CANN's platform file)
    assert a910b2["vram_mib"] == 65536 and a910b2["acu"] == pytest.approx(113.4, abs=0.05)


@pytest.mark.parametrize("amount", ["16Gi", "16384Mi", "17180Mi"])
def test_convert_takes_vram_as_a_quantity_with_its_unit(amount: str) -> None:
    done = hcs("convert", amount, "vram", "--to", "huawei/Ascend910B2")
    assert done.code == 0, done.err
    assert done.out.strip().splitlines()[-1] == "= 1 × huawei/Ascend910B2"


def test_convert_of_16gi_and_16384mi_agree() -> None:
    gib = hcs("convert", "160Gi", "vram", "--to", "nvidia/A100-80G")
    mib = hcs("convert", "163840Mi", "VRAM", "--to", "nvidia/A100-80G")
    assert gib.code == mib.code == 0, gib.err + mib.err
    assert gib.out == mib.out
    assert gib.out.strip().endswith("= 2 × nvidia/A100-80G")


def test_convert_takes_model_names_in_any_case_like_place() -> None:
    exact = hcs("convert", "2", "nvidia/A100-80G", "--to", "hygon/K100")
    loose = hcs("convert", "2", "NVIDIA/a100-80g", "--to", "HYGON/k100")
    assert exact.code == loose.code == 0, exact.err + loose.err
    assert exact.out == loose.out
    assert exact.out.strip().endswith("× hygon/K100")
