"""The ComputeQuota CRD: its OpenAPI schema and its x-kubernetes-validations
(CEL, evaluated here with cel-python and the ``quantity`` functions the API
server gives CRD rules) accept old quotas and guarantees under their ceiling,
and refuse a ceiling below the guarantee."""

from __future__ import annotations

from typing import Any

import celpy
import jsonschema
import pytest
from celpy import celtypes

from hcs_bus.units import parse_quantity
from tests.deploy.render import by_kind, render


def crd() -> dict[str, Any]:
    found: dict[str, Any] = by_kind(render("production"), "CustomResourceDefinition")[
        "computequotas.hcs.io"
    ]
    return found


def schema() -> dict[str, Any]:
    found: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return found


def _quantity(value: Any) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(parse_quantity(str(value))))


def _compare(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType((a > b) - (a < b))


def typed(node: dict[str, Any], value: Any) -> Any:
    """``value`` as the API server types it: a ``number`` field is a double."""
    if node.get("type") == "number" and isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        props = node.get("properties") or {}
        extra = node.get("additionalProperties")
        return {
            k: typed(props.get(k) or (extra if isinstance(extra, dict) else {}), v)
            for k, v in value.items()
        }
    return value


def cel_errors(node: dict[str, Any], value: Any) -> list[str]:
    """The messages of every x-kubernetes-validations rule that ``value``
    fails, walking the schema as the API server does."""
    value = typed(node, value)
    env = celpy.Environment()
    out = []
    for rule in node.get("x-kubernetes-validations", []):
        program = env.program(
            env.compile(rule["rule"]), functions={"quantity": _quantity, "compareTo": _compare}
        )
        if not bool(program.evaluate({"self": celpy.json_to_cel(value)})):
            out.append(rule["message"])
    for name, child in (node.get("properties") or {}).items():
        if isinstance(value, dict) and name in value:
            out += cel_errors(child, value[name])
    return out


def quota(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "hcs.io/v1alpha1",
        "kind": "ComputeQuota",
        "metadata": {"name": "q", "namespace": "ml"},
        "spec": spec,
    }


ACCEPTED = [
    pytest.param({"hard": {"vram": "640Gi", "acu": 800}}, id="a quota of before: hard only"),
    pytest.param(
        {"hard": {"vram": "1Ti", "acu": 800}, "guaranteed": {"vram": "640Gi", "acu": 400}},
        id="a guarantee under its ceiling",
    ),
    pytest.param({"guaranteed": {"acu": 400}, "weight": 2.5}, id="a guarantee without a ceiling"),
    pytest.param(
        {
            "guaranteed": {
                "acu": 100,
                "classes": {"nccl": {"acu": 60}, "huawei/Ascend910B2": {"vram": "64Gi"}},
            }
        },
        id="guarantees per library and per class",
    ),
]
REFUSED = [
    pytest.param(
        {"hard": {"acu": 100}, "guaranteed": {"acu": 200}},
        "guaranteed.acu must not be above hard.acu",
        id="an ACU ceiling below the guarantee",
    ),
    pytest.param(
        {"hard": {"vram": "512Gi"}, "guaranteed": {"vram": "1Ti"}},
        "guaranteed.vram must not be above hard.vram",
        id="a VRAM ceiling below the guarantee",
    ),
    pytest.param({"weight": 1}, "a ComputeQuota needs hard", id="neither ceiling nor guarantee"),
    pytest.param({"guaranteed": {"acu": 1}, "weight": 0}, "weight must be above 0", id="weight 0"),
]


@pytest.mark.parametrize("spec", ACCEPTED)
def test_a_valid_quota_passes_the_schema_and_every_rule(spec: dict[str, Any]) -> None:
    obj = quota(spec)
    jsonschema.validate(obj, schema())
    assert cel_errors(schema(), obj) == []


@pytest.mark.parametrize(("spec", "message"), REFUSED)
def test_a_bad_quota_is_refused_by_a_rule_naming_what_is_wrong(
    spec: dict[str, Any], message: str
) -> None:
    errors = cel_errors(schema(), quota(spec))
    assert any(message in e for e in errors), errors


def test_negative_guarantees_and_bad_quantities_are_refused_by_the_schema() -> None:
    for spec in (
        {"guaranteed": {"acu": -1}},
        {"guaranteed": {"vram": "lots"}},
        {"guaranteed": {"classes": {"nccl": {"acu": -5}}}},
        {"hard": {"acu": 1}, "weight": -1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(quota(spec), schema())


def test_the_status_carries_conditions_keyed_by_type() -> None:
    conditions = schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    obj = quota({"guaranteed": {"acu": 10}})
    obj["status"] = {
        "conditions": [
            {
                "type": "GuaranteeFits",
                "status": "False",
                "reason": "GuaranteeExceedsPool",
                "message": "m",
            }
        ]
    }
    jsonschema.validate(obj, schema())
