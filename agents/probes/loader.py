"""Runs the eBPF loader (``ebpf/build/hcs-probe``) and merges every source.

``watch()`` starts hcs-probe, reads its stderr status, picks the fallbacks
with :func:`agents.probes.plan.plan_sources` and yields ProbeEvents from
eBPF, /dev/kmsg, sysfs AER polling and an optional NVML source, merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from agents.probes.aer_sysfs import watch_aer
from agents.probes.events import ProbeEvent, decode_line
from agents.probes.kmsg import watch_kmsg
from agents.probes.plan import (
    LoaderStatus,
    SourcePlan,
    describe_error,
    parse_status_line,
    plan_sources,
    status_from_ready,
)

__all__ = [
    "DEFAULT_BINARY",
    "EbpfProbe",
    "NvmlSource",
    "ProbeSources",
    "SourcePlan",
    "open_sources",
    "plan_sources",
    "watch",
]

_log = structlog.get_logger(__name__)

DEFAULT_BINARY = Path(
    os.environ.get(
        "HCS_PROBE_BIN", Path(__file__).resolve().parents[2] / "ebpf" / "build" / "hcs-probe"
    )
)

NvmlSource = Callable[[], AsyncIterator[ProbeEvent]]
"""Hook for an NVML event source (kept out of here: no pynvml import)."""


class EbpfProbe:
    """A running hcs-probe process."""

    def __init__(self, proc: asyncio.subprocess.Process, status: LoaderStatus) -> None:
        self.proc = proc
        self.status = status
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    @classmethod
    async def start(
        cls,
        *,
        binary: Path = DEFAULT_BINARY,
        args: Sequence[str] = (),
        ready_timeout_s: float = 20.0,
    ) -> tuple[EbpfProbe | None, LoaderStatus]:
        """Starts hcs-probe; (None, status with errors) when it cannot serve events."""
        if not os.access(binary, os.X_OK):
            return None, LoaderStatus(ready=False, errors=(f"binary missing: {binary}",))
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            status = await asyncio.wait_for(_await_ready(proc), ready_timeout_s)
        except TimeoutError:
            status = LoaderStatus(ready=False, errors=("timed out waiting for ready",))
        if status.ready and status.attached:
            return cls(proc, status), status
        await _stop(proc)
        return None, status

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            obj = parse_status_line(line)
            _log.warning("hcs_probe_stderr", line=obj if obj else line.decode(errors="replace"))

    async def events(self) -> AsyncGenerator[ProbeEvent, None]:
        """Decoded stdout lines; malformed ones are logged and skipped."""
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                yield decode_line(line)
            except ValueError as exc:
                _log.warning("hcs_probe_bad_line", error=str(exc))
        _log.warning("hcs_probe_exited", returncode=await self.proc.wait())

    async def close(self) -> None:
        await _stop(self.proc)
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._stderr_task


async def _await_ready(proc: asyncio.subprocess.Process) -> LoaderStatus:
    """Reads stderr status lines until 'ready' or the process gives up."""
    assert proc.stderr is not None
    errors: list[str] = []
    async for line in proc.stderr:
        obj = parse_status_line(line)
        if obj is None:
            continue
        if obj["status"] == "ready":
            return status_from_ready(obj, errors=tuple(errors))
        errors.append(describe_error(obj))
    await proc.wait()
    errors.append(f"exited with {proc.returncode}")
    return LoaderStatus(ready=False, errors=tuple(errors))


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@dataclass
class ProbeSources:
    """The chosen plan and the running sources."""

    plan: SourcePlan
    status: LoaderStatus
    iterators: list[AsyncIterator[ProbeEvent]] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    probe: EbpfProbe | None = None

    async def close(self) -> None:
        for it in self.iterators:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        if self.probe is not None:
            await self.probe.close()


async def open_sources(
    *,
    sysfs_root: Path = Path("/sys"),
    kmsg_path: Path = Path("/dev/kmsg"),
    poll_interval_s: float = 5.0,
    binary: Path | None = DEFAULT_BINARY,
    ebpf_args: Sequence[str] = (),
    nvml_source: NvmlSource | None = None,
) -> ProbeSources:
    """Starts hcs-probe (unless binary is None) and the fallbacks the plan asks for."""
    probe, status = (None, LoaderStatus(ready=False, errors=("eBPF disabled",)))
    if binary is not None:
        probe, status = await EbpfProbe.start(binary=binary, args=ebpf_args)
    plan = plan_sources(status)
    _log.info("probe_sources", reason=plan.reason, missing=list(status.missing))
    sources = ProbeSources(plan=plan, status=status, probe=probe)
    if probe is not None:
        sources.iterators.append(probe.events())
    if plan.kmsg:
        _add_source(sources, "kmsg", lambda: watch_kmsg(kmsg_path=kmsg_path))
    if plan.sysfs_aer:
        _add_source(
            sources,
            "sysfs-aer",
            lambda: watch_aer(sysfs_root=sysfs_root, poll_interval_s=poll_interval_s),
        )
    if nvml_source is not None:
        _add_source(sources, "nvml", nvml_source)
    return sources


def _add_source(sources: ProbeSources, name: str, factory: NvmlSource) -> None:
    """Starts one source; one that cannot start (no /dev/kmsg ...) is logged and skipped."""
    try:
        sources.iterators.append(factory())
    except OSError as exc:
        sources.unavailable.append(f"{name}: {exc}")
        _log.error("probe_source_unavailable", source=name, error=str(exc))


async def merge(iterators: Sequence[AsyncIterator[ProbeEvent]]) -> AsyncGenerator[ProbeEvent, None]:
    """Interleaves sources; one failing source is logged and dropped, not fatal."""
    queue: asyncio.Queue[ProbeEvent | None] = asyncio.Queue(maxsize=1024)

    async def pump(it: AsyncIterator[ProbeEvent]) -> None:
        try:
            async for event in it:
                await queue.put(event)
        except Exception as exc:  # a broken source must not stop the others
            _log.error("probe_source_failed", error=repr(exc))
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(it)) for it in iterators]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def watch(
    *,
    sysfs_root: Path = Path("/sys"),
    kmsg_path: Path = Path("/dev/kmsg"),
    poll_interval_s: float = 5.0,
    binary: Path | None = DEFAULT_BINARY,
    ebpf_args: Sequence[str] = (),
    nvml_source: NvmlSource | None = None,
    on_plan: Callable[[SourcePlan], None] | None = None,
) -> AsyncGenerator[ProbeEvent, None]:
    """Yields ProbeEvents from whichever sources this host supports."""
    sources = await open_sources(
        sysfs_root=sysfs_root,
        kmsg_path=kmsg_path,
        poll_interval_s=poll_interval_s,
        binary=binary,
        ebpf_args=ebpf_args,
        nvml_source=nvml_source,
    )
    if on_plan is not None:
        on_plan(sources.plan)
    merged = merge(sources.iterators)
    try:
        async for event in merged:
            yield event
    finally:
        await merged.aclose()
        await sources.close()
