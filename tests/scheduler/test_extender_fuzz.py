"""Property: whatever body reaches an extender verb, the answer is a 200 of
the verb's own result shape or a 400 with the reason — never a 5xx, never a
hang. Bodies are bytes, arbitrary JSON, and the real wire documents with
hostile values planted in them."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import aiohttp
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcs_bus.bus import Bus
from scheduler.extender import wire
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_TWO, k8s_doc, node_fp, pod, publish_fleet, until

NAMES = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]
RESULTS: dict[str, Any] = {
    "filter": wire.ExtenderFilterResult,
    "prioritize": list[wire.HostPriority],
    "bind": wire.ExtenderBindingResult,
    "preempt": wire.ExtenderPreemptionResult,
}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["1e400", "nan", "-inf", "1e9999999999", "1Ki", "16Gi", "0.5", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
raw_numbers = st.sampled_from(
    [
        "1e400",
        "-1e400",
        "1e9999999999",
        '"1e9999999999"',
        '"nan"',
        "NaN",
        "Infinity",
        "1e-400",
        "9" * 400,
        "0x10",
    ]
)


def _templates() -> dict[str, dict[str, Any]]:
    filter_args = k8s_doc("extender-filter-args-nodecache.json")
    filter_args["Pod"] = pod("fuzz", uid="uid-fuzz", plan=A100_TWO)
    preempt = k8s_doc("extender-preempt-args-nodecache.json")
    preempt["Pod"] = pod("fuzz", plan=A100_TWO, priority=100)
    return {
        "filter": filter_args,
        "prioritize": filter_args,
        "bind": k8s_doc("extender-binding-args.json"),
        "preempt": preempt,
    }


TEMPLATES = _templates()


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += _paths(value, (*prefix, index))
    return out


def _planted(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(doc))
    where = copy
    for step in path[:-1]:
        where = where[step]
    where[path[-1]] = value
    return copy


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    verb = draw(st.sampled_from(sorted(TEMPLATES)))
    doc = TEMPLATES[verb]
    kind = draw(
        st.sampled_from(["bytes", "json", "planted", "extra", "raw-number", "utf8", "deep"])
    )
    if kind == "bytes":
        return verb, draw(st.binary(max_size=300))
    if kind == "json":
        return verb, json.dumps(draw(json_values)).encode()
    path = draw(st.sampled_from(_paths(doc)))
    if kind == "planted":
        return verb, json.dumps(_planted(doc, path, draw(json_values))).encode()
    if kind == "extra":
        parent = path if isinstance(_at(doc, path), dict) else ()
        key = draw(st.text(min_size=1, max_size=10))  # a newer kube-scheduler's field
        return verb, json.dumps(_planted(doc, (*parent, key), draw(json_values))).encode()
    if kind == "utf8":  # an invalid UTF-8 sequence inside an otherwise valid document
        valid = json.dumps(doc).encode()
        cut = draw(st.integers(min_value=0, max_value=len(valid)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80"]))
        return verb, valid[:cut] + bad + valid[cut:]
    if kind == "deep":
        depth = draw(st.integers(min_value=500, max_value=20000))
        return verb, _with_raw(doc, path, "[" * depth + "]" * depth)
    return verb, _with_raw(doc, path, draw(raw_numbers))


@st.composite
def quantities(draw: st.DrawFn) -> tuple[str, bytes]:
    """A pod-bearing verb whose pod asks for one ai.compute resource in any
    JSON a hostile or broken client may write (requests and limits alike)."""
    verb = draw(st.sampled_from(["filter", "prioritize", "preempt"]))
    key = draw(st.sampled_from(["ai.compute/vram", "ai.compute/acu", "ai.compute/devices"]))
    raw = draw(raw_numbers | scalars.map(json.dumps))
    marker = "__fuzz_marker__"
    doc = json.loads(json.dumps(TEMPLATES[verb]))
    for part in ("requests", "limits"):
        doc["Pod"]["spec"]["containers"][0]["resources"][part][key] = marker
    return verb, json.dumps(doc).replace(f'"{marker}"', raw).encode()


def _with_raw(doc: Any, path: tuple[Any, ...], raw: str) -> bytes:
    """``doc`` with the JSON text ``raw`` at ``path`` (numbers json.dumps cannot write)."""
    marker = "__fuzz_marker__"
    return json.dumps(_planted(doc, path, marker)).replace(f'"{marker}"', raw).encode()


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


async def test_no_body_gets_a_5xx_or_hangs(bus: Bus, start_scheduler: Start) -> None:
    sched = await _replica(bus, start_scheduler)
    asked = await _fuzz(sched.port, bodies(), max_examples=300)
    assert len(asked) >= 100 and set(asked) == set(RESULTS)  # it did try every verb
    assert sched.extender.cache.budget.used <= 64 * len(NAMES)


async def test_no_quantity_in_a_pod_gets_a_5xx_or_hangs(bus: Bus, start_scheduler: Start) -> None:
    sched = await _replica(bus, start_scheduler)
    asked = await _fuzz(sched.port, quantities(), max_examples=150)
    assert len(asked) >= 50


async def _replica(bus: Bus, start: Start) -> Any:
    await publish_fleet(bus, *(node_fp(n) for n in NAMES))
    sched = await start(bus)
    await until(lambda: len(sched.view.state.nodes) == 3)
    return sched


async def _fuzz(
    port: int, cases: st.SearchStrategy[tuple[str, bytes]], *, max_examples: int
) -> list[str]:
    """Run the property in a thread, each body POSTed on this loop; the verbs asked."""
    loop = asyncio.get_running_loop()
    asked: list[str] = []
    async with aiohttp.ClientSession() as session:

        @settings(
            max_examples=max_examples,
            deadline=timedelta(seconds=5),
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(cases)
        def check(case: tuple[str, bytes]) -> None:
            verb, body = case
            asked.append(verb)
            future = asyncio.run_coroutine_threadsafe(_ask(session, port, verb, body), loop)
            status, text = future.result(timeout=10)  # a hang fails here
            assert status in (200, 400), (verb, body[:300], status, text[:300])
            if status == 200:
                msgspec.json.decode(text.encode(), type=RESULTS[verb], strict=True)
            else:
                assert f"bad {verb} arguments" in text

        await asyncio.to_thread(check)
    return asked


async def _ask(
    session: aiohttp.ClientSession, port: int, verb: str, body: bytes
) -> tuple[int, str]:
    async with asyncio.timeout(5):
        async with session.post(f"http://127.0.0.1:{port}/{verb}", data=body) as resp:
            return resp.status, await resp.text()
