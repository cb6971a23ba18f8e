"""Identity from the subject (pure): which bodies a subject vouches for, the
healer's verdict subject, and fingerprint order by (boot, seq)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hcs_bus import identity, permissions, subjects
from hcs_bus.messages import AllocationEvent, HealthEvent, NodeFingerprint, PodRef
from hcs_bus.ordering import FingerprintOrder

_node_names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?", fullmatch=True)


def fp(node: str, *, seq: int = 1, boot: str = "b", time_s: float = 0.0) -> NodeFingerprint:
    return NodeFingerprint(node=node, agent_version="t", boot_id=boot, seq=seq, time_s=time_s)


def allocation(node: str) -> AllocationEvent:
    pod = PodRef(namespace="ml", name="p", uid="u")
    return AllocationEvent(node=node, pod=pod, state="bound", time_s=0.0)


def event(node: str, *, source: str = "agent") -> HealthEvent:
    return HealthEvent(node=node, kind="xid", severity="fatal", source=source, time_s=0.0)  # type: ignore[arg-type]


@given(_node_names)
def test_the_healers_subject_is_under_the_alert_feed_and_never_a_nodes(node: str) -> None:
    verdicts = subjects.healer_health(node)
    assert verdicts.count(".") == subjects.HEALTH_ALL.count(".")  # hcs.health.* matches it
    assert subjects.node_of(verdicts) == node
    assert subjects.is_healer_health(verdicts)
    assert not subjects.is_healer_health(subjects.health(node))
    assert verdicts not in permissions.agent(node).publish


def test_a_name_starting_with_a_dot_cannot_become_a_token_like_the_healers() -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.node_token(".healer_x")


@pytest.mark.parametrize(
    ("subject", "value", "refused"),
    [
        (subjects.fp("a"), fp("a"), ""),
        (subjects.fp("a.b"), fp("a.b"), ""),
        (subjects.fp("a"), fp("b"), "names node 'b'"),
        (subjects.health("a"), event("a"), ""),
        (subjects.health("a"), event("b"), "names node 'b'"),
        (subjects.health("a"), event("a", source="healer"), "forged verdict"),
        (subjects.healer_health("a"), event("a", source="healer"), ""),
        (subjects.healer_health("a"), event("b", source="healer"), "names node 'b'"),
        (subjects.healer_health("a"), event("a", source="probe"), "healer's subject"),
        (subjects.health("a"), fp("a"), "not on hcs.fp"),
        (subjects.alloc("a"), event("a"), "not on hcs.health"),
        (subjects.alloc("a"), allocation("a"), ""),
        (subjects.alloc("a"), allocation("b"), "allocation event body names node 'b'"),
        (subjects.health("a"), allocation("a"), "not on hcs.alloc"),
    ],
)
def test_a_body_is_believed_only_where_its_subject_vouches_for_it(
    subject: str, value: object, refused: str
) -> None:
    why = identity.refusal(subject, value)
    assert (refused in why and why != "") if refused else why == ""


def test_fingerprints_go_forward_by_seq_and_by_new_boots_never_back() -> None:
    order = FingerprintOrder()
    assert order.admit(fp("n", seq=5, boot="a", time_s=9e9))
    assert not order.admit(fp("n", seq=5, boot="a"))  # a redelivery
    assert not order.admit(fp("n", seq=4, boot="a"))
    assert order.admit(fp("n", seq=1, boot="b", time_s=1.0))  # clock put back: still newer
    assert not order.admit(fp("n", seq=99, boot="a", time_s=9e10))  # the replaced boot
    assert order.admit(fp("m", seq=1, boot="a"))  # per node
    assert order.ignored == 3


def test_a_sidecar_uses_its_namespaces_inbox_unless_one_is_configured() -> None:
    from hcs_bus.settings import Settings, replace
    from healer.checkpointing import own_inbox

    assert own_inbox(Settings(), namespace="ml").bus.inbox_prefix == "_INBOX_SIDECAR_ML"
    chosen = replace(Settings(), bus={"inbox_prefix": "_INBOX_X"})
    assert own_inbox(chosen, namespace="ml").bus.inbox_prefix == "_INBOX_X"
