"""``python -m agents.probes``: print probe events as JSON lines on stdout.

The active plan (which sources, and why) goes to stderr as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

import msgspec
import structlog

from agents.probes.events import encode_line
from agents.probes.loader import DEFAULT_BINARY, SourcePlan, watch


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agents.probes", description=__doc__)
    parser.add_argument("--sysfs-root", type=Path, default=Path("/sys"))
    parser.add_argument("--kmsg", type=Path, default=Path("/dev/kmsg"))
    parser.add_argument("--poll-interval", type=float, default=5.0, help="sysfs AER poll, s")
    parser.add_argument("--binary", type=Path, default=DEFAULT_BINARY, help="hcs-probe path")
    parser.add_argument("--no-ebpf", action="store_true", help="use only the fallbacks")
    parser.add_argument("--max-events", type=int, default=0, help="exit after N events")
    return parser.parse_args(argv)


def _print_plan(plan: SourcePlan) -> None:
    sys.stderr.write(msgspec.json.encode({"plan": plan.__dict__}).decode() + "\n")
    sys.stderr.flush()


async def _run(args: argparse.Namespace) -> int:
    count = 0
    async for event in watch(
        sysfs_root=args.sysfs_root,
        kmsg_path=args.kmsg,
        poll_interval_s=args.poll_interval,
        binary=None if args.no_ebpf else args.binary,
        on_plan=_print_plan,
    ):
        sys.stdout.buffer.write(encode_line(event))
        sys.stdout.flush()
        count += 1
        if args.max_events and count >= args.max_events:
            break
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # stdout carries only JSON lines; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run(args))
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
