"""What shortcut plans hold is kept summed as holds come and go: the sums
always equal a fold of the holds standing, and a plan reads them without
walking the holds."""

from __future__ import annotations

import random

from scheduler.ledger.pledge_rules import Held, Pledge
from scheduler.plan.shortcut_holds import Hold, ShortcutHolds

MODELS = ("A100-80G", "H100-80G", "910B")


def _pledge(rng: random.Random) -> Pledge:
    whole = rng.random() < 0.3
    devices = rng.choice((1, 2, 4))
    return Pledge(
        id="",
        vendor="nvidia" if rng.random() < 0.7 else "huawei",
        model=rng.choice(MODELS),
        devices=devices,
        vram_mib_per_device=rng.choice((4096, 8192, 16384, 81920)),
        whole_device=whole,
        acu_per_device=rng.choice((0.5, 1.0, 2.5)),
    )


def _folded(holds: ShortcutHolds) -> tuple[dict[str, Held], dict[str, Held]]:
    by_class: dict[str, Held] = {}
    by_ns: dict[str, Held] = {}
    for hold in holds:
        by_class[hold.held.key] = by_class.get(hold.held.key, Held()).plus(hold.held)
        by_ns[hold.namespace] = by_ns.get(hold.namespace, Held()).plus(hold.held)
    return by_class, by_ns


def _same(a: dict[str, Held], b: dict[str, Held]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if (x.whole_devices, x.vram_mib, x.devices, x.slices) != (
            y.whole_devices,
            y.vram_mib,
            y.devices,
            y.slices,
        ) or abs(x.acu - y.acu) > 1e-6:
            return False
    return True


def test_the_sums_follow_every_hold_added_expired_and_booked() -> None:
    rng = random.Random(7)
    holds = ShortcutHolds()
    now = 0.0
    for step in range(400):
        now += rng.random()
        before = holds.version
        action = rng.random()
        if action < 0.7:
            ns = rng.choice(("ml", "cv", "nlp"))
            holds.add(Hold(now + 30.0, ns, f"p{step}" if rng.random() < 0.8 else "", _pledge(rng)))
            assert holds.version != before
        elif action < 0.85:
            holds.expire(now)
        else:
            gone = {h.pod for h in holds if h.pod and rng.random() < 0.3}
            holds.keep(lambda h, gone=gone: h.pod not in gone)  # type: ignore[misc]
            assert (holds.version != before) == bool(gone)
        by_class, by_ns = _folded(holds)
        assert _same(holds.by_class, by_class), step
        assert _same(holds.by_namespace, by_ns), step


def test_expiry_drops_exactly_the_holds_whose_time_passed() -> None:
    holds = ShortcutHolds()
    rng = random.Random(3)
    for i in range(10):
        holds.add(Hold(float(i), "ml", f"p{i}", _pledge(rng)))
    version = holds.version
    holds.expire(-1.0)  # none due: nothing changes
    assert holds.version == version and len(holds) == 10
    holds.expire(4.0)
    assert [h.pod for h in holds] == [f"p{i}" for i in range(5, 10)]
    assert _same(holds.by_class, _folded(holds)[0])
    holds.expire(100.0)
    assert not holds and holds.by_class == {} and holds.by_namespace == {}
