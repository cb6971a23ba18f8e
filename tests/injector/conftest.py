"""Fixtures for the injector: documents shaped like the API server's, dev
certificates, a plan responder on the real bus, and the webhook over TLS."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.certs import DevCerts, make_dev_certs
from hcs_bus.messages import Plan, PlanRequest
from hcs_bus.settings import Settings, replace
from injector.serving import Injector

FIXTURES = Path(__file__).with_name("fixtures")
A100_PLAN = Plan(
    ok=True,
    vendor="nvidia",
    model="A100-80G",
    models=("A100-80G",),
    devices=2,
    vram_mib_per_device=16384,
    acu_per_device=100.0,
)
HCS_SA = "system:serviceaccount:hcs-system:hcs-scheduler"


def create_review() -> dict[str, Any]:
    """The upstream-shaped CREATE review, unchanged."""
    return json.loads((FIXTURES / "admission-review-pod-create-request.json").read_text())


def gpu_review(**limits: str) -> dict[str, Any]:
    """The CREATE review turned vendor-neutral: ai.compute/* instead of hcs.io/gpu."""
    doc = create_review()
    pod = doc["request"]["object"]
    pod["metadata"]["annotations"] = {"hcs.io/vendors": "nvidia,huawei"}
    wanted = limits or {"ai.compute/vram": "32Gi", "ai.compute/devices": "2"}
    for part in ("limits", "requests"):
        section = pod["spec"]["containers"][0]["resources"][part]
        section.pop("hcs.io/gpu")
        section.update(wanted)
    return doc


def plain_review() -> dict[str, Any]:
    doc = create_review()
    pod = doc["request"]["object"]
    pod["metadata"].pop("annotations")
    for part in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][part].pop("hcs.io/gpu")
    return doc


def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["request"]["object"]  # type: ignore[no-any-return]


def patched(doc: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The incoming pod with the response's patch applied by jsonpatch."""
    pod = copy.deepcopy(pod_of(doc))
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, ops)  # type: ignore[no-any-return]


class Responder:
    """Answers hcs.place and hcs.place.dry on the real bus; records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[PlanRequest] = []
        self.plan: Plan = A100_PLAN
        self.delay_s = 0.0

    async def handle(self, request: PlanRequest) -> Plan:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.plan


@pytest.fixture
async def responder(bus: Bus) -> AsyncIterator[Responder]:
    found = Responder()
    subs = [
        await bus.serve(
            subject,
            PlanRequest,
            found.handle,
            queue=subjects.PLACE_QUEUE,
            on_bad=lambda reason: Plan(ok=False, reason=reason),
        )
        for subject in (subjects.PLACE, subjects.PLACE_DRY)
    ]
    await bus.nc.flush()
    yield found
    for sub in subs:
        await sub.unsubscribe()


@pytest.fixture
def certs(tmp_path: Path) -> DevCerts:
    return make_dev_certs(tmp_path / "certs", dns=["localhost"], ips=["127.0.0.1"])


def injector_settings(certs: DevCerts, **fields: Any) -> Settings:
    base = {
        "host": "127.0.0.1",
        "port": 0,
        "cert_file": str(certs.cert_file),
        "key_file": str(certs.key_file),
        "plan_timeout_s": 0.5,
    }
    return replace(Settings(), injector={**base, **fields})


Post = Callable[..., Awaitable[tuple[int, Any]]]


class Webhook:
    def __init__(self, injector: Injector, session: aiohttp.ClientSession) -> None:
        self.injector = injector
        self.session = session

    async def post(self, doc: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
        body = raw if raw is not None else json.dumps(doc).encode()
        async with self.session.post(
            self.injector.url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            text = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, json.loads(text)
            return resp.status, text.decode()

    async def review(self, doc: dict[str, Any]) -> dict[str, Any]:
        status, answer = await self.post(doc)
        assert status == 200, answer
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == doc["request"]["uid"]
        return answer["response"]  # type: ignore[no-any-return]


def client_ssl(certs: DevCerts) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca_file))


@pytest.fixture
def webhook_factory(bus: Bus, certs: DevCerts) -> Callable[..., Any]:
    """``async with webhook_factory(**injector_fields) as hook``."""

    class _Running:
        def __init__(self, **fields: Any) -> None:
            self.fields = fields

        async def __aenter__(self) -> Webhook:
            self.injector = Injector(
                bus, injector_settings(certs, **self.fields), reload_interval_s=0.05
            )
            await self.injector.start()
            connector = aiohttp.TCPConnector(ssl=client_ssl(certs))
            self.session = aiohttp.ClientSession(connector=connector)
            return Webhook(self.injector, self.session)

        async def __aexit__(self, *exc: object) -> None:
            await self.session.close()
            await self.injector.stop()

    return _Running


@pytest.fixture
async def webhook(
    webhook_factory: Callable[..., Any], responder: Responder
) -> AsyncIterator[Webhook]:
    async with webhook_factory() as hook:
        yield hook
