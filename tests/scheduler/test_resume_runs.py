"""The bind resumes a pod from the checkpoint of its own job run, never from
another run's unless the pod names that run (``hcs.io/resume-run``): the real
scheduler, the real KV ``hcs_ckpt`` on nats-server, a fake API server."""

from __future__ import annotations

from typing import Any

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import CheckpointEvent
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_TWO, FakeKube, k8s_doc
from tests.scheduler.test_extender import _args, _post, _ready

JOBSET = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"


async def _checkpoint(bus: Bus, *, run: str, uri: str, under: str | None = None) -> None:
    """The checkpoint of run ``run`` of ml-team/llm, stored under its key (or ``under``'s)."""
    ckpt = await bus.js.key_value(streams.KV_CKPT)
    event = CheckpointEvent(namespace="ml-team", job="llm", uri=uri, step=10, time_s=1.0, run=run)
    await ckpt.put(subjects.ckpt_key("ml-team", "llm", under or run), messages.encode(event))


async def _bind(bus: Bus, start: Start, *, run: str, resume_run: str = "") -> dict[str, str]:
    """Bind a pod of run ``run`` of job llm; the annotations its Binding carries."""
    kube = FakeKube()
    sched = await _ready(bus, start, kube)
    args = _args(
        "extender-filter-args-nodecache.json",
        plan=A100_TWO,
        labels={JOBSET: "llm", JOBSET_UID: run},
    )
    if resume_run:
        args["Pod"]["metadata"]["annotations"]["hcs.io/resume-run"] = resume_run
    await _post(sched.port, "filter", args)
    status, out = await _post(sched.port, "bind", k8s_doc("extender-binding-args.json"))
    assert status == 200 and out == k8s_doc("extender-binding-result.json")
    [binding] = kube.bindings
    notes: dict[str, Any] = binding["annotations"]
    assert notes["hcs.io/devices"]  # bound either way
    return notes


async def test_a_new_run_of_a_job_name_starts_fresh_without_the_last_runs_checkpoint(
    bus: Bus, start_scheduler: Start
) -> None:
    await _checkpoint(bus, run="run-1", uri="s3://ckpt/llm/run-1")
    notes = await _bind(bus, start_scheduler, run="run-2")
    assert "hcs.io/resume-from" not in notes


async def test_a_replacement_pod_of_the_same_run_resumes_from_that_runs_checkpoint(
    bus: Bus, start_scheduler: Start
) -> None:
    await _checkpoint(bus, run="run-1", uri="s3://ckpt/llm/run-1")
    await _checkpoint(bus, run="run-0", uri="s3://ckpt/llm/run-0")
    notes = await _bind(bus, start_scheduler, run="run-1")
    assert notes["hcs.io/resume-from"] == "s3://ckpt/llm/run-1"


async def test_a_new_run_that_names_an_earlier_run_resumes_from_its_checkpoint(
    bus: Bus, start_scheduler: Start
) -> None:
    await _checkpoint(bus, run="run-1", uri="s3://ckpt/llm/run-1")
    notes = await _bind(bus, start_scheduler, run="run-2", resume_run="run-1")
    assert notes["hcs.io/resume-from"] == "s3://ckpt/llm/run-1"


async def test_a_checkpoint_of_another_run_stored_under_this_runs_key_is_refused(
    bus: Bus, start_scheduler: Start
) -> None:
    await _checkpoint(bus, run="run-1", uri="s3://ckpt/llm/run-1", under="run-2")
    notes = await _bind(bus, start_scheduler, run="run-2")
    assert "hcs.io/resume-from" not in notes
