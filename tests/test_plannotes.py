"""The plan note (``hcs.io/plan``) has one schema, ``hcs_bus.plannotes``: what
the injector writes and signs is what the scheduler reads, byte for byte."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus import plannotes
from hcs_bus.demands import Demand
from hcs_bus.messages import Plan, Policy, Requests
from hcs_bus.plannotes import PlanNote
from injector import plans
from scheduler.plan import pods

A100_WHOLE = Plan(
    ok=True,
    vendor="nvidia",
    model="A100-80G",
    devices=2,
    vram_mib_per_device=81920,
    whole_device=True,
    acu_per_device=100.0,
)
# the text the injector has always written for A100_WHOLE: it is signed, so
# every byte counts (a pod admitted before an upgrade is bound after it)
A100_WHOLE_TEXT = (
    '{"vendor":"nvidia","model":"A100-80G","devices":2,"vram_mib_per_device":81920,'
    '"whole_device":true,"acu_per_device":100.0}'
)

notes = st.builds(
    PlanNote,
    vendor=st.text(max_size=20),
    model=st.text(max_size=20),
    devices=st.integers(min_value=1, max_value=2**31),
    vram_mib_per_device=st.integers(min_value=0, max_value=2**40),
    whole_device=st.booleans(),
    acu_per_device=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)


def test_the_injector_and_the_scheduler_use_the_one_schema() -> None:
    assert plans.PlanNote is pods.PlanAnnotation is plannotes.PlanNote


def test_a_plans_note_is_written_as_it_always_was() -> None:
    assert plannotes.encode(plannotes.note_of(A100_WHOLE)) == A100_WHOLE_TEXT


@settings(max_examples=200, deadline=None)
@given(note=notes)
def test_every_note_the_injector_writes_the_scheduler_reads_back(note: PlanNote) -> None:
    text = plans.encode(note)
    assert plannotes.decode(text) == note
    assert plans.decode(text) == note
    assert pods.plan_annotation({"hcs.io/plan": text}) == note


def test_a_signed_note_is_read_at_bind_as_admission_planned_it() -> None:
    demand = Demand(targets=(), requests=Requests(devices=2, vram_mib=81920), policy=Policy())
    note = plans.note_of(A100_WHOLE)
    written = plans.note_annotations(
        note, namespace="ml", demand=demand, key=b"k" * 32, pledge="p1", pod="trainer-0"
    )
    assert written["hcs.io/plan"] == A100_WHOLE_TEXT
    found = plans.verified(
        written, namespace="ml", demand=demand, keys=[b"k" * 32], pod="trainer-0"
    )
    assert found == note
    read = pods.plan_annotation(written)
    assert read == note and read is not None and read.key == "nvidia/A100-80G"


def test_a_note_that_does_not_say_whole_or_slice_is_refused_by_both_readers() -> None:
    body = json.loads(A100_WHOLE_TEXT)
    del body["whole_device"]
    text = json.dumps(body)
    assert plans.decode(text) is None  # the injector plans the pod again
    with pytest.raises(pods.BadPod, match="whole_device"):
        pods.plan_annotation({"hcs.io/plan": text})


def test_acu_is_the_one_field_a_note_may_leave_out() -> None:
    body = json.loads(A100_WHOLE_TEXT)
    del body["acu_per_device"]
    read = pods.plan_annotation({"hcs.io/plan": json.dumps(body)})
    assert read is not None and read.acu_per_device == 0.0


def test_a_note_with_a_field_it_does_not_know_is_refused_naming_it() -> None:
    text = json.dumps({**json.loads(A100_WHOLE_TEXT), "surprise": 1})
    assert plans.decode(text) is None
    with pytest.raises(pods.BadPod, match="surprise"):
        pods.plan_annotation({"hcs.io/plan": text})
