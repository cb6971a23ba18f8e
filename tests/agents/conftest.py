from __future__ import annotations

from pathlib import Path

import pytest

from hcs_bus import profiles

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def db() -> profiles.ProfileDB:
    return profiles.load()


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()
