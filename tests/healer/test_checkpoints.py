"""Checkpoint detection on real directory trees, reporting through KV, the sidecar."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hcs_bus import checkpoint, messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import CheckpointRequest
from healer.checkpointing import REQUEST_FILE, Sidecar, scan
from healer.checkpoints import FileInfo, Listing, Settling, detect, newest


def _write(root: Path, rel: str, text: str = "x") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


LAYOUTS = {
    "hf": (
        {
            "checkpoint-500/model.safetensors": "w",
            "checkpoint-500/trainer_state.json": "{}",
            "checkpoint-900/model.safetensors": "w",
        },
        500,
        "checkpoint-500",
    ),
    "deepspeed": (
        {
            "latest": "global_step300",
            "global_step300/mp_rank_00_model_states.pt": "w",
            "global_step400/mp_rank_00_model_states.pt": "w",
        },
        300,
        "global_step300",
    ),
    "megatron": (
        {
            "latest_checkpointed_iteration.txt": "2000",
            "iter_0002000/mp_rank_00/model_optim_rng.pt": "w",
            "iter_0003000/mp_rank_00/model_optim_rng.pt": "w",
        },
        2000,
        "iter_0002000",
    ),
    "dcp": (
        {"step-70/.metadata": "m", "step-70/__0_0.distcp": "w", "step-80/__0_0.distcp": "w"},
        70,
        "step-70",
    ),
    "lightning": ({"last.ckpt": "w", "epoch=3-step=1200.ckpt": "w"}, 1200, "last.ckpt"),
}


@pytest.mark.parametrize("framework", sorted(LAYOUTS))
def test_each_layout_is_detected_and_incomplete_ones_ignored(
    framework: str, tmp_path: Path
) -> None:
    files, step, name = LAYOUTS[framework]
    for rel, text in files.items():
        _write(tmp_path, rel, text)
    found = detect(scan(tmp_path), Settling(previous=scan(tmp_path)))
    assert [(f.framework, f.step, f.uri) for f in found] == [
        (framework, step, str(tmp_path / name))
    ]


@pytest.mark.parametrize(
    "files",
    [
        {"checkpoint-5/model.safetensors": "w"},
        {"latest": "global_step9"},
        {"latest_checkpointed_iteration.txt": "10"},
        {"step-3/__0_0.distcp": "w"},
        {"last.ckpt": ""},
    ],
)
def test_incomplete_checkpoints_are_ignored(files: dict[str, str], tmp_path: Path) -> None:
    for rel, text in files.items():
        _write(tmp_path, rel, text)
    assert newest(scan(tmp_path)) is None


async def test_report_puts_the_latest_checkpoint_in_kv(bus: Bus) -> None:
    assert await checkpoint.latest(bus, namespace="ml", job="llama") is None
    await checkpoint.report(bus, namespace="ml", job="llama", uri="s3://b/c-10", step=10)
    await checkpoint.report(
        bus, namespace="ml", job="llama", uri="s3://b/c-20", step=20, framework="hf"
    )
    got = await checkpoint.latest(bus, namespace="ml", job="llama")
    assert got is not None and (got.uri, got.step, got.framework) == ("s3://b/c-20", 20, "hf")


async def test_the_sidecar_reports_new_checkpoints_and_writes_requests(
    bus: Bus, tmp_path: Path
) -> None:
    sidecar = Sidecar(bus, root=tmp_path, namespace="ml", job="j1")
    await sidecar.start()
    try:
        assert await sidecar.scan_once() is None
        _write(tmp_path, "checkpoint-10/trainer_state.json", "{}")
        assert (await sidecar.scan_once()) is not None
        assert await sidecar.scan_once() is None  # not new
        latest = await checkpoint.latest(bus, namespace="ml", job="j1")
        assert latest is not None and latest.step == 10
        request = CheckpointRequest(namespace="ml", job="j1", reason="test", request_id="r1")
        await bus.nc.publish(subjects.ckpt_request("ml", "j1"), messages.encode(request))
        target = tmp_path / REQUEST_FILE
        for _ in range(100):
            if target.exists():
                break
            await asyncio.sleep(0.02)
        assert json.loads(target.read_text())["request_id"] == "r1"
    finally:
        await sidecar.stop()


async def test_a_late_report_of_a_lower_step_never_replaces_a_newer_checkpoint(bus: Bus) -> None:
    await checkpoint.report(bus, namespace="ml", job="late", uri="s3://b/c-200", step=200)
    late = await checkpoint.report(bus, namespace="ml", job="late", uri="s3://b/c-100", step=100)
    again = await checkpoint.report(bus, namespace="ml", job="late", uri="s3://b/c-x", step=200)
    got = await checkpoint.latest(bus, namespace="ml", job="late")
    assert got is not None and (got.uri, got.step) == ("s3://b/c-200", 200)
    assert not late.stored and late.latest.step == 200
    assert not again.stored


async def test_concurrent_reporters_never_end_with_the_lower_step(bus: Bus) -> None:
    for round_ in range(5):
        job = f"race-{round_}"
        steps = [10 * i for i in range(1, 13)]
        order = steps[round_ % 2 :: 2] + steps[1 - round_ % 2 :: 2]  # interleaved, not sorted
        done = await asyncio.gather(
            *(
                checkpoint.report(bus, namespace="ml", job=job, uri=f"s3://b/{s}", step=s)
                for s in reversed(order)
            )
        )
        got = await checkpoint.latest(bus, namespace="ml", job=job)
        assert got is not None and (got.step, got.uri) == (120, "s3://b/120")
        assert any(r.stored and r.step == 120 for r in done)


def test_a_last_ckpt_counts_only_once_it_is_unchanged_across_two_scans(tmp_path: Path) -> None:
    _write(tmp_path, "epoch=1-step=400.ckpt", "w")
    _write(tmp_path, "last.ckpt", "partial")
    first = scan(tmp_path)
    assert detect(first) == []  # nothing seen before: maybe still being written
    assert detect(first, Settling(previous=first, now=None)) != []
    (tmp_path / "last.ckpt").write_text("partial, and more bytes")  # still growing
    second = scan(tmp_path)
    assert detect(second, Settling(previous=first)) == []
    found = detect(scan(tmp_path), Settling(previous=second))
    assert [(f.framework, f.step) for f in found] == [("lightning", 400)]


def test_a_last_ckpt_older_than_the_settle_time_counts_at_the_first_scan() -> None:
    listing = Listing("/ckpt", {"last.ckpt": FileInfo(size=10, mtime=1000.0)})
    assert detect(listing, Settling(now=1010.0, settle_s=30.0)) == []
    assert [f.uri for f in detect(listing, Settling(now=1030.0, settle_s=30.0))] == [
        "/ckpt/last.ckpt"
    ]


async def test_the_sidecar_waits_until_a_last_ckpt_stops_changing(bus: Bus, tmp_path: Path) -> None:
    sidecar = Sidecar(bus, root=tmp_path, namespace="ml", job="lit")
    _write(tmp_path, "last.ckpt", "half")
    assert await sidecar.scan_once() is None  # first sight: maybe mid-write
    (tmp_path / "last.ckpt").write_text("half and the rest")
    assert await sidecar.scan_once() is None  # it changed since
    assert await checkpoint.latest(bus, namespace="ml", job="lit") is None
    found = await sidecar.scan_once()  # unchanged across two scans
    assert found is not None and found.framework == "lightning"
    latest = await checkpoint.latest(bus, namespace="ml", job="lit")
    assert latest is not None and latest.uri == str(tmp_path / "last.ckpt")
