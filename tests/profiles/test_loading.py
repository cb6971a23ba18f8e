"""A bad profile database file is refused with an error naming model and field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from hcs_bus import profiles
from hcs_bus.errors import ConfigError


def _packaged() -> dict:
    text = (Path(profiles.__file__).parent / "data" / "profiles.yaml").read_text()
    data: dict = yaml.safe_load(text)
    return data


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _entry(data: dict, key: str) -> dict:
    vendor, model = key.split("/")
    return next(e for e in data["profiles"] if (e["vendor"], e["model"]) == (vendor, model))


def test_a_copy_of_the_packaged_file_loads_from_a_path(tmp_path: Path) -> None:
    db = profiles.load(_write(tmp_path, _packaged()))
    assert db.get("nvidia/A100-80G").acu == 100.0
    assert db is not profiles.load()


def test_a_wrongly_typed_field_names_the_model_and_the_field(tmp_path: Path) -> None:
    data = _packaged()
    _entry(data, "huawei/Ascend910B3")["vram_mib"] = "64Gi"
    with pytest.raises(ConfigError, match=r"huawei/Ascend910B3.*vram_mib"):
        profiles.load(_write(tmp_path, data))


def test_an_unknown_field_is_refused_by_name(tmp_path: Path) -> None:
    data = _packaged()
    _entry(data, "nvidia/T4")["tflops_fp8"] = 1.0
    with pytest.raises(ConfigError, match=r"nvidia/T4.*tflops_fp8"):
        profiles.load(_write(tmp_path, data))


def test_a_number_without_source_or_unsourced_mark_is_refused(tmp_path: Path) -> None:
    data = _packaged()
    del _entry(data, "nvidia/L40S")["sources"]["tops_int8"]
    with pytest.raises(ConfigError, match=r"nvidia/L40S: tops_int8 has neither a source"):
        profiles.load(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e["unsourced"].remove("bench_tflops_fp16"), "has neither a source"),
        (lambda e: e.update(bench_tflops_fp16=1200), "must be positive and at most .* 989.5"),
        (lambda e: e.update(bench_tflops_fp16=0), "must be positive"),
    ],
    ids=["unmarked", "above-the-peak", "zero"],
)
def test_a_benchmark_figure_needs_a_mark_and_a_value_up_to_the_peak(
    edit: Callable[[dict], object], message: str, tmp_path: Path
) -> None:
    data = _packaged()
    edit(_entry(data, "nvidia/H100-SXM"))
    with pytest.raises(ConfigError, match=rf"nvidia/H100-SXM: bench_tflops_fp16 {message}"):
        profiles.load(_write(tmp_path, data))


def test_an_unknown_interconnect_is_refused(tmp_path: Path) -> None:
    data = _packaged()
    _entry(data, "mthreads/S4000")["interconnect"] = "mtlink"
    with pytest.raises(ConfigError, match=r"mthreads/S4000.*interconnect"):
        profiles.load(_write(tmp_path, data))


def test_an_alias_naming_two_models_is_refused(tmp_path: Path) -> None:
    data = _packaged()
    _entry(data, "huawei/Ascend910B1")["aliases"].append("910B2")
    with pytest.raises(
        ConfigError, match=r"Ascend910B2.* same to match\(\) as huawei/Ascend910B1's '910B2'"
    ):
        profiles.load(_write(tmp_path, data))


def test_a_reference_that_is_not_312_tflops_is_refused(tmp_path: Path) -> None:
    data = _packaged()
    _entry(data, "nvidia/A100-80G")["tflops_fp16"] = 624
    with pytest.raises(ConfigError, match=r"nvidia/A100-80G: tflops_fp16 must be 312"):
        profiles.load(_write(tmp_path, data))


def test_a_missing_file_or_broken_yaml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        profiles.load(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match="not YAML"):
        profiles.load(broken)
