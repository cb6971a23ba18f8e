"""Run the installed ``hcs`` entry point as a user does, and time it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hcs_bus import natsserver

# The console script installed beside this interpreter (.venv/bin/hcs).
HCS = str(Path(sys.executable).with_name("hcs"))
CEILING_S = 10.0  # "a few seconds", with room for a loaded machine


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def err_lines(self) -> list[str]:
        return self.err.strip().splitlines()


def hcs(*args: str, timeout_s: float = 60, env: dict[str, str] | None = None) -> Done:
    """``hcs ARGS`` with the user's own environment minus HCS settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HCS_", "NATS_"))}
    started = time.monotonic()
    done = subprocess.run(
        [HCS, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**base, **(env or {})},
    )
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def nats_server_binary() -> str:
    """The nats-server the project runs (hcs_bus.natsserver.binary)."""
    return natsserver.binary()
