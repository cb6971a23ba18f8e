from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from agents import detecting, labeling, measuring
from hcs_bus import profiles

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def db() -> profiles.ProfileDB:
    return profiles.load()


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """Captured log entries of the agent's labelling, detecting and measuring, at
    every level."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as entries:
            # fresh proxies: the cached module loggers would bypass the capture
            monkeypatch.setattr(labeling, "_log", structlog.get_logger("hcs.agent.labeling"))
            monkeypatch.setattr(detecting, "_log", structlog.get_logger("hcs.agent.detecting"))
            monkeypatch.setattr(measuring, "_log", structlog.get_logger("hcs.agent.measuring"))
            yield entries
    finally:
        structlog.configure(**saved)
