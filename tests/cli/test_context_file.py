"""The context file ``hcs up`` leaves for other commands, and the tally it tells
when it stops."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

import pytest

from hcs import context
from hcs.runsummary import Tally
from hcs_bus import messages, subjects
from hcs_bus.errors import ConfigError
from hcs_bus.messages import AllocationEvent, CheckpointEvent, HealthEvent, PodRef
from tests.view.factories import verdict


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(context.ENV, str(tmp_path / "context.json"))
    return tmp_path / "context.json"


def _mine(**fields: object) -> context.Context:
    base: dict[str, object] = {"bus_url": "nats://127.0.0.1:4999", "pid": os.getpid()}
    return context.Context(**{**base, "started": "2026-01-01T00:00:00+00:00", **fields})  # type: ignore[arg-type]


def test_a_written_context_is_read_back_and_only_its_writer_removes_it(where: Path) -> None:
    context.write(_mine(console_token="t0k"))
    assert oct(where.stat().st_mode & 0o777) == "0o600"
    assert context.read() == _mine(console_token="t0k")
    context.remove(pid=os.getpid() + 1)  # another hcs up's exit
    assert where.exists()
    context.remove(pid=os.getpid())
    assert not where.exists() and context.read() is None


def test_a_context_whose_process_is_gone_is_stale(where: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    context.write(_mine(pid=gone.pid))
    assert context.read() is None


def test_a_context_file_that_is_not_one_is_a_clear_error(where: Path) -> None:
    where.write_text('{"bus": "nats://x"}')
    with pytest.raises(ConfigError, match=f"{where}: not an hcs context"):
        context.read()


def test_without_hcs_context_it_lives_in_the_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(context.ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert context.path() == tmp_path / "hcs" / "context.json"
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    first, second = context.new_logs_dir(now=now), context.new_logs_dir(now=now)
    assert first == tmp_path / "hcs" / "logs" / "20260102T030405"
    assert second.name == "20260102T030405-2" and first.is_dir()


def _bound(node: str, pod: str, *, job: str | None) -> bytes:
    event = AllocationEvent(node=node, pod=PodRef(namespace="demo", name=pod), state="bound",
                            time_s=1.0, job=job)  # fmt: skip
    return messages.encode(event)


def test_the_tally_counts_faults_verdicts_actions_moves_and_checkpoints() -> None:
    tally = Tally()
    fault = HealthEvent(node="gpu-a", kind="xid", severity="fatal", source="agent", time_s=1.0)
    info = HealthEvent(node="gpu-a", kind="clock", severity="info", source="agent", time_s=1.0)
    action = HealthEvent(node="gpu-a", kind="action", severity="warning", source="healer",
                         time_s=1.0)  # fmt: skip
    tally.take(subjects.health("gpu-a"), messages.encode(fault))
    tally.take(subjects.health("gpu-a"), messages.encode(info))
    tally.take(subjects.healer_health("gpu-a"), messages.encode(verdict("gpu-a", 2, "failed")))
    tally.take(subjects.healer_health("gpu-a"), messages.encode(action))
    tally.take(subjects.alloc("gpu-a"), _bound("gpu-a", "train-0", job="llama"))
    tally.take(subjects.alloc("gpu-a"), _bound("gpu-a", "train-0", job="llama"))  # again: no move
    tally.take(subjects.alloc("gpu-h"), _bound("gpu-h", "train-1", job="llama"))  # the move
    tally.take(subjects.alloc("gpu-h"), _bound("gpu-h", "solo", job=None))
    ckpt = CheckpointEvent(namespace="demo", job="llama", uri="s3://c/1", step=1, time_s=1.0)
    tally.take(subjects.ckpt("demo", "llama"), messages.encode(ckpt))
    tally.take(subjects.ckpt_request("demo", "llama"), b'{"type": "checkpoint_request"}')
    tally.take(subjects.health("gpu-a"), b"not json")  # not ours to count
    assert tally.line() == "faults 1, verdicts 1, actions 1, moves 1, checkpoints 1"
