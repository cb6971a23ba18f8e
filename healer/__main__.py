"""``python -m healer [--dry-run] [--config FILE]``: the healer as its own process."""

from __future__ import annotations

import argparse
import sys

from hcs_bus import bus as hcs_bus_bus
from hcs_bus import kube as hcs_kube
from hcs_bus import settings as hcs_settings
from hcs_bus import streams, tasks
from hcs_bus.telemetry import configure
from healer.running import run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m healer", description="HCS healer")
    parser.add_argument(
        "--dry-run", action="store_true", help="publish the actions it would take, apply none"
    )
    parser.add_argument("--config", default=None, help="HCS settings YAML")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    settings = hcs_settings.load(path=args.config)
    if args.dry_run:
        settings = hcs_settings.replace(settings, healer={"dry_run": True})
    configure(settings.telemetry, service="hcs-healer")
    bus = await hcs_bus_bus.connect(settings.bus, name="hcs-healer")
    await streams.init(bus, settings.bus)
    kube = await hcs_kube.connect(settings.kube)
    tasks.long_lived()
    try:
        await tasks.run_until_stopped(run(bus, kube, settings), name="healer")
    finally:
        if kube is not None:
            await kube.close()
        await bus.drain()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return tasks.run_part(lambda: _main(args), service="hcs-healer")


if __name__ == "__main__":
    sys.exit(main())
