"""Checkpoint sidecar: ``python -m healer.checkpointing --dir D --namespace NS --job J
[--run R] [--pid P]`` (the injector adds it to a pod that sets ``hcs.io/checkpoint-dir``:
``injector.sidecars``).

Runs beside a training container sharing its checkpoint directory:

* every ``--interval-s`` it scans the directory and reports each NEW COMPLETE
  checkpoint (``healer.checkpoints``) with ``hcs_bus.checkpoint.report``; a
  single-file checkpoint (``last.ckpt``) must look the same in two scans in a
  row, or be older than ``--settle-s``, to count as written;
* it subscribes to ``hcs.ckpt.request.<ns>.<job>``: a ``CheckpointRequest``
  becomes the file ``<dir>/HCS_CHECKPOINT_REQUEST`` (JSON, written atomically)
  and, when ``--pid`` is given, SIGUSR1 to that process. The trainer watches
  either, saves, and the next scan reports the new checkpoint (the injected
  sidecar mounts the directory writable). A directory the sidecar may only
  read takes no file: the refusal is logged and the trainer learns of the
  request from ``--pid`` only.

Checkpoints are reported under the job's run (``--run``, the pod's
``hcs_bus.jobs.JobIdentity.run``; "" when unknown).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec

from hcs_bus import bus as hcs_bus_bus
from hcs_bus import checkpoint, messages, permissions, settings, subjects, tasks
from hcs_bus.bus import Bus
from hcs_bus.messages import CheckpointRequest
from hcs_bus.telemetry import configure, logger
from healer.checkpoints import MARKERS, FileInfo, Found, Listing, Settling, newest

REQUEST_FILE = "HCS_CHECKPOINT_REQUEST"
_log = logger("hcs.healer.sidecar")


def scan(root: Path) -> Listing:
    """What the directory holds now (files, sizes, mtimes, marker texts)."""
    files: dict[str, FileInfo] = {}
    texts: dict[str, str] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            try:
                st = path.stat()
            except OSError:
                continue  # removed while scanning
            files[rel] = FileInfo(st.st_size, st.st_mtime)
            if rel in MARKERS and st.st_size < 4096:
                texts[rel] = path.read_text(errors="replace")
    return Listing(str(root), files, texts)


class Sidecar:
    def __init__(
        self,
        bus: Bus,
        *,
        root: Path,
        namespace: str,
        job: str,
        run: str = "",
        pid: int | None = None,
        interval_s: float = 5.0,
        settle_s: float = 30.0,
    ) -> None:
        self.bus = bus
        self.root = root
        self.namespace = namespace
        self.job = job
        self.job_run = run
        self.pid = pid
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.reported: Found | None = None
        self._previous: Listing | None = None
        self._sub: Any = None

    async def start(self) -> None:
        subject = subjects.ckpt_request(self.namespace, self.job)
        self._sub = await self.bus.nc.subscribe(subject, cb=self._on_request)
        _log.info("sidecar_started", dir=str(self.root), subject=subject)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def run(self) -> None:
        await self.start()
        try:
            while True:
                await self.scan_once()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.stop()

    async def scan_once(self) -> Found | None:
        """Report the newest complete checkpoint if it is new; return it when reported."""
        listing = await asyncio.to_thread(scan, self.root)
        # mtimes are wall-clock file times, so "now" is the wall clock too
        settling = Settling(previous=self._previous, now=time.time(), settle_s=self.settle_s)
        self._previous = listing
        found = newest(listing, settling)
        if found is None or (self.reported is not None and not _newer(found, self.reported)):
            return None
        done = await checkpoint.report(
            self.bus,
            namespace=self.namespace,
            job=self.job,
            run=self.job_run,
            uri=found.uri,
            step=found.step,
            framework=found.framework,
        )
        self.reported = found  # an ignored report (a newer step is stored) is not retried
        return found if done.stored else None

    async def _on_request(self, msg: Any) -> None:
        try:
            request = messages.decode(msg.data, CheckpointRequest)
        except msgspec.MsgspecError as exc:
            _log.warning("bad_checkpoint_request", subject=msg.subject, error=str(exc))
            return
        body = msgspec.to_builtins(request)
        target = self.root / REQUEST_FILE
        tmp = target.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(body))
            tmp.replace(target)
        except OSError as exc:  # a read-only checkpoint volume: the signal only
            _log.warning("checkpoint_request_not_written", path=str(target), error=str(exc))
        else:
            _log.info("checkpoint_request_written", path=str(target), request_id=request.request_id)
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGUSR1)
            except ProcessLookupError:
                _log.warning("trainer_gone", pid=self.pid)


def _newer(found: Found, reported: Found) -> bool:
    return (found.step, found.mtime) > (reported.step, reported.mtime) or (
        found.step == reported.step and found.uri != reported.uri
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m healer.checkpointing", description=__doc__)
    parser.add_argument("--dir", required=True, type=Path, help="checkpoint directory")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--run", default="", help="the job's run (its owner's UID)")
    parser.add_argument("--pid", type=int, default=None, help="trainer pid to send SIGUSR1")
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument(
        "--settle-s",
        type=float,
        default=30.0,
        help="a single-file checkpoint unchanged this long counts as written",
    )
    parser.add_argument("--config", default=None, help="HCS settings YAML")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    config = own_inbox(settings.load(path=args.config), namespace=args.namespace)
    configure(config.telemetry, service="hcs-ckpt-sidecar")
    # the namespace's sidecar user may touch only its own keys: no streams.init
    bus = await hcs_bus_bus.connect(config.bus, name=f"hcs-sidecar-{args.namespace}-{args.job}")
    sidecar = Sidecar(
        bus,
        root=args.dir,
        namespace=args.namespace,
        job=args.job,
        run=args.run,
        pid=args.pid,
        interval_s=args.interval_s,
        settle_s=args.settle_s,
    )
    try:
        await tasks.run_until_stopped(sidecar.run(), name="sidecar")
    finally:
        await bus.drain()


def own_inbox(config: settings.Settings, *, namespace: str) -> settings.Settings:
    """The settings with the inbox prefix of user ``sidecar:<namespace>``
    (the only inboxes it may subscribe to) unless one is configured."""
    if config.bus.inbox_prefix:
        return config
    prefix = permissions.inbox_prefix(permissions.sidecar_user(namespace))
    return settings.replace(config, bus={"inbox_prefix": prefix})


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.dir.is_dir():
        raise SystemExit(f"--dir {args.dir} is not a directory")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
