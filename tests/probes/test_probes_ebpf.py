"""The real eBPF path: build, load, attach, ring buffer, fallbacks, C/Python parity."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents.probes.events import ProbeEvent, decode_line
from agents.probes.kernel_lines import classify
from agents.probes.loader import EbpfProbe, open_sources
from tests.probes.helpers import EBPF_DIR, load_line_cases, write_kmsg

FIELDS = ("kind", "severity", "vendor", "pci_bus_id", "code", "device_index")
EM_BPF = 247


def _aer_tracepoint_exists() -> bool:
    return any(
        Path(root, "events/ras/aer_event").exists()
        for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
    )


async def _first(
    stream: AsyncIterator[ProbeEvent],
    *,
    kind: str,
    needle: str = "",
    poke: Any = None,
    timeout_s: float = 10.0,
) -> ProbeEvent:
    async def scan() -> ProbeEvent:
        async for event in stream:
            if event.kind == kind and needle in event.message:
                return event
        raise AssertionError("event stream ended")

    task = asyncio.ensure_future(scan())
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not task.done() and asyncio.get_running_loop().time() < deadline:
        if poke is not None:
            poke()
        await asyncio.sleep(0.05)
    if not task.done():
        task.cancel()
        raise AssertionError(f"no {kind} event within {timeout_s}s")
    return task.result()


def test_bpf_object_and_loader_are_built(hcs_probe_binary: Path) -> None:
    obj = EBPF_DIR / "build" / "hcs_probe.bpf.o"
    header = obj.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    assert int.from_bytes(header[18:20], "little") == EM_BPF
    assert (EBPF_DIR / "build" / "hcs_probe.skel.h").exists()
    assert os.access(hcs_probe_binary, os.X_OK)


async def test_test_probe_delivers_getppid_through_the_ring_buffer(
    hcs_probe_binary: Path, needs_root: None
) -> None:
    probe, status = await EbpfProbe.start(
        binary=hcs_probe_binary, args=["--test-pid", str(os.getpid())]
    )
    assert probe is not None, status.errors
    try:
        assert "syscalls:sys_enter_getppid" in status.attached
        event = await _first(probe.events(), kind="test_probe", needle="getppid", poke=os.getppid)
    finally:
        await probe.close()
    assert (event.source, event.severity) == ("ebpf", "info")
    assert event.evidence["pid"] == os.getpid()
    assert event.evidence["probe"] == "syscalls:sys_enter_getppid"
    assert event.ts_ns > 0


async def test_kernel_log_line_flows_through_the_printk_console_probe(
    hcs_probe_binary: Path, needs_root: None
) -> None:
    nonce = uuid.uuid4().hex
    probe, status = await EbpfProbe.start(binary=hcs_probe_binary)
    assert probe is not None, status.errors
    written = False

    def write_line() -> None:
        nonlocal written
        if not written:
            write_kmsg(f"hcs-probe: selftest nonce={nonce}")
            written = True

    try:
        event = await _first(probe.events(), kind="test_probe", needle=nonce, poke=write_line)
    finally:
        await probe.close()
    assert event.source == "ebpf"
    assert event.evidence["probe"] == "printk:console"
    assert event.message == f"hcs-probe: selftest nonce={nonce}"


async def test_loader_notices_missing_aer_tracepoint_and_chooses_sysfs_polling(
    hcs_probe_binary: Path, needs_root: None, tmp_path: Path
) -> None:
    sources = await open_sources(
        binary=hcs_probe_binary,
        sysfs_root=tmp_path,
        kmsg_path=tmp_path / "kmsg",
        poll_interval_s=60,
    )
    try:
        status, plan = sources.status, sources.plan
        assert status.ready and "printk:console" in status.attached
        if _aer_tracepoint_exists():
            assert "ras:aer_event" in status.attached and not plan.sysfs_aer
        else:
            assert "ras:aer_event" in status.missing
            assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (True, False, True)
            assert "ras:aer_event missing" in plan.reason
            assert len(sources.iterators) == 2, "eBPF stream + sysfs AER poller"
    finally:
        await sources.close()
    assert sources.probe is not None and sources.probe.proc.returncode is not None


def test_loader_reports_missing_tracepoint_as_json_on_stderr(
    hcs_probe_binary: Path, needs_root: None
) -> None:
    proc = subprocess.Popen(
        [str(hcs_probe_binary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        status = json.loads(proc.stderr.readline())
    finally:
        proc.terminate()
        proc.wait(5)
    assert status["status"] == "ready"
    assert set(status) == {"status", "attached", "missing", "failed"}
    expected_missing = [] if _aer_tracepoint_exists() else ["ras:aer_event"]
    assert status["missing"] == expected_missing
    assert proc.returncode == 0, "SIGTERM is a clean shutdown"


def test_c_classifier_agrees_with_python_on_every_recorded_line(hcs_probe_binary: Path) -> None:
    cases = load_line_cases()
    lines = [c["line"] for c in cases["cases"] + cases["garbled"] if "\n" not in c["line"]]
    lines = [ln for ln in lines if "\x00" not in ln]
    lines += [f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=x, y" for code in range(0, 200)]
    done = subprocess.run(
        [str(hcs_probe_binary), "--classify"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    outputs = done.stdout.splitlines()
    assert len(outputs) == len(lines)
    for line, out in zip(lines, outputs, strict=True):
        py = classify(line)
        c = None if out == "null" else decode_line(out)
        assert (c is None) == (py is None), line
        if c is not None and py is not None:
            assert {f: getattr(c, f) for f in FIELDS} == {f: getattr(py, f) for f in FIELDS}, line
            assert c.message == py.message


def test_loader_output_is_valid_utf8_json_for_invalid_bytes(hcs_probe_binary: Path) -> None:
    raw = b'amdgpu 0000:43:00.0: amdgpu: ring gfx timeout \xff\xc3 "q" \\ \x01 \xc3\xa9\n'
    done = subprocess.run(
        [str(hcs_probe_binary), "--classify"],
        input=raw,
        capture_output=True,
        timeout=30,
        check=True,
    )
    event = decode_line(done.stdout)
    expected = 'amdgpu 0000:43:00.0: amdgpu: ring gfx timeout \ufffd\ufffd "q" \\ \x01 \u00e9'
    assert event.message == expected


def test_build_names_the_missing_tools_and_their_packages() -> None:
    done = subprocess.run(
        [
            "make",
            "-C",
            str(EBPF_DIR),
            "CLANG=no-such-clang",
            "BPFTOOL=/no/such/bpftool",
            "check-tools",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert "missing tools: clang bpftool" in done.stderr
    assert "apt-get install -y clang llvm libbpf-dev bpftool" in done.stderr
