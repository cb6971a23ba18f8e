"""``python -m injector``: run the admission webhook standalone.

Settings from ``hcs_bus.settings.load()`` (``HCS_CONFIG``, ``HCS_INJECTOR__*``).
``--dev-certs DIR`` makes a development CA and serving certificate in DIR
when no certificate is configured and prints the caBundle.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hcs_bus import bus as bus_module
from hcs_bus import kube as kube_module
from hcs_bus import settings as settings_module
from hcs_bus import tasks
from hcs_bus.certs import make_dev_certs
from hcs_bus.telemetry import configure, logger
from injector.serving import Injector

_log = logger("hcs.injector")


async def run(args: argparse.Namespace) -> None:
    settings = settings_module.load(path=args.config)
    configure(settings.telemetry, service="hcs-injector")
    if args.dev_certs and not settings.injector.cert_file:
        host = settings.injector.host
        certs = make_dev_certs(Path(args.dev_certs), dns=["localhost"], ips=[host])
        settings = settings_module.replace(
            settings, injector={"cert_file": str(certs.cert_file), "key_file": str(certs.key_file)}
        )
        print(f"caBundle: {certs.ca_bundle_b64}", flush=True)
    bus = await bus_module.connect(settings.bus, name="hcs-injector")
    kube = await kube_module.connect(settings.kube)  # owning Jobs size gangs; optional
    injector = Injector(bus, settings, kube=kube)
    await injector.start()
    tasks.long_lived()
    await tasks.stop_event().wait()
    _log.info("injector_stopping")
    await injector.stop()
    if kube is not None:
        await kube.close()
    await bus.drain()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m injector", description=__doc__)
    parser.add_argument("--config", help="settings YAML (else HCS_CONFIG)")
    parser.add_argument("--dev-certs", metavar="DIR", help="make development certificates here")
    args = parser.parse_args(argv)
    return tasks.run_part(lambda: run(args), service="hcs-injector")


if __name__ == "__main__":
    sys.exit(main())
