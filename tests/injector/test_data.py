"""Data files decode strictly and cover every vendor; pointers escape."""

from __future__ import annotations

import jsonpatch
import pytest

from hcs_bus.demands import DemandError, read_policy
from hcs_bus.errors import ConfigError
from injector import rebinds as rebinding
from injector import runtimes
from injector.guarding import is_reserved, reserved_changes
from injector.patches import Patch, pointer


def test_pointer_escapes_slash_and_tilde_and_jsonpatch_agrees() -> None:
    assert pointer("metadata", "annotations", "hcs.io/a~b") == "/metadata/annotations/hcs.io~1a~0b"
    patch = Patch()
    patch.set_key("/metadata/annotations", {}, "hcs.io/a~b", "v")
    assert jsonpatch.apply_patch({"metadata": {"annotations": {}}}, patch.ops) == {
        "metadata": {"annotations": {"hcs.io/a~b": "v"}}
    }


def test_patch_creates_missing_parents_instead_of_appending_to_nothing() -> None:
    patch = Patch()
    patch.append_all("/spec/volumes", None, [{"name": "a"}, {"name": "b"}])
    patch.set_key("/metadata/annotations", None, "hcs.io/plan", "{}")
    doc = jsonpatch.apply_patch({"metadata": {}, "spec": {}}, patch.ops)
    assert doc == {
        "metadata": {"annotations": {"hcs.io/plan": "{}"}},
        "spec": {"volumes": [{"name": "a"}, {"name": "b"}]},
    }


def test_runtime_profiles_cover_every_vendor_of_the_profile_database() -> None:
    profiles = pytest.importorskip("hcs_bus.profiles")
    db = profiles.load()
    loaded = runtimes.load()
    for profile in db.all():
        runtime = loaded.vendor(profile.vendor)
        if runtime.devices.via == "host-path":
            # every device node is there: the library's own env must narrow it
            assert profile.visible_devices_env in runtime.visible_devices_env, profile.key
        else:
            # the runtime adds only the bound devices, which it reads from its env
            assert runtime.runtime_class and runtime.visible_devices_env, profile.key


def test_runtime_file_with_an_unknown_key_is_refused() -> None:
    text = (
        (runtimes.DATA / "runtimes.yaml")
        .read_text()
        .replace("    runtime_class: nvidia", "    runtime_klass: nvidia")
    )
    with pytest.raises(ConfigError, match="runtime_klass"):
        runtimes.parse(text)


def test_runtime_env_from_a_user_settable_annotation_is_refused() -> None:
    text = (
        (runtimes.DATA / "runtimes.yaml")
        .read_text()
        .replace("hcs.io/collective-ib-disable", "hcs.io/vendors")
    )
    with pytest.raises(ConfigError, match="not a reserved"):
        runtimes.parse(text)


def test_rebinding_placeholder_must_be_a_declared_parameter() -> None:
    text = (rebinding.DATA / "rebinding.yaml").read_text().replace("{port}", "{prot}", 1)
    with pytest.raises(ConfigError, match="unknown placeholder"):
        rebinding.parse(text)


def test_policy_annotations_are_user_settable_and_the_rest_reserved() -> None:
    assert not is_reserved("hcs.io/vendors")
    assert not is_reserved("hcs.io/engine-port")
    assert is_reserved("hcs.io/devices") and is_reserved("hcs.io/some-future-thing")
    assert not is_reserved("example.com/devices")
    assert reserved_changes({"hcs.io/devices": "1"}, {"hcs.io/devices": "0"}) == ["hcs.io/devices"]
    assert reserved_changes({"hcs.io/vendors": "x"}, {}) == []


def test_policy_is_read_from_annotations() -> None:
    policy = read_policy(
        {
            "hcs.io/vendors": "nvidia, huawei",
            "hcs.io/substitution": "allow",
            "hcs.io/topology": "high-bandwidth",
            "hcs.io/job": "llama",
        }
    )
    assert policy.vendors == ("nvidia", "huawei")
    assert (policy.substitution, policy.topology) == ("allow", "high-bandwidth")
    assert policy.job == "llama"
    with pytest.raises(DemandError, match=r"hcs\.io/topology"):
        read_policy({"hcs.io/topology": "ring"})


def test_deploy_manifests_validate_against_the_kubernetes_schema() -> None:
    import pathlib

    import kubernetes_validate
    import yaml

    deploy = pathlib.Path(__file__).parents[2] / "deploy"
    kinds = []
    # the webhook's own folder applies on the e2e tier's v1.26; the native
    # reserved-annotation guard (ValidatingAdmissionPolicy) needs 1.30
    for folder, version in (
        (deploy / "webhook", "1.26"),
        (deploy / "components" / "kubernetes-1.30", "1.30"),
    ):
        for path in sorted(p for p in folder.glob("*.yaml") if p.name != "kustomization.yaml"):
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict):  # a JSON patch file is a list
                    kubernetes_validate.validate(doc, version, strict=True)
                    kinds.append(doc["kind"])
    assert sorted(kinds) == [
        "MutatingWebhookConfiguration",
        *["ValidatingAdmissionPolicy"] * 3,
        *["ValidatingAdmissionPolicyBinding"] * 3,
    ]


def test_the_native_guard_lets_through_at_create_what_the_webhook_writes_and_users_may_set() -> (
    None
):
    """The 1.30 ValidatingAdmissionPolicy mirrors injector/guarding.py: a key
    the webhook writes at CREATE but the policy refuses would refuse every pod
    the webhook admits (it runs after the webhook)."""
    import pathlib
    import re

    import yaml

    from injector.guarding import USER_ANNOTATIONS, WRITTEN_AT_CREATE

    path = (
        pathlib.Path(__file__).parents[2]
        / "deploy/components/kubernetes-1.30/reserved-annotations-policy.yaml"
    )
    policy = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"].endswith("Policy"))
    lists = {
        v["name"]: set(re.findall(r"'([^']+)'", v["expression"]))
        for v in policy["spec"]["variables"]
    }
    assert lists["admitted"] == set(WRITTEN_AT_CREATE)
    assert lists["userKeys"] == set(USER_ANNOTATIONS)
