"""The scheduler's pod watch decodes each Pod no further than the fields its
consumers read (``hcs_bus.kube``'s ``_WatchedPod``): a Pod as kube-apiserver
sends it (managedFields, volumes, env, probes, conditions, containerStatuses)
is read by the release, ``PendingPods`` and the stranding rules exactly as the
whole Pod is, whether it came in the first list or on the watch."""

from __future__ import annotations

import asyncio
import copy
import json
from types import SimpleNamespace
from typing import Any, cast

import msgspec

from hcs_bus import kube as kubes
from hcs_bus import tasks
from hcs_bus.kube import Kube
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger import release_loop as watching
from scheduler.ledger.reservation_store import Booker
from scheduler.plan import gang_records as gangs
from scheduler.plan.pods import pod_info_from_dict
from scheduler.replan import rules as replanning
from scheduler.replan.pending_pods import PendingPods
from scheduler.view.state import ClusterState
from tests.apiserver import ApiServer
from tests.scheduler.helpers import until

NS = "ml-team"
SCHED = "hcs-scheduler"
PLAN = {
    "vendor": "nvidia",
    "model": "A100-80G",
    "devices": 2,
    "vram_mib_per_device": 16384,
    "whole_device": False,
    "acu_per_device": 0.0,
}
JOB_UID = "0d6f3c1e-5b7a-4e8f-9a2b-3c4d5e6f7a8b"
RESOURCES = {
    "limits": {"cpu": "8", "memory": "32Gi", "ai.compute/vram": "32Gi", "ai.compute/devices": "2"},
    "requests": {
        "cpu": "4",
        "memory": "16Gi",
        "ai.compute/vram": "32Gi",
        "ai.compute/devices": "2",
    },
}
INIT_RESOURCES = {"limits": {"ai.compute/acu": "10"}, "requests": {"ai.compute/acu": "10"}}


def _container(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    """A container with everything a real one carries besides its resources."""
    return {
        "name": name,
        "image": "registry.example.com/ml/trainer:2.4.1",
        "command": ["python", "-m", "trainer.main"],
        "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(6)]
        + [
            {
                "name": "HCS_NODE_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
            }
        ],
        "resources": copy.deepcopy(resources),
        "ports": [{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
            "periodSeconds": 10,
        },
        "volumeMounts": [
            {
                "name": "kube-api-access-7xk2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def _full_pod(name: str) -> dict[str, Any]:
    """A pending rank of a Job as the injector leaves it and the API server
    sends it: every field a consumer reads, and the many it does not."""
    spec: dict[str, Any] = {
        "volumes": [
            {
                "name": "kube-api-access-7xk2p",
                "projected": {
                    "defaultMode": 420,
                    "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "t"}}],
                },
            },
            {"name": "data", "persistentVolumeClaim": {"claimName": "trainer-data"}},
        ],
        "initContainers": [_container("warmup", INIT_RESOURCES)],
        "containers": [_container("trainer", RESOURCES), _container("sidecar", {})],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "schedulerName": SCHED,
        "schedulingGates": [{"name": "example.com/quota"}],
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "hcs.io/model", "operator": "In", "values": ["A100-80G"]}
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                ]
            },
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "priority": 1000,
        "priorityClassName": "training",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    submitted = {"annotations": {"hcs.io/vendors": "nvidia"}, "spec": copy.deepcopy(spec)}
    return {
        "metadata": {
            "name": name,
            "generateName": "train-",
            "namespace": NS,
            "labels": {"app": "train", "batch.kubernetes.io/job-name": "train"},
            "annotations": {
                "hcs.io/plan": json.dumps(PLAN),
                "hcs.io/plan-sig": "v1:4c1b0d6e2f9a8b7c6d5e4f3a2b1c0d9e",
                "hcs.io/traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "hcs.io/pledge": f"pl-{name}",
                "hcs.io/vendors": "nvidia",
                "hcs.io/substitution": "allow",
                "hcs.io/resume-run": " run-0 ",
                "hcs.io/gang": f"{NS}/train/{JOB_UID}",
                "hcs.io/replan": "recreate",
                "hcs.io/submitted": json.dumps(submitted),
                "batch.kubernetes.io/job-completion-index": "1",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": JOB_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-07-20T09:14:03Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"trainer"}': {".": {}}}}},
                }
            ],
        },
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SchedulingGated",
                    "lastProbeTime": None,
                    "lastTransitionTime": "2026-07-20T09:14:03Z",
                }
            ],
            "qosClass": "Burstable",
        },
    }


def _running(pod: dict[str, Any]) -> None:
    """What binding and the kubelet make of the pod."""
    pod["spec"]["nodeName"] = "gpu-node-017"
    pod["spec"].pop("schedulingGates", None)
    pod["status"] = {
        "phase": "Running",
        "hostIP": "10.0.3.17",
        "podIP": "10.244.1.7",
        "startTime": "2026-07-20T09:14:05Z",
        "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}],
        "containerStatuses": [
            {
                "name": "trainer",
                "state": {"running": {"startedAt": "2026-07-20T09:14:08Z"}},
                "ready": True,
                "restartCount": 0,
                "image": "registry.example.com/ml/trainer:2.4.1",
                "imageID": "registry.example.com/ml/trainer@sha256:" + "ab" * 32,
                "containerID": "containerd://" + "cd" * 32,
            }
        ],
        "qosClass": "Burstable",
    }


def _reads(pod: dict[str, Any], kind: str = "MODIFIED") -> dict[str, Any]:
    """Everything a consumer of the pod watch makes of one event's pod."""
    return {
        "release": watching.release_reason(kind, pod),
        "ref": watching.pod_ref(pod),
        "pledge": pledges.pledge_of(pod),
        "pending": replanning.pending(pod, scheduler_name=SCHED),
        "info": pod_info_from_dict(pod),
        "gang": gangs.gang_key_of(pod),
        "owner": replanning.controller(pod["metadata"]),
        "recreate": replanning.recreatable(pod["metadata"]),
        "identity": kubes._identity(pod)["metadata"]["uid"],
    }


async def _collect(kube: Kube, seen: list[tuple[str, dict[str, Any]]]) -> None:
    async for kind, pod in kube.watch_pods(field_selector=f"spec.schedulerName={SCHED}"):
        seen.append((kind, pod))


async def test_a_pod_listed_or_watched_keeps_only_and_all_that_the_scheduler_reads(
    apiserver: ApiServer, kube: Kube
) -> None:
    listed = apiserver.store("pods", (NS, "train-0"), _full_pod("train-0"))
    seen: list[tuple[str, dict[str, Any]]] = []
    task = tasks.start(_collect(kube, seen), name="test:pod-watch-fields")
    try:
        await until(lambda: len(seen) == 1)
        await apiserver.until_watched()
        watched = apiserver.store("pods", (NS, "train-1"), _full_pod("train-1"))
        await until(lambda: len(seen) == 2)
    finally:
        await tasks.stop(task)
    assert [(kind, pod["metadata"]["name"]) for kind, pod in seen] == [
        ("ADDED", "train-0"),
        ("ADDED", "train-1"),
    ]
    for (_, pod), full in zip(seen, (listed, watched), strict=True):
        assert _reads(pod) == _reads(full)
        assert set(pod) == {"metadata", "spec", "status"}
        assert set(pod["metadata"]) == {
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "labels",
            "annotations",
            "ownerReferences",
        }
        assert pod["metadata"]["annotations"] == full["metadata"]["annotations"]
        assert pod["metadata"]["ownerReferences"] == full["metadata"]["ownerReferences"]
        assert pod["spec"] == {
            "initContainers": [{"name": "warmup", "resources": INIT_RESOURCES}],
            "containers": [
                {"name": "trainer", "resources": RESOURCES},
                {"name": "sidecar", "resources": {}},
            ],
            "schedulerName": SCHED,
            "schedulingGates": [{"name": "example.com/quota"}],
            "affinity": {
                "nodeAffinity": {},
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": full["spec"]["affinity"][
                        "podAntiAffinity"
                    ]["preferredDuringSchedulingIgnoredDuringExecution"]
                },
            },
            "topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}],
            "priority": 1000,
        }
        assert pod["status"] == {"phase": "Pending"}
    info = _reads(seen[1][1])["info"]
    assert (info.job, info.run, info.resume_run, info.gang) == ("train", JOB_UID, "run-0", True)
    assert info.requests is not None and (info.requests.devices, info.requests.acu) == (2, 10.0)
    assert info.kube_scores and info.priority == 1000


async def test_a_pod_bound_finished_and_deleted_is_released_and_dropped_as_the_whole_pod_says(
    apiserver: ApiServer, kube: Kube
) -> None:
    unpledged: list[tuple[str, str, str]] = []

    async def unpledge(namespace: str, pledge: str, *, reason: str) -> None:
        unpledged.append((namespace, pledge, reason))

    booker = cast(Booker, SimpleNamespace(state=ClusterState(), unpledge=unpledge))
    store = PendingPods(scheduler_name=SCHED)
    watch = watching.watch_pods(kube, booker, scheduler_name=SCHED, pending=store, retry_s=0.0)
    task = tasks.start(watch, name="test:pod-watch-consumers")
    try:
        await asyncio.wait_for(store.synced.wait(), 5)
        full = apiserver.store("pods", (NS, "train-0"), _full_pod("train-0"))
        apiserver.store("pods", (NS, "train-1"), _full_pod("train-1"))
        await until(lambda: len(store.pods() or []) == 2)
        assert replanning.pending(full, scheduler_name=SCHED) in (store.pods() or [])

        going = "2026-07-20T09:20:00Z"  # a graceful deletion begins
        apiserver.update_pod(NS, "train-1", lambda p: p["metadata"].update(deletionTimestamp=going))
        await until(lambda: len(store.pods() or []) == 1)
        assert store.pods() == [replanning.pending(full, scheduler_name=SCHED)]

        apiserver.update_pod(NS, "train-0", _running)
        await until(lambda: store.pods() == [])
        assert unpledged == []

        apiserver.update_pod(NS, "train-0", lambda p: p["status"].update(phase="Succeeded"))
        await until(lambda: len(unpledged) == 1)
        apiserver.delete_pod(NS, "train-0")
        await until(lambda: len(unpledged) == 2)
    finally:
        await tasks.stop(task)
    assert unpledged == [
        (NS, "pl-train-0", "pod succeeded"),
        (NS, "pl-train-0", "pod deleted"),
    ]


async def test_a_pod_the_watch_cannot_type_is_handed_whole_listed_or_watched(
    apiserver: ApiServer, kube: Kube
) -> None:
    """The API server never sends a label that is not a string; were it to,
    the pod comes whole (as before typing), and the watch goes on."""
    odd = _full_pod("odd-0")
    odd["metadata"]["labels"]["replicas"] = 3
    apiserver.store("pods", (NS, "odd-0"), odd)
    seen: list[tuple[str, dict[str, Any]]] = []
    task = tasks.start(_collect(kube, seen), name="test:pod-watch-untyped")
    try:
        await until(lambda: len(seen) == 1)
        await apiserver.until_watched()
        odd["metadata"]["name"] = "odd-1"
        apiserver.store("pods", (NS, "odd-1"), odd)
        apiserver.store("pods", (NS, "train-2"), _full_pod("train-2"))
        await until(lambda: len(seen) == 3)
    finally:
        await tasks.stop(task)
    assert [(kind, pod["metadata"]["name"]) for kind, pod in seen] == [
        ("ADDED", "odd-0"),
        ("ADDED", "odd-1"),
        ("ADDED", "train-2"),
    ]
    for _, pod in seen[:2]:
        assert pod["metadata"]["labels"]["replicas"] == 3
        assert "managedFields" in pod["metadata"] and "volumes" in pod["spec"]
    assert "managedFields" not in seen[2][1]["metadata"]
    assert sum(r.verb == "list" for r in apiserver.requests) == 2  # the page asked for again


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"type": kind, "object": obj}) + b"\n"


def test_a_bookmark_with_null_fields_and_an_error_status_are_read_as_before() -> None:
    """As kube-apiserver writes them: a BOOKMARK's Pod has null fields, an
    ERROR carries a Status (whose ``status`` is a string, not a PodStatus)."""
    bookmark = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "resourceVersion": "12746",
            "creationTimestamp": None,
            "annotations": {"k8s.io/initial-events-end": "true"},
        },
        "spec": {"containers": None},
        "status": {},
    }
    kind, obj = kubes._decode_event(_line("BOOKMARK", bookmark), kubes._WATCHED_POD_EVENT)
    assert kind == "BOOKMARK"
    assert obj == {
        "metadata": {
            "resourceVersion": "12746",
            "annotations": {"k8s.io/initial-events-end": "true"},
        },
        "spec": {"containers": None},
        "status": {},
    }
    expired = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 1 (2)",
        "reason": "Expired",
        "code": 410,
    }
    assert kubes._decode_event(_line("ERROR", expired), kubes._WATCHED_POD_EVENT) == (
        "ERROR",
        expired,
    )
    bare = {k: v for k, v in expired.items() if k != "status"}  # types as a Pod, read whole
    assert kubes._decode_event(_line("ERROR", bare), kubes._WATCHED_POD_EVENT) == ("ERROR", bare)
