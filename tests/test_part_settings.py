"""Each part's process refuses bad settings in one line that names the
setting, with exit status 2, before it connects to anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PARTS = [
    ("scheduler", [], "HCS_SCHEDULER__PLACEMENT", "bogus", "$.scheduler.placement"),
    ("injector", [], "HCS_INJECTOR__PORT", "many", "$.injector.port"),
    ("healer", [], "HCS_HEALER__DRY_RUN", "perhaps", "$.healer.dry_run"),
    (
        "agents",
        ["--node", "n1"],
        "HCS_AGENT__REPORT_INTERVAL_S",
        "often",
        "$.agent.report_interval_s",
    ),
]


@pytest.mark.parametrize(("part", "argv", "variable", "value", "named"), PARTS)
def test_a_part_with_a_bad_setting_exits_2_with_one_line_naming_it(
    part: str, argv: list[str], variable: str, value: str, named: str
) -> None:
    env = {**os.environ, variable: value, "HCS_BUS__URL": "nats://127.0.0.1:1"}
    done = subprocess.run(
        [sys.executable, "-m", part, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"hcs-{part.rstrip('s')}: "), done.stderr
    assert named in lines[0]
