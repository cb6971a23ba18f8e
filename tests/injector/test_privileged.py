"""A pod HCS places holds no container that reaches past its device share:
none privileged, none with a dangerous added capability, no host PID or IPC
namespace, unless its service account is allow-listed. Pods HCS does not
place are left alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from hcs_bus.errors import ConfigError
from hcs_bus.settings import Settings, replace
from injector import guarding
from tests.injector.conftest import Responder, Webhook, gpu_review, plain_review, pod_of
from tests.metering import counted

SIDECAR = {"name": "log-shipper", "image": "fluent/fluent-bit:3.0"}


def with_sidecar(doc: dict[str, Any], **security: Any) -> dict[str, Any]:
    pod_of(doc)["spec"]["containers"].append({**SIDECAR, "securityContext": security})
    return doc


@pytest.mark.parametrize(
    ("security", "named"),
    [
        ({"privileged": True}, "spec.containers[1] (log-shipper) securityContext.privileged"),
        (
            {"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}},
            "spec.containers[1] (log-shipper) securityContext.capabilities.add: SYS_ADMIN",
        ),
        ({"capabilities": {"add": ["CAP_SYS_PTRACE"]}}, "capabilities.add: CAP_SYS_PTRACE"),
        ({"capabilities": {"add": ["all"]}}, "capabilities.add: all"),
        ({"capabilities": {"add": ["BPF"]}}, "capabilities.add: BPF"),
    ],
)
async def test_a_privileged_side_container_in_a_pod_hcs_places_is_refused_naming_it_and_the_field(
    webhook: Webhook, responder: Responder, security: dict[str, Any], named: str
) -> None:
    before = counted("hcs_injector_refusals", reason="privileged")
    with capture_logs() as logs:
        response = await webhook.review(with_sidecar(gpu_review(), **security))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert named in message and "log-shipper" in message
    assert "ml-team/default" in message and "privileged_service_accounts" in message
    assert responder.requests == []
    assert counted("hcs_injector_refusals", reason="privileged") == before + 1
    (logged,) = [e for e in logs if e["event"] == "privileged_pod_refused"]
    assert logged["account"] == "ml-team/default"
    assert [e for e in logs if e.get("log_level") in ("warning", "error")] == [logged]


@pytest.mark.parametrize("key", ["hostPID", "hostIPC"])
async def test_a_pod_hcs_places_on_the_hosts_pid_or_ipc_namespace_is_refused(
    webhook: Webhook, responder: Responder, key: str
) -> None:
    doc = gpu_review()
    pod_of(doc)["spec"][key] = True
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert f"spec.{key}: true" in response["status"]["message"]
    assert responder.requests == []


async def test_a_privileged_init_container_is_refused_and_every_finding_is_named(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    spec = pod_of(doc)["spec"]
    spec["hostPID"] = True
    spec["initContainers"] = [{"name": "setup", "securityContext": {"privileged": True}}]
    response = await webhook.review(doc)
    message = response["status"]["message"]
    assert response["allowed"] is False
    assert "spec.hostPID: true" in message
    assert "spec.initContainers[0] (setup) securityContext.privileged: true" in message


async def test_the_container_asking_for_devices_may_not_be_privileged_either(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod_of(doc)["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert (
        "spec.containers[0] (trainer) securityContext.privileged" in response["status"]["message"]
    )


async def test_a_pod_whose_service_account_is_allow_listed_is_placed_privileged(
    webhook_factory: Callable[..., Any], responder: Responder
) -> None:
    doc = with_sidecar(gpu_review(), privileged=True)
    spec = pod_of(doc)["spec"]
    spec["serviceAccountName"] = spec["serviceAccount"] = "dcgm-exporter"
    spec["hostPID"] = True
    async with webhook_factory(privileged_service_accounts=["ml-team/dcgm-exporter"]) as hook:
        response = await hook.review(doc)
        assert response["allowed"] is True and "patch" in response
        assert len(responder.requests) == 1
        doc["request"]["namespace"] = pod_of(doc)["metadata"]["namespace"] = "other-team"
        elsewhere = await hook.review(doc)  # the same name in another namespace is not listed
    assert elsewhere["allowed"] is False
    assert "other-team/dcgm-exporter" in elsewhere["status"]["message"]


async def test_a_pod_without_a_service_account_name_is_judged_as_default(
    webhook_factory: Callable[..., Any], responder: Responder
) -> None:
    doc = with_sidecar(gpu_review(), privileged=True)
    spec = pod_of(doc)["spec"]
    del spec["serviceAccountName"], spec["serviceAccount"]
    async with webhook_factory(privileged_service_accounts=["ml-team/default"]) as hook:
        assert (await hook.review(doc))["allowed"] is True


async def test_a_privileged_pod_hcs_does_not_place_is_left_untouched(
    webhook: Webhook, responder: Responder
) -> None:
    doc = with_sidecar(plain_review(), privileged=True, capabilities={"add": ["SYS_ADMIN"]})
    pod_of(doc)["spec"]["hostPID"] = True
    response = await webhook.review(doc)
    assert response["allowed"] is True and "patch" not in response
    assert responder.requests == []


@pytest.mark.parametrize(
    "security",
    [
        {"privileged": False},
        {"allowPrivilegeEscalation": True},
        {"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL"]}},
        {"capabilities": {"drop": ["SYS_ADMIN"]}},
    ],
)
async def test_harmless_security_contexts_are_placed(
    webhook: Webhook, responder: Responder, security: dict[str, Any]
) -> None:
    response = await webhook.review(with_sidecar(gpu_review(), **security))
    assert response["allowed"] is True and "patch" in response


@pytest.mark.parametrize(
    ("pod", "found"),
    [
        ({}, []),
        ({"spec": "nonsense"}, []),
        ({"spec": {"containers": "nonsense", "hostPID": "yes"}}, []),
        ({"spec": {"containers": [{"name": "a", "securityContext": "x"}]}}, []),
        (
            {"spec": {"containers": [{"securityContext": {"capabilities": {"add": "ALL"}}}]}},
            [],
        ),
        (
            {
                "spec": {
                    "ephemeralContainers": [
                        {"name": "dbg", "securityContext": {"privileged": True}}
                    ]
                }
            },
            ["spec.ephemeralContainers[0] (dbg) securityContext.privileged: true"],
        ),
        (
            {
                "spec": {
                    "containers": [
                        {
                            "name": "a",
                            "securityContext": {"capabilities": {"add": [" cap_sys_module "]}},
                        }
                    ]
                }
            },
            ["spec.containers[0] (a) securityContext.capabilities.add:  cap_sys_module "],
        ),
    ],
)
def test_privileges_reads_only_what_is_there_and_well_formed(
    pod: dict[str, Any], found: list[str]
) -> None:
    assert guarding.privileges(pod) == found


def test_the_allow_list_takes_namespace_slash_name_and_refuses_anything_else() -> None:
    settings = replace(Settings(), injector={"privileged_service_accounts": ["mon/dcgm"]})
    assert settings.injector.privileged_service_accounts == ("mon/dcgm",)
    assert Settings().injector.privileged_service_accounts == ()
    for bad in ["dcgm", "system:serviceaccount:mon:dcgm", "mon/dcgm/x", "/dcgm", "mon/"]:
        with pytest.raises(ConfigError, match="privileged_service_accounts"):
            replace(Settings(), injector={"privileged_service_accounts": [bad]})
