"""``python -m bench.pool``: the shared pool's rules on a trace, against
first-come-first-served with hard limits, in one run.

An **event-driven simulation** (no cluster, no bus, no clock: simulated
seconds): the events are gang arrivals and gang ends; after each, the policy
decides who starts (``scheduler.quota.share_rules.admit`` for the shared
pool) until nothing changes. Devices are counted per class, as the rules
count them (node packing and network groups are ``gang_rules``'s and left
out: this measures who gets how much, not where).

The trace (seeded): ``--gangs`` gangs (200) from 4 namespaces, arriving as a
Poisson process (mean gap ``--gap`` s, 15); ranks uniform in 1..16, one
device each; run time log-normal (median 900 s, sigma 0.8, clipped to
60..7200 s); one in five elastic (least half its ranks, most all of them;
its work is ranks x run time, done at the rate of the ranks it holds); one
in ten of priority 1; half may run on any class, half only on the classes of
one collective library. The pool: 50 nodes of 8 devices, 10 nodes of each
of 5 classes. Guarantees 40/30/20/10 % of the pool's ACU and VRAM, weights
4/3/2/1, ceilings 100/80/60/50 %.

The two policies:

* ``pool``: the shared-pool rules (``share_rules.admit``; its docstring
  states them in full): queue by priority, then the weighted dominant share
  the gang's namespace would have once it runs (a gang waiting longer than
  ``--starvation``, 300 s, by the share now), then age; borrowing up to
  ceilings; a gang that may run on several classes takes the one that
  leaves the shares of the namespaces with work waiting most even; reclaim
  for a gang owed its guarantee, else elastic ranks above their minimum
  lent back, else a fair reclaim (from namespaces that stay above the
  claimant's share once it runs), all within 15 % of the pool's ACU a
  minute, never a namespace below its guarantee (whole gangs restart from
  the beginning; elastic ones lose ranks, not work); backfill: a gang that
  cannot start for want of room is passed over by gangs behind it that fit
  until it has waited ``--starvation``; the first such gang (the head) then
  keeps the free devices of the class it may use with the most free, up to
  its least ranks, and gangs behind it start only outside them (lent
  elastic ranks and fair reclaims serve it first), so no backfill delays
  it; and no backfill may raise its namespace's share above that of a gang
  ahead of it waiting on the same class; elastic growth into devices no
  waiting gang could start in and the head does not keep.
* ``fcfs``: first come first served, each namespace hard-limited to its
  guarantee (no borrowing): the oldest gang that its namespace's limit
  allows starts when a class holds it, and nothing behind it starts first.

Printed per policy: device utilisation while work waits (busy devices over
all, averaged over the time at least one gang waits; target >= 0.9), Jain's
fairness index of the weighted dominant shares of the namespaces with work
waiting, averaged over the time two or more have (target >= 0.95), p50/p99
wait per namespace, reclaims and the device-seconds they cost (the run time
lost by restarted gangs), and the makespan.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.quota import share_rules as rules
from scheduler.quota.share_rules import Amount, ClassRoom, Job, Share

CLASSES = (
    ClassRoom("nvidia/A100-80G", 80, 100.0, 81920, "nccl"),
    ClassRoom("nvidia/H100-SXM", 80, 317.1, 81920, "nccl"),
    ClassRoom("huawei/Ascend910B2", 80, 113.4, 65536, "hccl"),
    ClassRoom("hygon/K100", 80, 32.1, 65536, "rccl"),
    ClassRoom("cambricon/MLU370-X8", 80, 15.4, 24576, "cncl"),
)
NAMESPACES = (("research", 0.40, 4.0, 1.00), ("prod", 0.30, 3.0, 0.80),
              ("vision", 0.20, 2.0, 0.60), ("interns", 0.10, 1.0, 0.50))  # fmt: skip
TARGET_UTILISATION = 0.9
TARGET_JAIN = 0.95


@dataclass(frozen=True, slots=True)
class Gang:
    key: str
    namespace: str
    ranks: int
    min_ranks: int | None
    classes: tuple[str, ...]
    priority: int
    arrive_s: float
    run_s: float

    @property
    def work(self) -> float:
        """Rank-seconds of work."""
        return self.ranks * self.run_s


def trace(*, gangs: int = 200, seed: int = 7, gap_s: float = 15.0) -> list[Gang]:
    rng = random.Random(seed)
    libraries = sorted({c.library for c in CLASSES})
    out, t = [], 0.0
    for i in range(gangs):
        t += rng.expovariate(1.0 / gap_s)
        ns = NAMESPACES[i % len(NAMESPACES)][0]
        ranks = rng.randint(1, 16)
        elastic = rng.random() < 0.2 and ranks > 1
        lib = rng.choice(libraries)
        pinned = rng.random() < 0.5
        classes = tuple(c.key for c in CLASSES if c.library == lib) if pinned else ()
        run_s = min(max(rng.lognormvariate(math.log(900.0), 0.8), 60.0), 7200.0)
        out.append(
            Gang(
                key=f"{ns}/g{i:03d}",
                namespace=ns,
                ranks=ranks,
                min_ranks=max(1, ranks // 2) if elastic else None,
                classes=classes,
                priority=1 if rng.random() < 0.1 else 0,
                arrive_s=round(t, 3),
                run_s=round(run_s, 3),
            )
        )
    return out


def shares(classes: Sequence[ClassRoom] = CLASSES, *, hard: bool = False) -> dict[str, Share]:
    """The namespaces' shares; ``hard``: the ceiling is the guarantee (fcfs)."""
    pool = rules.pool_total(classes)
    out = {}
    for ns, floor, weight, ceiling in NAMESPACES:
        g = pool.times(floor)
        out[ns] = Share(ns, guaranteed=g, ceiling=g if hard else pool.times(ceiling), weight=weight)
    return out


@dataclass(slots=True)
class _Run:
    gang: Gang
    cls: str
    ranks: int
    start_s: float
    work_left: float
    last_s: float
    version: int = 0

    def job(self) -> Job:
        g = self.gang
        return Job(
            key=g.key,
            namespace=g.namespace,
            ranks=self.ranks,
            classes=g.classes,
            priority=g.priority,
            since_s=self.start_s,
            min_ranks=g.min_ranks,
            max_ranks=g.ranks if g.min_ranks is not None else None,
            cls=self.cls,
        )


@dataclass(slots=True)
class Result:
    policy: str
    utilisation_waiting: float = 0.0
    jain: float = 1.0
    waits_s: dict[str, list[float]] = field(default_factory=dict)
    reclaims: int = 0
    reclaim_device_s: float = 0.0
    makespan_s: float = 0.0
    borrowed_peak_over_ceiling: float = 0.0  # must stay 0
    guarantee_broken: int = 0  # reclaims that left a victim below its guarantee: must stay 0

    def summary(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "utilisation_while_waiting": round(self.utilisation_waiting, 4),
            "jain_weighted_dominant_share": round(self.jain, 4),
            "wait_s": {
                ns: {"p50": round(_pct(w, 50), 1), "p99": round(_pct(w, 99), 1)}
                for ns, w in sorted(self.waits_s.items())
            },
            "reclaims": self.reclaims,
            "reclaim_device_s": round(self.reclaim_device_s, 1),
            "makespan_s": round(self.makespan_s, 1),
        }


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class _Sim:
    def __init__(
        self,
        gangs: Sequence[Gang],
        *,
        policy: str,
        classes: Sequence[ClassRoom],
        starvation_s: float,
        reclaim_share_per_min: float,
    ) -> None:
        self.policy = policy
        self.classes = {c.key: c for c in classes}
        self.pool = rules.pool_total(classes)
        self.shares = shares(classes, hard=policy == "fcfs")
        self.rules = rules.Rules(
            starvation_s=starvation_s,
            reclaim_acu_per_min=self.pool.acu * reclaim_share_per_min,
        )
        self.waiting: dict[str, Gang] = {}
        self.running: dict[str, _Run] = {}
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.reclaimed: list[tuple[float, float]] = []
        self.result = Result(policy, waits_s={ns: [] for ns, *_ in NAMESPACES})
        self.first_start: dict[str, float] = {}
        self.total_devices = sum(c.devices for c in classes)
        self._clock = 0.0
        self._busy_wait = self._time_wait = 0.0
        self._jain_sum = self._jain_time = 0.0
        for g in gangs:
            self._push(g.arrive_s, "arrive", g.key)
        self.by_key = {g.key: g for g in gangs}

    def _push(self, at: float, kind: str, key: str, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, key, version))

    def run(self) -> Result:
        while self.events:
            at, _, kind, key, version = heapq.heappop(self.events)
            self._account(at)
            if kind == "arrive":
                self.waiting[key] = self.by_key[key]
            elif kind == "end":
                run = self.running.get(key)
                if run is None or run.version != version:
                    continue  # resized or reclaimed since
                del self.running[key]
            self._decide(at)
        self.result.makespan_s = self._clock
        self.result.utilisation_waiting = (
            self._busy_wait / self._time_wait if self._time_wait else 1.0
        )
        self.result.jain = self._jain_sum / self._jain_time if self._jain_time else 1.0
        return self.result

    # -------------------------------------------------------------- metrics --

    def _account(self, at: float) -> None:
        span = at - self._clock
        if span > 0 and self.waiting:
            busy = sum(r.ranks for r in self.running.values())
            self._busy_wait += busy / self.total_devices * span
            self._time_wait += span
            hungry = sorted({g.namespace for g in self.waiting.values()})
            if len(hungry) >= 2:
                used = rules.usage([r.job() for r in self.running.values()], self.classes)
                values = [
                    rules.dominant_share(
                        used.get(ns, Amount()), pool=self.pool, weight=self.shares[ns].weight
                    )
                    for ns in hungry
                ]
                self._jain_sum += rules.jain(values) * span
                self._jain_time += span
        self._clock = max(self._clock, at)

    # ------------------------------------------------------------ deciding --

    def _decide(self, now: float) -> None:
        for _ in range(64):
            changed = self._fcfs(now) if self.policy == "fcfs" else self._pool(now)
            if not changed:
                return

    def _waiting_jobs(self) -> list[Job]:
        return [
            Job(
                key=g.key,
                namespace=g.namespace,
                ranks=g.ranks,
                classes=g.classes,
                priority=g.priority,
                since_s=g.arrive_s,
                min_ranks=g.min_ranks,
                max_ranks=g.ranks if g.min_ranks is not None else None,
            )
            for g in self.waiting.values()
        ]

    def _pool(self, now: float) -> bool:
        spent = rules.spent_last_minute(self.reclaimed, now=now)
        adm = rules.admit(
            self._waiting_jobs(),
            running=[r.job() for r in self.running.values()],
            classes=self.classes,
            shares=self.shares,
            now=now,
            rules=self.rules,
            reclaimed_last_min_acu=spent,
        )
        for s in adm.start:
            self._start(self.waiting.pop(s.key), s.cls, s.ranks, now)
        for key, more in adm.grow:
            self._resize(self.running[key], self.running[key].ranks + more, now)
        if adm.reclaim is not None and adm.reclaim.ok:
            self._reclaim(adm.reclaim, now)
            return True
        return bool(adm.start or adm.grow)

    def _reclaim(self, found: rules.Reclaim, now: float) -> None:
        self.reclaimed.append((now, found.amount.acu))
        used = rules.usage([r.job() for r in self.running.values()], self.classes)
        for victim in found.victims:
            run = self.running[victim.key]
            after = used[victim.namespace] - victim.amount
            if not after.covers(self.shares[victim.namespace].guaranteed):
                self.result.guarantee_broken += 1
            used[victim.namespace] = after
            self.result.reclaims += 1
            if victim.whole:
                del self.running[victim.key]
                self.result.reclaim_device_s += run.ranks * (now - run.start_s)
                self.waiting[victim.key] = run.gang  # restarts from the beginning
            else:
                self._resize(run, run.ranks - victim.ranks, now)

    def _fcfs(self, now: float) -> bool:
        used = rules.usage([r.job() for r in self.running.values()], self.classes)
        free = rules.free_devices(self.classes, [r.job() for r in self.running.values()])
        for gang in sorted(self.waiting.values(), key=lambda g: (g.arrive_s, g.key)):
            able = [k for k in sorted(self.classes) if not gang.classes or k in gang.classes]
            any_cls = min(able, key=lambda k: (self.classes[k].amount(gang.ranks).acu, k))
            ceiling = self.shares[gang.namespace].ceiling
            ask = self.classes[any_cls].amount(gang.ranks)
            if ceiling is not None and not (used.get(gang.namespace, Amount()) + ask).within(
                ceiling
            ):
                continue  # over its namespace's hard limit: the next one may go
            fits = [k for k in able if free[k] >= gang.ranks]
            if not fits:
                return False  # the oldest allowed gang waits; nothing passes it
            cls = min(fits, key=lambda k: (free[k], k))
            within = used.get(gang.namespace, Amount()) + self.classes[cls].amount(gang.ranks)
            if ceiling is not None and not within.within(ceiling):
                continue
            self._start(self.waiting.pop(gang.key), cls, gang.ranks, now)
            return True
        return False

    def _start(self, gang: Gang, cls: str, ranks: int, now: float) -> None:
        self.first_start.setdefault(gang.key, now)
        if gang.key not in self._counted:
            self._counted.add(gang.key)
            self.result.waits_s[gang.namespace].append(now - gang.arrive_s)
        run = _Run(gang, cls, ranks, now, gang.work, now)
        self.running[gang.key] = run
        self._push(now + run.work_left / ranks, "end", gang.key, run.version)
        self._check_ceiling(gang.namespace)

    def _resize(self, run: _Run, ranks: int, now: float) -> None:
        run.work_left -= run.ranks * (now - run.last_s)
        run.last_s, run.ranks, run.version = now, ranks, run.version + 1
        self._push(now + max(run.work_left, 0.0) / ranks, "end", run.gang.key, run.version)
        self._check_ceiling(run.gang.namespace)

    def _check_ceiling(self, namespace: str) -> None:
        ceiling = self.shares[namespace].ceiling
        used = rules.usage([r.job() for r in self.running.values()], self.classes)
        mine = used.get(namespace, Amount())
        if ceiling is not None and not mine.within(ceiling):
            over = max(mine.acu - ceiling.acu, float(mine.vram_mib - ceiling.vram_mib))
            self.result.borrowed_peak_over_ceiling = max(
                self.result.borrowed_peak_over_ceiling, over
            )

    _counted: set[str]


def simulate(
    gangs: Sequence[Gang],
    *,
    policy: str,
    classes: Sequence[ClassRoom] = CLASSES,
    starvation_s: float = 300.0,
    reclaim_share_per_min: float = 0.15,
) -> Result:
    sim = _Sim(
        gangs,
        policy=policy,
        classes=classes,
        starvation_s=starvation_s,
        reclaim_share_per_min=reclaim_share_per_min,
    )
    sim._counted = set()
    return sim.run()


def render(results: Mapping[str, Result]) -> str:
    lines = []
    for name, r in results.items():
        util_ok = "ok" if r.utilisation_waiting >= TARGET_UTILISATION else "BELOW TARGET"
        jain_ok = "ok" if r.jain >= TARGET_JAIN else "BELOW TARGET"
        lines.append(f"{name}:")
        lines.append(
            f"  utilisation while work waits {r.utilisation_waiting:.3f} "
            f"(target >= {TARGET_UTILISATION}: {util_ok})"
        )
        lines.append(
            f"  Jain's index of weighted dominant shares {r.jain:.3f} "
            f"(target >= {TARGET_JAIN}: {jain_ok})"
        )
        for ns, w in sorted(r.waits_s.items()):
            lines.append(
                f"  wait {ns:<9} p50 {_pct(w, 50):8.1f} s  p99 {_pct(w, 99):8.1f} s  ({len(w)} gangs)"
            )
        lines.append(
            f"  reclaims {r.reclaims}, costing {r.reclaim_device_s:,.0f} device-seconds; "
            f"makespan {r.makespan_s:,.0f} s"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pool", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gap", type=float, default=15.0, help="mean seconds between arrivals")
    parser.add_argument("--starvation", type=float, default=300.0, help="seconds before a claim")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    gangs = trace(gangs=args.gangs, seed=args.seed, gap_s=args.gap)
    results = {p: simulate(gangs, policy=p, starvation_s=args.starvation) for p in ("pool", "fcfs")}
    if args.json:
        print(json.dumps({p: r.summary() for p, r in results.items()}, indent=2))
    else:
        print(
            f"event-driven simulation: {len(gangs)} gangs (seed {args.seed}), "
            f"{sum(c.devices for c in CLASSES)} devices in {len(CLASSES)} classes"
        )
        print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
