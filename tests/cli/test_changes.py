"""What ``hcs bus init`` counts as a change, decided without a server."""

from __future__ import annotations

import pytest
from nats.js.api import RetentionPolicy

from hcs_bus.changes import changes


@pytest.mark.parametrize(
    ("want", "have", "expected"),
    [
        ({"num_replicas": 1}, {"num_replicas": 1, "max_bytes": -1}, []),
        ({"num_replicas": 3}, {"num_replicas": 1}, ["num_replicas 1 → 3"]),
        ({"retention": RetentionPolicy.LIMITS}, {"retention": "limits"}, []),
        (
            {"retention": RetentionPolicy.WORK_QUEUE},
            {"retention": "limits"},
            ["retention limits → workqueue"],
        ),
        ({"max_age": 120_000_000_000}, {"max_age": 60_000_000_000}, ["max_age 60s → 120s"]),
        ({"sealed": False, "description": None}, {}, []),  # server left defaults out
        ({"allow_direct": True}, {}, ["allow_direct unset → True"]),
        ({"subjects": ["hcs.fp.*"]}, {"subjects": ["hcs.fp.*"]}, []),
        ({"subjects": ["hcs.fp.>"]}, {"subjects": ["hcs.fp.*"]}, ["subjects hcs.fp.* → hcs.fp.>"]),
    ],
)
def test_only_fields_we_set_and_the_server_holds_otherwise_are_changes(
    want: dict[str, object], have: dict[str, object], expected: list[str]
) -> None:
    assert changes(want=want, have=have) == expected
