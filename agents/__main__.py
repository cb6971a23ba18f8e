"""``python -m agents --node NAME`` (real detectors) or ``--fleet FILE`` (simulated).

Both write Node labels and ``ai.compute/*`` capacity when a Kubernetes cluster
is configured (``kube`` settings): ``--node`` on its own Node, ``--fleet`` on
the Node of every fleet node that exists in the cluster.

Exit status 2 on a configuration error (one line naming the field and value).
SIGTERM drains: queued fingerprints and health events are flushed first.
"""

from __future__ import annotations

import argparse
import sys

from agents import fleet as fleet_file
from agents.running import run_fleet, run_node
from hcs_bus import streams, tasks
from hcs_bus.bus import connect
from hcs_bus.settings import Settings, load, replace
from hcs_bus.telemetry import configure


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agents", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--node", help="this node's name (default: $NODE_NAME)")
    mode.add_argument("--fleet", help="play the simulated fleet in this YAML file")
    parser.add_argument("--config", help="settings file (default: $HCS_CONFIG)")
    parser.add_argument("--init-bus", action="store_true", help="create streams first")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace, settings: Settings) -> None:
    fleet = fleet_file.load(args.fleet) if args.fleet else None
    bus = await connect(settings.bus, name=f"hcs-agent-{args.node or 'fleet'}")
    if args.init_bus:
        await streams.init(bus, settings.bus)
    tasks.long_lived()
    playing = (
        run_fleet(bus, fleet, settings=settings) if fleet else run_node(bus, settings=settings)
    )
    try:
        await tasks.run_until_stopped(playing, name="agent")
    finally:
        await bus.drain()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    return tasks.run_part(lambda: _configured(args), service="hcs-agent")


async def _configured(args: argparse.Namespace) -> None:
    settings = load(path=args.config)
    if args.node:
        settings = replace(settings, agent={"node_name": args.node})
    if args.fleet:
        fleet_file.load(args.fleet)  # a bad fleet fails before logging is set up
    configure(settings.telemetry, service="hcs-agent")
    await _main(args, settings)


if __name__ == "__main__":
    sys.exit(main())
