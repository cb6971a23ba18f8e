"""Source selection and merging without eBPF; the operator CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from agents.probes.events import ProbeEvent, decode_line
from agents.probes.loader import SourcePlan, merge, open_sources, watch
from tests.probes.helpers import REPO, FakeSysfs

XID_RECORD = "3,77,1000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"


def _nvml_event() -> ProbeEvent:
    return ProbeEvent(
        v=1,
        source="nvml",
        kind="xid",
        vendor="nvidia",
        pci_bus_id="0000:3b:00.0",
        device_index=0,
        code=63,
        severity="fatal",
        message="nvml xid 63",
        ts_ns=1,
        evidence={},
    )


async def test_missing_binary_falls_back_to_kmsg_and_sysfs_and_both_deliver(
    tmp_path: Path, fake_sysfs: FakeSysfs
) -> None:
    gpu = fake_sysfs.add("0000:3a:00.0", "0000:3b:00.0", vendor=0x10DE)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    plans: list[SourcePlan] = []
    stream = watch(
        binary=tmp_path / "no-such-hcs-probe",
        sysfs_root=fake_sysfs.root,
        kmsg_path=kmsg,
        poll_interval_s=0.02,
        on_plan=plans.append,
    )
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.2)
    fake_sysfs.set(gpu, "aer_dev_correctable", RxErr=1)
    with kmsg.open("a") as f:
        f.write(XID_RECORD)
    events = [await asyncio.wait_for(first, 5), await asyncio.wait_for(anext(stream), 5)]
    await stream.aclose()
    assert (plans[0].ebpf, plans[0].kmsg, plans[0].sysfs_aer) == (False, True, True)
    assert "binary missing" in plans[0].reason
    assert sorted((e.source, e.kind) for e in events) == [
        ("kmsg", "xid"),
        ("sysfs-aer", "aer_correctable"),
    ]


async def test_binary_that_fails_to_load_falls_back(tmp_path: Path) -> None:
    fake = tmp_path / "hcs-probe"
    fake.write_text(
        '#!/bin/sh\necho \'{"status":"error","stage":"load","error":"x",'
        '"errno":1,"strerror":"Operation not permitted"}\' >&2\nexit 2\n'
    )
    fake.chmod(0o755)
    sources = await open_sources(binary=fake, sysfs_root=tmp_path, kmsg_path=tmp_path / "k")
    await sources.close()
    assert (sources.plan.ebpf, sources.plan.kmsg, sources.plan.sysfs_aer) == (False, True, True)
    assert "load: x (Operation not permitted)" in sources.plan.reason
    assert "exited with 2" in sources.plan.reason
    assert sources.unavailable == [f"kmsg: [Errno 2] No such file or directory: '{tmp_path / 'k'}'"]
    assert len(sources.iterators) == 1, "sysfs AER polling still runs without /dev/kmsg"


async def test_nvml_hook_events_are_merged_into_the_stream(tmp_path: Path) -> None:
    async def nvml() -> AsyncIterator[ProbeEvent]:
        yield _nvml_event()

    (tmp_path / "kmsg").write_text("")
    stream = watch(
        binary=None,
        sysfs_root=tmp_path,
        kmsg_path=tmp_path / "kmsg",
        poll_interval_s=60,
        nvml_source=nvml,
    )
    event = await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()
    assert (event.source, event.code) == ("nvml", 63)


async def test_a_failing_source_does_not_stop_the_others() -> None:
    async def broken() -> AsyncIterator[ProbeEvent]:
        raise RuntimeError("boom")
        yield _nvml_event()  # pragma: no cover

    async def good() -> AsyncIterator[ProbeEvent]:
        await asyncio.sleep(0.05)
        yield _nvml_event()

    events = [e async for e in merge([broken(), good()])]
    assert [e.message for e in events] == ["nvml xid 63"]


def test_python_m_agents_probes_prints_contract_lines(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.probes",
            "--no-ebpf",
            "--kmsg",
            str(kmsg),
            "--sysfs-root",
            str(tmp_path),
            "--max-events",
            "1",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        plan_line = ""
        while not plan_line.startswith('{"plan"'):
            plan_line = proc.stderr.readline()
            assert plan_line, "no plan line on stderr"
        with kmsg.open("a") as f:
            f.write(XID_RECORD)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert '"kmsg":true' in plan_line and '"sysfs_aer":true' in plan_line
    [line] = out.splitlines()
    event = decode_line(line)
    assert (event.source, event.kind, event.code, event.severity) == ("kmsg", "xid", 48, "fatal")
    assert proc.returncode == 0, err
