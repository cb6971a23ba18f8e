"""Property: whatever body reaches ``/mutate``, the real aiohttp app answers
an HTTP 200 AdmissionReview echoing the request's uid, or a 4xx with a
message — never a 5xx, never an internal error, never a hang.

Bodies: arbitrary bytes and JSON, and upstream-shaped AdmissionReview v1
documents carrying random pods (containers, resources, annotations drawn
from the ``hcs.io/*`` vocabulary), then broken on purpose: a random value
planted anywhere, absurd numbers, invalid UTF-8, deep nesting; sent as is,
gzip- or deflate-compressed, or labelled compressed while they are not.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcs_bus import vocabulary
from hcs_bus.certs import DevCerts
from hcs_bus.messages import Plan, PlanRequest
from injector.serving import Injector
from tests.injector.conftest import A100_PLAN, HCS_SA, create_review, injector_settings

HCS_NAMES = sorted(
    value
    for value in vars(vocabulary).values()
    if isinstance(value, str) and value.startswith(vocabulary.PREFIX) and value != vocabulary.PREFIX
)
RESOURCE_KEYS = [
    "ai.compute/vram",
    "ai.compute/acu",
    "ai.compute/devices",
    "ai.compute/tflops-fp16",
    "ai.compute/tflops-bf16",
    "ai.compute/",
    "cpu",
    "memory",
    "nvidia.com/gpu",
]
QUANTITIES = ["16Gi", "1", "0", "-1", "0.5", "1e400", "1e9999999999", "9" * 40, "nan", "", "1Ki"]
# how a body is sent: as is, compressed, or labelled compressed while it is not
ENCODINGS = ["", "", "", "gzip", "deflate", "gzip-labelled", "deflate-labelled"]
RAW = ["1e400", "-1e400", "9" * 400, "NaN", "Infinity", "1e-400", "0x10", '"\\ud800"']

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
quantity = st.sampled_from(QUANTITIES) | st.text(max_size=10) | st.integers() | st.none()
resources = st.dictionaries(
    st.sampled_from(RESOURCE_KEYS) | st.text(max_size=12), quantity, max_size=4
)
containers = st.fixed_dictionaries(
    {
        "name": st.text(max_size=12),
        "image": st.sampled_from(["pytorch/pytorch:2.3", ""]) | st.text(max_size=12),
        "resources": st.fixed_dictionaries({"requests": resources, "limits": resources}),
    },
    optional={
        "env": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=10), "value": st.text(max_size=10)}),
            max_size=3,
        ),
        "securityContext": st.fixed_dictionaries({"privileged": st.booleans()}),
    },
)
annotations = st.dictionaries(
    st.sampled_from(HCS_NAMES) | st.text(max_size=12),
    st.text(max_size=24) | json_values,
    max_size=5,
)


@st.composite
def reviews(draw: st.DrawFn) -> dict[str, Any]:
    """An upstream-shaped review with a random pod."""
    doc = create_review()
    request = doc["request"]
    request["uid"] = draw(st.uuids().map(str) | st.text(min_size=1, max_size=40))
    request["operation"] = draw(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]))
    request["userInfo"]["username"] = draw(st.sampled_from([HCS_SA, "alice", ""]))
    request["dryRun"] = draw(st.booleans())
    pod = request["object"]
    pod["metadata"]["annotations"] = draw(annotations)
    pod["spec"]["containers"] = draw(st.lists(containers, max_size=3))
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = draw(st.lists(containers, max_size=2))
    if request["operation"] == "UPDATE":
        request["oldObject"] = json.loads(json.dumps(pod))
        request["oldObject"]["metadata"]["annotations"] = draw(annotations)
    return doc


def _spots(doc: Any) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for key, value in list(items):
        out.append((doc, key))
        if isinstance(value, dict | list):
            out += _spots(value)
    return out


def _plant(doc: dict[str, Any], *, at: int, raw: str) -> bytes:
    marker = "__fuzz_marker__"
    spots = _spots(doc)
    parent, key = spots[at % len(spots)]
    parent[key] = marker
    return json.dumps(doc).replace(f'"{marker}"', raw).encode()


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    how = draw(
        st.sampled_from(["review", "review", "bytes", "json", "planted", "raw", "utf8", "deep"])
    )
    if how == "bytes":
        return draw(st.binary(max_size=300))
    if how == "json":
        return json.dumps(draw(json_values)).encode()
    doc = draw(reviews())
    if how == "review":
        return json.dumps(doc).encode()
    at = draw(st.integers(min_value=0, max_value=1000))
    if how == "planted":
        return _plant(doc, at=at, raw=json.dumps(draw(json_values)))
    if how == "raw":
        return _plant(doc, at=at, raw=draw(st.sampled_from(RAW)))
    if how == "deep":
        depth = draw(st.integers(min_value=500, max_value=20000))
        return _plant(doc, at=at, raw="[" * depth + "]" * depth)
    valid = json.dumps(doc).encode()
    cut = at % len(valid)
    bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80"]))
    return valid[:cut] + bad + valid[cut:]


class Planner:
    """Plans like the scheduler would (a plan, or a refusal); counts calls."""

    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self, request: PlanRequest, timeout_s: float) -> Plan:
        self.asked += 1
        if self.asked % 5 == 0:
            return Plan(ok=False, reason="no class has room")
        return A100_PLAN


@pytest.fixture
async def client(certs: DevCerts) -> AsyncIterator[TestClient[Any, Any]]:
    injector = Injector(None, injector_settings(certs), planner=Planner())
    async with TestClient(TestServer(injector.app())) as found:
        yield found


def _request_uid(body: bytes) -> Any:
    """The uid a well-formed body carries (None when Python cannot read it)."""
    try:
        return json.loads(body.decode("utf-8"))["request"]["uid"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


async def test_no_admission_body_gets_a_5xx_or_an_internal_error(
    client: TestClient[Any, Any],
) -> None:
    loop = asyncio.get_running_loop()
    seen: dict[int, int] = {}

    @settings(
        max_examples=250,
        deadline=timedelta(seconds=5),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(bodies(), st.sampled_from(ENCODINGS))
    def check(body: bytes, encoding: str) -> None:
        sent, header = body, encoding.removesuffix("-labelled")
        if encoding == "gzip":
            sent = gzip.compress(body)
        elif encoding == "deflate":
            sent = zlib.compress(body)
        future = asyncio.run_coroutine_threadsafe(_post(client, sent, encoding=header), loop)
        status, content_type, text = future.result(timeout=10)  # a hang fails here
        seen[status] = seen.get(status, 0) + 1
        assert status == 200 or 400 <= status < 500, (status, body[:300], text[:300])
        if status != 200:
            assert text.strip(), (status, body[:300])  # a 4xx says why
            return
        assert content_type == "application/json", text[:300]
        answer = json.loads(text)
        assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        response = answer["response"]
        uid = _request_uid(body)
        assert response["uid"] == uid if isinstance(uid, str) else response["uid"], answer
        assert isinstance(response["allowed"], bool)
        message = response.get("status", {}).get("message", "")
        assert "internal error" not in message, (body[:500], message)

    await asyncio.to_thread(check)
    assert seen.get(200, 0) >= 50 and sum(seen.values()) >= 200, seen  # it got past the envelope


async def _post(
    client: TestClient[Any, Any], body: bytes, *, encoding: str = ""
) -> tuple[int, str, str]:
    headers = {"Content-Type": "application/json"}
    if encoding:
        headers["Content-Encoding"] = encoding
    async with asyncio.timeout(5):
        resp = await client.post("/mutate", data=body, headers=headers)
        async with resp:
            return resp.status, resp.content_type, await resp.text(errors="replace")
