"""Which pods use which devices, from AllocationEvents."""

from __future__ import annotations

import msgspec

from healer.bindings import Bindings
from tests.healer.conftest import bound


def test_a_late_release_of_the_old_pod_does_not_forget_its_same_named_replacement() -> None:
    bindings = Bindings()
    old = bound("n1", "train-0", (0,))
    new = msgspec.structs.replace(
        bound("n2", "train-0", (1,)), pod=msgspec.structs.replace(old.pod, uid="uid-new")
    )
    bindings.apply(old)
    bindings.apply(new)
    bindings.apply(msgspec.structs.replace(old, state="released"))
    assert [b.uid for b in bindings.on_devices("n2", (1,))] == ["uid-new"]
    assert bindings.on_node("n1") == []


def test_a_release_of_the_same_pod_forgets_it() -> None:
    bindings = Bindings()
    event = bound("n1", "train-0", (0,))
    bindings.apply(event)
    bindings.apply(msgspec.structs.replace(event, state="expired"))
    assert bindings.on_node("n1") == [] and len(bindings) == 0
