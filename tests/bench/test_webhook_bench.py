"""bench.webhook's in-process line: the admission rules timed on a review
they patch, back to back and with the process asleep between calls."""

from __future__ import annotations

from bench.webhook import rules_alone


def test_the_rules_alone_are_timed_on_admissions_they_patch() -> None:
    # rules_alone asserts each answer is a patch: a review the rules refused
    # or let through unchanged would time the wrong path
    back_to_back = rules_alone(20, gap_s=0.0)
    asleep = rules_alone(5, gap_s=0.002)
    assert back_to_back > 0 and asleep > 0
