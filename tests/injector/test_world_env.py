"""A gang member learns its job and world size from its env at admission:
``HCS_JOB_*`` and torchrun's ``PET_*`` defaults, in every container, through
the real webhook; a value the user set is kept."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

from hcs_bus import vocabulary
from hcs_bus.jobs import JobIdentity
from injector import worlds
from injector.owning import Owners
from tests.injector.conftest import Responder, Webhook, gpu_review, patched, pod_of

JOB_UID = "4b1c3d2e-0000-4000-8000-000000000001"
NAMESPACE = "ml-team"  # the fixture review's


def env_of(container: dict[str, Any]) -> dict[str, str]:
    pairs = [(e["name"], e.get("value", "")) for e in container.get("env") or []]
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), f"an env name twice: {names}"
    return dict(pairs)


def member_review(
    *, notes: dict[str, str], owned: bool = True, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    doc = gpu_review()
    pod = pod_of(doc)
    pod["metadata"]["annotations"].update(notes)
    pod["metadata"]["labels"].update(labels or {})
    if owned:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": JOB_UID,
                "controller": True,
            }
        ]
    return doc


def with_sidekick(doc: dict[str, Any], *, env: list[dict[str, Any]] | None = None) -> None:
    """A second container (asking for nothing) and an init container."""
    spec = pod_of(doc)["spec"]
    sidekick: dict[str, Any] = {"name": "logger", "image": "busybox"}
    if env is not None:
        sidekick["env"] = env
    spec["containers"].append(sidekick)
    spec["initContainers"] = [{"name": "fetch", "image": "busybox"}]


async def test_every_container_of_a_fixed_gang_member_learns_its_job_and_size(
    webhook: Webhook, responder: Responder
) -> None:
    doc = member_review(notes={vocabulary.JOB_SIZE: "4"})
    with_sidekick(doc)
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    pod = patched(doc, response)
    wanted = {
        "HCS_JOB_NAME": "train",
        "HCS_JOB_RUN": f"{NAMESPACE}/train/{JOB_UID}",
        "HCS_JOB_MIN_SIZE": "4",
        "HCS_JOB_MAX_SIZE": "4",
        "PET_NNODES": "4",
        "PET_RDZV_ID": f"{NAMESPACE}_train_{JOB_UID}",
    }
    containers = pod["spec"]["containers"] + pod["spec"]["initContainers"]
    assert [c["name"] for c in containers] == ["trainer", "logger", "fetch"]
    for container in containers:
        env = env_of(container)
        assert {k: env.get(k) for k in wanted} == wanted, container["name"]
        assert "PET_MAX_RESTARTS" not in env  # a fixed gang keeps torchrun's default
    trainer = env_of(pod["spec"]["containers"][0])
    assert trainer["LD_PRELOAD"].endswith("libhcs_interceptor.so")  # the runtime env too


async def test_an_elastic_gang_of_four_to_sixteen_gets_a_node_range_and_restarts(
    webhook: Webhook, responder: Responder
) -> None:
    notes = {vocabulary.JOB_MIN: "4", vocabulary.JOB_MAX: "16"}
    doc = member_review(notes=notes, owned=False, labels={vocabulary.JOB: "train"})
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    env = env_of(patched(doc, response)["spec"]["containers"][0])
    assert env["PET_NNODES"] == "4:16"
    assert (env["HCS_JOB_MIN_SIZE"], env["HCS_JOB_MAX_SIZE"]) == ("4", "16")
    assert env["PET_MAX_RESTARTS"] == str(worlds.ELASTIC_MAX_RESTARTS)
    assert env["HCS_JOB_RUN"] == f"{NAMESPACE}/train/"  # a job named by label: no run
    assert env["PET_RDZV_ID"] == f"{NAMESPACE}_train"
    assert "/" not in env["PET_RDZV_ID"]


async def test_a_job_of_parallelism_sixteen_with_a_least_of_four_is_elastic(
    webhook: Webhook, responder: Responder
) -> None:
    async def get_job(namespace: str, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "uid": JOB_UID},
            "spec": {"parallelism": 16, "completions": 16, "completionMode": "Indexed"},
        }

    webhook.injector.admitter.owners = Owners(get_job, clock=lambda: 0.0)
    doc = member_review(notes={vocabulary.JOB_MIN: "4"})
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    assert responder.requests[-1].gang_size == 16
    env = env_of(patched(doc, response)["spec"]["containers"][0])
    assert env["PET_NNODES"] == "4:16"
    assert (env["HCS_JOB_MIN_SIZE"], env["HCS_JOB_MAX_SIZE"]) == ("4", "16")
    assert env["PET_RDZV_ID"] == f"{NAMESPACE}_train_{JOB_UID}"


async def test_a_value_the_user_set_is_kept_and_reinvocation_adds_nothing(
    webhook: Webhook, responder: Responder
) -> None:
    doc = member_review(notes={vocabulary.JOB_SIZE: "8"})
    trainer = pod_of(doc)["spec"]["containers"][0]
    trainer["env"] = [
        {"name": "PET_NNODES", "value": "2"},
        {"name": "HCS_JOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    with_sidekick(doc, env=[{"name": "PET_RDZV_ID", "value": "mine"}])
    response = await webhook.review(doc)
    assert not [w for w in response.get("warnings", []) if "PET_" in w or "HCS_JOB" in w]
    pod = patched(doc, response)
    trainer_env = env_of(pod["spec"]["containers"][0])
    assert trainer_env["PET_NNODES"] == "2"
    assert pod["spec"]["containers"][0]["env"][1] == trainer["env"][1]  # its valueFrom kept
    assert trainer_env["HCS_JOB_MAX_SIZE"] == "8"
    sidekick = env_of(pod["spec"]["containers"][1])
    assert (sidekick["PET_RDZV_ID"], sidekick["PET_NNODES"]) == ("mine", "8")

    again = copy.deepcopy(doc)
    pod_of(again).clear()
    pod_of(again).update(pod)
    second = await webhook.review(again)
    assert second["allowed"] is True, second
    assert patched(again, second) == pod
    assert len(responder.requests) == 1


async def test_a_pod_of_no_gang_gets_no_job_env(webhook: Webhook, responder: Responder) -> None:
    doc = member_review(notes={vocabulary.JOB_SIZE: "1"})
    env = env_of(patched(doc, await webhook.review(doc))["spec"]["containers"][0])
    assert not [k for k in env if k.startswith(("HCS_JOB_", "PET_"))]


def identity() -> JobIdentity:
    return JobIdentity(namespace="ml", name="train", run="u-1", source="job", size=4)


def test_the_patch_creates_an_absent_env_and_appends_to_one_made_or_present() -> None:
    pod = {
        "spec": {
            "containers": [
                {"name": "a"},
                {"name": "b", "env": [{"name": "X", "value": "1"}]},
                {"name": "c"},
            ]
        }
    }
    made = [{"op": "add", "path": "/spec/containers/2/env", "value": [{"name": "Y", "value": "2"}]}]
    ops = worlds.env_ops(pod, identity=identity(), least=4, most=4, made=made)
    paths = [op["path"] for op in ops]
    assert paths.count("/spec/containers/0/env") == 1  # absent: created whole
    assert "/spec/containers/1/env" not in paths and "/spec/containers/2/env" not in paths
    assert paths.count("/spec/containers/1/env/-") == paths.count("/spec/containers/2/env/-") == 6
    done = jsonpatch.apply_patch(pod, made + ops)
    for container in done["spec"]["containers"]:
        assert env_of(container)["PET_RDZV_ID"] == "ml_train_u-1"
    assert env_of(done["spec"]["containers"][2])["Y"] == "2"
    assert json.dumps(pod).count("PET_") == 0  # the incoming pod is left as it was


def test_the_rendezvous_id_keeps_apart_what_a_plain_dash_join_would_merge() -> None:
    one = JobIdentity(namespace="a-b", name="c", run="u", source="hcs")
    two = JobIdentity(namespace="a", name="b-c", run="u", source="hcs")
    odd = JobIdentity(namespace="ml", name="my job/x", run="", source="kai")
    assert worlds.rendezvous_id(one) != worlds.rendezvous_id(two)
    assert worlds.rendezvous_id(odd) == "ml_my-job-x"
