"""``hcs place`` asks a real planner over a real nats-server and prints its
answer with every reason once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hcs_bus import profiles, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import Plan, PlanRequest
from scheduler.plan.service import Planner
from scheduler.view.state import ClusterState
from tests.cli.running import CEILING_S, Done, hcs
from tests.view.factories import fingerprint


class NoQuotas:
    async def limits(self, namespace: str) -> None:
        return None


@pytest.fixture
async def planner(bus: Bus) -> AsyncIterator[None]:
    """The scheduler's planner answering ``hcs.place.dry`` for a fleet of three
    classes: 2 × 8 A100-80G, 1 × 8 H100-SXM, 1 × 4 Ascend910B2."""
    state = ClusterState()
    fleet = [
        fingerprint("gpu-a", devices=8),
        fingerprint("gpu-b", devices=8),
        fingerprint("gpu-h", devices=8, model="H100-SXM"),
        fingerprint("npu-a", devices=4, vendor="huawei", model="Ascend910B2", vram_mib=65536),
    ]
    for fp in fleet:
        state.apply_fingerprint(fp, now=0.0)
    planner = Planner(state, profiles=profiles.load(), quotas=NoQuotas())  # type: ignore[arg-type]
    sub = await bus.serve(
        subjects.PLACE_DRY,
        PlanRequest,
        planner.plan,
        queue=subjects.PLACE_QUEUE,
        on_bad=lambda reason: Plan(ok=False, reason=reason),
    )
    yield
    await sub.unsubscribe()


async def place(nats_url: str, *args: str) -> Done:
    return await asyncio.to_thread(hcs, "place", *args, "--nats-url", nats_url)


async def test_a_plan_that_fits_prints_it_and_exits_0(planner: None, nats_url: str) -> None:
    done = await place(nats_url, "--vram", "16Gi", "--models", "NVIDIA/h100-sxm")
    assert done.code == 0, done.err
    assert done.out.startswith("PLAN  1 × nvidia/H100-SXM"), done.out
    assert done.seconds < CEILING_S


async def test_a_refusal_prints_each_reason_once_and_exits_1(planner: None, nats_url: str) -> None:
    done = await place(nats_url, "--devices", "16")
    assert done.code == 1, done.out + done.err
    assert done.out.startswith("REFUSED"), done.out
    listed = [line.strip() for line in done.out.splitlines() if line.startswith("    ")]
    classes = [line.split(": ", 1)[0] for line in listed]
    assert sorted(classes) == ["huawei/Ascend910B2", "nvidia/A100-80G", "nvidia/H100-SXM"]
    for line in listed:
        reason = line.split(": ", 1)[1]
        assert done.out.count(reason) == 1, done.out  # said once, not again in "why"
    assert done.err == ""


async def test_a_reason_shared_by_every_class_is_printed_once(planner: None, nats_url: str) -> None:
    done = await place(nats_url, "--devices", "2", "--vendors", "cambricon")
    assert done.code == 1, done.out + done.err
    why = next(line for line in done.out.splitlines() if line.startswith("  why: "))
    assert done.out.count(why.removeprefix("  why: ")) == 1, done.out


async def test_no_scheduler_on_the_bus_is_one_line_within_the_timeout(
    bus: Bus, nats_url: str
) -> None:
    done = await place(nats_url, "--vram", "16Gi", "--timeout", "1")
    assert done.code == 1, done.out + done.err
    assert done.err_lines == [
        "hcs: error: no scheduler answered within 1 s (is one running? hcs up starts one)"
    ]
    assert done.seconds < CEILING_S
