"""The supervisor: a loop that dies is started again, later each time, and
counted; a cancellation still stops it."""

from __future__ import annotations

import asyncio
import gc
import itertools
import re

import pytest

from hcs_bus import tasks
from hcs_bus.telemetry import metrics_text


def _restarts_metric(task: str) -> float:
    page = metrics_text().decode()
    pattern = rf'^hcs_task_restarts_total\{{[^}}]*task="{re.escape(task)}"[^}}]*\}} (\S+)$'
    found = re.search(pattern, page, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_loop_that_dies_is_started_again_with_a_growing_wait_and_counted() -> None:
    loop = asyncio.get_running_loop()
    starts: list[float] = []
    restarts: list[int] = []

    async def flaky() -> str:
        starts.append(loop.time())
        if len(starts) <= 3:
            raise RuntimeError(f"crash {len(starts)}")
        return "done"

    before = _restarts_metric("test:flaky")
    await asyncio.wait_for(
        tasks.supervised(
            flaky, name="test:flaky", backoff_s=0.02, on_restart=lambda: restarts.append(1)
        ),
        5,
    )
    assert len(starts) == 4 and len(restarts) == 3
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[0] >= 0.02 and gaps[1] >= 0.04 and gaps[2] >= 0.08
    assert _restarts_metric("test:flaky") == before + 3


async def test_a_cancelled_supervised_loop_stops_and_is_not_restarted() -> None:
    started = asyncio.Event()
    runs: list[int] = []

    async def forever() -> None:
        runs.append(1)
        started.set()
        await asyncio.Event().wait()

    task = tasks.supervise(forever, name="test:forever", backoff_s=0.01)
    await asyncio.wait_for(started.wait(), 5)
    await tasks.stop(task)
    assert task.cancelled() and runs == [1]
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_started_part_takes_what_it_holds_out_of_the_cycle_collector() -> None:
    thresholds = gc.get_threshold()
    try:
        held = [object() for _ in range(10)]  # lives as long as the part
        tasks.long_lived()
        assert gc.get_freeze_count() >= len(held)
        assert gc.get_threshold() == (tasks.GC_YOUNG, 20, 10)
        spare = [[] for _ in range(5000)]  # 7 young collections at CPython's default
        assert len(spare) == 5000 and gc.get_count()[0] > 4000  # none ran yet
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_a_part_runs_on_uvloop_and_bad_settings_are_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loops: list[str] = []

    async def main() -> None:
        loops.append(type(asyncio.get_running_loop()).__module__)

    async def misconfigured() -> None:
        raise tasks.ConfigError("HCS_BUS__URL: not a nats:// URL")

    assert tasks.run_part(main, service="hcs-test") == 0
    assert loops == ["uvloop"]
    assert tasks.run_part(misconfigured, service="hcs-test") == 2
    assert capsys.readouterr().err == "hcs-test: HCS_BUS__URL: not a nats:// URL\n"


@pytest.mark.parametrize(
    ("took_s", "want_s"),
    [(0.0, 2.0), (0.05, 2.0), (0.1, 2.0), (0.3, 6.0)],  # a share of 5 %: 0.3 s of work, 6 s apart
)
def test_a_periodic_round_that_grows_long_is_spaced_to_keep_its_share_of_the_loop(
    took_s: float, want_s: float
) -> None:
    assert tasks.spacing_s(took_s, every_s=2.0) == pytest.approx(want_s)
    assert tasks.spacing_s(took_s, every_s=2.0, share=1.0) == 2.0
