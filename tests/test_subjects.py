from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hcs_bus import subjects

_node_names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,40}[a-z0-9])?", fullmatch=True)


@given(_node_names)
def test_a_node_name_survives_the_token_round_trip(node: str) -> None:
    assert subjects.node_of(subjects.fp(node)) == node
    assert subjects.node_of(subjects.health(node)) == node
    assert "." not in subjects.node_token(node)


def test_dots_in_node_names_become_underscores() -> None:
    assert subjects.fp("gpu-1.zone-a.example.com") == "hcs.fp.gpu-1_zone-a_example_com"


@pytest.mark.parametrize("bad", ["", "a_b", "a b", "a*", "a>"])
def test_names_that_cannot_be_tokens_are_refused(bad: str) -> None:
    with pytest.raises(subjects.SubjectError, match="cannot be a subject token"):
        subjects.node_token(bad)


def test_checkpoint_subjects_name_namespace_and_job() -> None:
    assert subjects.ckpt("ml", "llama") == "hcs.ckpt.ml.llama"
    assert subjects.ckpt_request("ml", "llama") == "hcs.ckpt.request.ml.llama"
    assert subjects.dlq("hcs.fp.n1") == "hcs.dlq.hcs.fp.n1"
