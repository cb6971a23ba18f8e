"""A shared pool: queues, fair share, borrowing and reclaim, in ACU and VRAM.
Pure: figures in, decisions out; no I/O, no clock (``now`` is passed in).

Each namespace has a ``Share`` (from its ComputeQuotas): a *guarantee* (ACU
and VRAM it always gets back), a *ceiling* it may borrow up to (today's
``spec.hard``; None: the whole pool) and a *weight*. The rules:

* **Dominant share** of a namespace: the larger of its ACU and VRAM held over
  the pool's, divided by its weight (weighted DRF).
* **Queue order** of waiting gangs: priority (highest first), then the
  weighted dominant share of the gang's namespace (lowest first), then age
  (oldest first), then key. Keys are unique, so the order is total. In an
  admission pass (``Rules.ask_order``) the share is the one the namespace
  would have once the gang runs (``share_after``: its ask counted, the mean
  over the classes it may use), so a large ask waits behind a small one of
  the same share and a namespace of low weight pays more for the same ask;
  a gang waiting longer than ``starvation_s`` counts the share now.
* **Borrowing.** What a namespace may take now (``headroom``): the idle
  capacity less what the other namespaces' guarantees still lack (their
  unmet guarantee stays free for them), up to its own ceiling. A start
  beyond the namespace's guarantee is *borrowed*.
* **Class choice** (``Rules.fair_class``) for a gang that may run on
  several classes that hold it now: the class that leaves the weighted
  dominant shares of the namespaces with work waiting most even (Jain's
  index, to three places: a namespace behind the others takes the class
  worth more, one ahead the class worth less); then, when the start
  borrows, the class that adds least to its namespace's share (a ceiling
  then holds more devices); then the class with the most room left beyond
  what the waiting gangs bound to it ask.
* **Reclaim.** A gang of a namespace whose use stays within its guarantee
  once the gang runs may take capacity back: victims are gangs of
  namespaces above their guarantee that hold devices of a class the gang
  can use; elastic victims give up their ranks above their minimum first,
  then whole gangs go (what is left of a gang that gave ranks, too); newest
  first in each step; a victim is never taken when its namespace would
  fall below its own guarantee; the ACU taken in any minute stays within
  ``reclaim_acu_per_min``. A reclaim that cannot free enough takes nothing.
  The first gang in the order owed one is served (``reclaim_for``). Nothing
  is evicted because a quota is bad (``guarantee_conditions`` only reports
  it).
* **Lending back** (``Rules.lend_elastic``, in ``admit``): ranks of elastic
  gangs above their minimum are lent capacity. When no reclaim is owed, the
  first gang waiting for room (the head first, then queue order) that free
  devices and such ranks on one class would let start takes them back
  (``lend_back_for``; newest first): no work is lost, no namespace goes
  below its guarantee, within the same budget.
* **Fair reclaim** (``Rules.fair_reclaim``, in ``admit``): else, the first
  gang waiting for room (the head first) may take back from gangs of other
  namespaces of no higher priority whose weighted dominant share stays
  above its namespace's once it runs (``fair_reclaim_for``): elastic ranks
  above their minimum first, then whole gangs not already shrunk by it,
  newest first in each; never below a guarantee; within the same budget.
  A victim so queues behind the gang and cannot take the room back at
  once. Neither lending back nor a fair reclaim serves a gang the fair
  backfill rule would still refuse.
* **Backfill** (as ``gang_rules.admit_order``): a gang that cannot start for
  want of room is passed over and gangs behind it start where they fit,
  until it has waited longer than ``starvation_s``. The first such gang in
  the pass (the *head*) then claims the free devices, up to its least
  ranks, of the class it may use (and that is large enough for it) with
  the most free devices; a gang behind the head in the order may start only
  in devices outside that claim, and no elastic gang grows into it. So a
  backfill never delays the head: no start behind it takes from the
  devices it may claim (the most free on any class it may use), which grow
  as work ends; lent elastic ranks and fair reclaims serve it before any
  other gang waiting for room. Only gangs ahead of it in the order (higher
  priority, or a lower share) start first.
  A backfill is also *fair* (``Rules.fair_backfill``): a gang may not take
  devices of a class that a gang ahead of it waits for room on when its
  namespace's weighted dominant share would end above that gang's
  namespace's.
* **Elastic gangs** (``min_ranks < max_ranks``) start at ``min_ranks``, grow
  one rank at a time into devices left idle once the pass has started every
  gang it could, the head's claim is kept and a reclaim's class is left to
  the gang it frees room for (lowest weighted dominant share first, within
  headroom), and shrink highest ranks first on reclaim or lending back.

``admit`` is one pass of all of these (the simulation ``bench.pool`` runs
it); the gang loop (``scheduler.quota.gang_pool``) applies to gang records
the queue order (``pass_order``), borrowing, reclaim (``reclaim_for``),
lending back and fair reclaim, and pins a new gang to the fairest class
(``fairest_class``) at its first member's admission.

Devices are counted per class (``ClassRoom``); a rank takes
``devices_per_rank`` devices of one class, and a gang's ranks all take one
class (one collective library). Placement on nodes is ``gang_rules``'s; these
rules decide who may take how much.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduler.plan.rules import QuotaLimits

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Amount:
    acu: float = 0.0
    vram_mib: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.acu + other.acu, self.vram_mib + other.vram_mib)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.acu - other.acu, self.vram_mib - other.vram_mib)

    def times(self, n: float) -> Amount:
        return Amount(self.acu * n, round(self.vram_mib * n))

    def within(self, other: Amount) -> bool:
        """Not above ``other`` in either resource."""
        return self.acu <= other.acu + _EPS and self.vram_mib <= other.vram_mib

    def covers(self, other: Amount) -> bool:
        """Not below ``other`` in either resource."""
        return self.acu >= other.acu - _EPS and self.vram_mib >= other.vram_mib

    def floor0(self) -> Amount:
        return Amount(max(self.acu, 0.0), max(self.vram_mib, 0))


NONE = Amount()


@dataclass(frozen=True, slots=True)
class ClassRoom:
    """One device class of the pool: how many devices, what each is worth."""

    key: str  # vendor/model
    devices: int
    acu_per_device: float
    vram_mib_per_device: int
    library: str = ""

    def amount(self, devices: int) -> Amount:
        return Amount(self.acu_per_device * devices, self.vram_mib_per_device * devices)


@dataclass(frozen=True, slots=True)
class Share:
    """A namespace's entitlement."""

    namespace: str
    guaranteed: Amount = NONE
    ceiling: Amount | None = None  # None: the whole pool
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Job:
    """A gang, waiting (``since_s``: when it began to wait) or running
    (``since_s``: when it started; ``cls``: its class; ``ranks``: now)."""

    key: str  # namespace/name, unique
    namespace: str
    ranks: int  # running: ranks held; waiting: the ranks it asks (elastic: max)
    devices_per_rank: int = 1
    classes: tuple[str, ...] = ()  # the classes it may run on; () any
    priority: int = 0
    since_s: float = 0.0
    min_ranks: int | None = None  # elastic: the fewest it runs with
    max_ranks: int | None = None  # elastic: the most it grows to
    cls: str = ""  # running: the class it holds

    @property
    def least(self) -> int:
        return self.min_ranks if self.min_ranks is not None else self.ranks

    @property
    def most(self) -> int:
        return max(self.max_ranks or self.ranks, self.ranks)

    def may_use(self, cls: str) -> bool:
        return not self.classes or cls in self.classes


def pool_total(classes: Iterable[ClassRoom]) -> Amount:
    total = NONE
    for c in classes:
        total += c.amount(c.devices)
    return total


def holding(job: Job, classes: Mapping[str, ClassRoom]) -> Amount:
    """What a running job holds."""
    return classes[job.cls].amount(job.ranks * job.devices_per_rank)


def usage(running: Iterable[Job], classes: Mapping[str, ClassRoom]) -> dict[str, Amount]:
    out: dict[str, Amount] = {}
    for job in running:
        out[job.namespace] = out.get(job.namespace, NONE) + holding(job, classes)
    return out


# -------------------------------------------------------------- fair share --


def dominant_share(used: Amount, *, pool: Amount, weight: float) -> float:
    """The larger of ACU and VRAM held over the pool's, over ``weight``."""
    acu = used.acu / pool.acu if pool.acu > 0 else 0.0
    vram = used.vram_mib / pool.vram_mib if pool.vram_mib > 0 else 0.0
    return max(acu, vram, 0.0) / max(weight, _EPS)


def shares_of(
    used: Mapping[str, Amount], shares: Mapping[str, Share], *, pool: Amount
) -> dict[str, float]:
    names = set(used) | set(shares)
    return {
        ns: dominant_share(used.get(ns, NONE), pool=pool, weight=_share(shares, ns).weight)
        for ns in names
    }


def order_key(
    job: Job, *, dominant: Mapping[str, float], after: Mapping[str, float] | None = None
) -> tuple[int, float, float, str]:
    """``after`` (by gang key, when given): the namespace's weighted dominant
    share once the gang runs, used in place of its share now."""
    share = after.get(job.key) if after is not None else None
    if share is None:
        share = dominant.get(job.namespace, 0.0)
    return (-job.priority, round(share, 9), job.since_s, job.key)


def queue_order(
    waiting: Iterable[Job],
    *,
    dominant: Mapping[str, float],
    after: Mapping[str, float] | None = None,
) -> list[Job]:
    """Priority, then weighted dominant share (with ``after``: the share once
    the gang runs, ``share_after``), then age, then key."""
    return sorted(waiting, key=lambda j: order_key(j, dominant=dominant, after=after))


def pass_order(
    waiting: Iterable[Job],
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    classes: Mapping[str, ClassRoom],
    fresh: Collection[str],
) -> list[Job]:
    """The queue as an admission pass first takes it (``Rules.ask_order``):
    the gangs in ``fresh`` (``fresh_keys``) by the share their namespace has
    once they run (``share_after``), the others by the share now."""
    jobs = list(waiting)
    after = {
        j.key: share_after(j, used=used, shares=shares, pool=pool, classes=classes)
        for j in jobs
        if j.key in fresh
    }
    return queue_order(jobs, dominant=shares_of(used, shares, pool=pool), after=after)


def fresh_keys(waiting: Iterable[Job], *, now: float, starvation_s: float) -> frozenset[str]:
    """The gangs that have waited no longer than ``starvation_s``: ordered by
    the share once they run; a gang waiting longer counts the share now."""
    return frozenset(j.key for j in waiting if now - j.since_s <= starvation_s)


def share_after(
    job: Job,
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    classes: Mapping[str, ClassRoom],
) -> float:
    """The weighted dominant share of ``job``'s namespace once it runs at its
    least ranks: the mean over the classes it may use (the class it gets is
    chosen at its start), so a large ask waits behind a small one of the same
    share and a namespace of low weight pays more for the same ask."""
    able = [c for k, c in sorted(classes.items()) if job.may_use(k)]
    if not able:
        return dominant_share(used.get(job.namespace, NONE), pool=pool, weight=1.0)
    mine = used.get(job.namespace, NONE)
    weight = _share(shares, job.namespace).weight
    need = job.least * job.devices_per_rank
    each = [dominant_share(mine + c.amount(need), pool=pool, weight=weight) for c in able]
    return sum(each) / len(each)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one holds all."""
    if not values:
        return 1.0
    square = sum(v * v for v in values)
    if square <= 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square)


# --------------------------------------------------------------- borrowing --


def _share(shares: Mapping[str, Share], namespace: str) -> Share:
    return shares.get(namespace) or Share(namespace)


def unmet(
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    *,
    but: str,
    hungry: Collection[str] | None = None,
) -> Amount:
    """What the guarantees of the namespaces other than ``but`` still lack
    (only those in ``hungry``, the namespaces with work waiting, when given:
    an idle namespace lends its guarantee until it asks, then reclaims it)."""
    out = NONE
    for ns, share in shares.items():
        if ns != but and (hungry is None or ns in hungry):
            out += (share.guaranteed - used.get(ns, NONE)).floor0()
    return out


def headroom(
    namespace: str,
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    hungry: Collection[str] | None = None,
) -> Amount:
    """What ``namespace`` may take now: the idle capacity less the unmet
    guarantees of the other (hungry) namespaces, up to its ceiling."""
    held_all = NONE
    for amount in used.values():
        held_all += amount
    mine = used.get(namespace, NONE)
    room = (pool - held_all - unmet(used, shares, but=namespace, hungry=hungry)).floor0()
    ceiling = _share(shares, namespace).ceiling
    if ceiling is not None:
        left = (ceiling - mine).floor0()
        room = Amount(min(room.acu, left.acu), min(room.vram_mib, left.vram_mib))
    return room


def borrowed(used: Amount, share: Share) -> Amount:
    """The part of ``used`` beyond the guarantee."""
    return (used - share.guaranteed).floor0()


def entitled(
    job: Job,
    ask: Amount,
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    hungry: Collection[str] | None = None,
) -> str:
    """Why ``job`` may not take ``ask`` now ("" when it may)."""
    share = _share(shares, job.namespace)
    mine = used.get(job.namespace, NONE)
    if share.ceiling is not None and not (mine + ask).within(share.ceiling):
        return (
            f"namespace {job.namespace} at its ceiling: holds {_fmt(mine)}, "
            f"asks {_fmt(ask)}, ceiling {_fmt(share.ceiling)}"
        )
    if not ask.within(headroom(job.namespace, used=used, shares=shares, pool=pool, hungry=hungry)):
        lack = unmet(used, shares, but=job.namespace, hungry=hungry)
        return (
            f"idle capacity is kept for other namespaces' guarantees ({_fmt(lack)} unmet); "
            f"asks {_fmt(ask)}"
        )
    return ""


def _fmt(a: Amount) -> str:
    """ACU and VRAM as "100 ACU/80 GiB"; a resource left unbounded (a
    ceiling given in the other only) is not printed."""
    parts = []
    if a.acu < _UNBOUNDED_ACU:
        parts.append(f"{a.acu:g} ACU")
    if a.vram_mib < _UNBOUNDED_MIB:
        parts.append(f"{a.vram_mib // 1024} GiB")
    return "/".join(parts) or "unbounded"


# ------------------------------------------------------------------ admit --


@dataclass(frozen=True, slots=True)
class Start:
    key: str
    cls: str
    ranks: int
    borrowed: Amount  # the part beyond the namespace's guarantee


@dataclass(frozen=True, slots=True)
class Waiting:
    key: str
    position: int  # 1 = next
    reason: str


@dataclass(frozen=True, slots=True)
class Taken:
    """A victim: ``ranks`` of a running gang (all of them: the whole gang)."""

    key: str
    namespace: str
    ranks: int
    whole: bool
    amount: Amount


@dataclass(frozen=True, slots=True)
class Reclaim:
    ok: bool
    reason: str
    victims: tuple[Taken, ...] = ()
    cls: str = ""

    @property
    def amount(self) -> Amount:
        total = NONE
        for v in self.victims:
            total += v.amount
        return total


@dataclass(frozen=True, slots=True)
class Admission:
    order: tuple[str, ...]  # every waiting gang, in queue order
    start: tuple[Start, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    grow: tuple[tuple[str, int], ...] = ()  # (running key, ranks added)
    reclaim: Reclaim | None = None
    head: str = ""  # the starving gang whose room is claimed


@dataclass(frozen=True, slots=True)
class Rules:
    starvation_s: float = 300.0
    reclaim_acu_per_min: float = float("inf")
    fair_backfill: bool = True
    fair_class: bool = True  # a gang that may run on several classes: see ``fairest_class``
    ask_order: bool = True  # the pass orders by the share once the gang runs (``share_after``)
    fair_reclaim: bool = True  # reclaim toward fair shares: see ``fair_reclaim_for``
    lend_elastic: bool = True  # elastic ranks above their minimum are lent: see ``lend_back_for``


def free_devices(classes: Mapping[str, ClassRoom], running: Iterable[Job]) -> dict[str, int]:
    free = {k: c.devices for k, c in classes.items()}
    for job in running:
        free[job.cls] = free.get(job.cls, 0) - job.ranks * job.devices_per_rank
    return free


def _best_class(
    job: Job, ranks: int, free: Mapping[str, int], classes: Mapping[str, ClassRoom]
) -> str:
    """The tightest class that holds the ranks now ("" none): large rooms stay whole."""
    need = ranks * job.devices_per_rank
    able = [k for k in sorted(classes) if job.may_use(k) and free.get(k, 0) >= need]
    return min(able, key=lambda k: (free[k], k), default="")


@dataclass(slots=True)
class _Pass:
    """What one pass knows, updated as it starts gangs."""

    classes: Mapping[str, ClassRoom]
    shares: Mapping[str, Share]
    pool: Amount
    used: dict[str, Amount]
    free: dict[str, int]
    hungry: frozenset[str]  # namespaces with a gang that fits now (borrowing)
    asking: frozenset[str]  # namespaces with work waiting
    pinned: dict[str, float]  # devices of each class asked by gangs bound to some classes

    def share(self, namespace: str, extra: Amount = NONE) -> float:
        held = self.used.get(namespace, NONE) + extra
        return dominant_share(held, pool=self.pool, weight=_share(self.shares, namespace).weight)

    def took(self, job: Job, cls: str, devices: int) -> None:
        self.free[cls] -= devices
        amount = self.classes[cls].amount(devices)
        self.used[job.namespace] = self.used.get(job.namespace, NONE) + amount
        for k, asked in _pinning(job):
            self.pinned[k] = self.pinned.get(k, 0.0) - asked


def _pinning(job: Job) -> list[tuple[str, float]]:
    """What a gang bound to some classes asks of each (spread evenly)."""
    if not job.classes:
        return []
    each = job.least * job.devices_per_rank / len(job.classes)
    return [(k, each) for k in job.classes]


def admit(
    waiting: Iterable[Job],
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    now: float,
    rules: Rules = Rules(),
    reclaimed_last_min_acu: float = 0.0,
) -> Admission:
    """One pass over the queue: who starts (and on which class), who waits
    (position and reason), which elastic gangs grow, and at most one
    reclaim (for a gang owed its guarantee; else ranks lent back; else a
    fair reclaim)."""
    jobs = list(waiting)
    p = _begin(jobs, running=running, classes=classes, shares=shares)
    fresh = (
        fresh_keys(jobs, now=now, starvation_s=rules.starvation_s)
        if rules.ask_order
        else frozenset()
    )  # ordered by the share once they run; the starving by the share now
    order = pass_order(jobs, used=p.used, shares=shares, pool=p.pool, classes=classes, fresh=fresh)
    done = _pass(order, p, fresh=fresh, now=now, rules=rules)
    budget = rules.reclaim_acu_per_min - reclaimed_last_min_acu
    reclaim = _first_reclaim(
        [j for j, _ in done.waits],
        running=running,
        classes=classes,
        shares=shares,
        used=p.used,
        free=p.free,
        budget_acu=budget,
    )
    if reclaim is None or not reclaim.ok:
        found = _toward_fair(done, running=running, p=p, rules=rules, budget_acu=budget)
        if found is not None and (found.ok or reclaim is None):
            reclaim = found
    idle = {k: n - done.claimed.get(k, 0) for k, n in p.free.items()}
    if reclaim is not None and reclaim.ok:
        idle[reclaim.cls] = 0  # what it frees is for the gang it is done for
    return Admission(
        order=tuple(j.key for j in order),
        start=tuple(done.starts),
        waiting=tuple(Waiting(j.key, i + 1, why) for i, (j, why) in enumerate(done.waits)),
        grow=_grow(
            running,
            classes=classes,
            shares=shares,
            used=p.used,
            free=idle,
            pool=p.pool,
            hungry=p.hungry,
        ),
        reclaim=reclaim,
        head=done.head,
    )


def _begin(
    jobs: Sequence[Job],
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
) -> _Pass:
    free = free_devices(classes, running)
    pinned: dict[str, float] = {}
    for j in jobs:
        for k, asked in _pinning(j):
            pinned[k] = pinned.get(k, 0.0) + asked
    return _Pass(
        classes=classes,
        shares=shares,
        pool=pool_total(classes.values()),
        used=usage(running, classes),
        free=free,
        hungry=frozenset(j.namespace for j in jobs if _best_class(j, j.least, free, classes)),
        asking=frozenset(j.namespace for j in jobs),
        pinned=pinned,
    )


@dataclass(slots=True)
class _Done:
    """What a pass decided: starts, waits (in pass order, with reasons),
    the head and the devices kept for it."""

    starts: list[Start] = field(default_factory=list)
    waits: list[tuple[Job, str]] = field(default_factory=list)
    claimed: dict[str, int] = field(default_factory=dict)
    head: str = ""
    blocked: list[Job] = field(default_factory=list)  # waiting for room, in pass order
    ahead: dict[str, int] = field(default_factory=dict)  # gang -> how many were blocked before it


def _pass(
    order: Sequence[Job], p: _Pass, *, fresh: Collection[str], now: float, rules: Rules
) -> _Done:
    done = _Done()
    blocked = done.blocked
    for job in _taken_in_order(order, p, fresh=fresh):
        room = {k: n - done.claimed.get(k, 0) for k, n in p.free.items()}
        why, start = _try(job, room=room, p=p, fair_class=rules.fair_class)
        if start is not None and rules.fair_backfill:
            unfair = _passes(
                job, start, blocked, used=p.used, shares=p.shares, pool=p.pool, classes=p.classes
            )
            if unfair:
                why, start = unfair, None
        if start is not None:
            done.starts.append(start)
            p.took(job, start.cls, start.ranks * job.devices_per_rank)
            continue
        if not done.head and now - job.since_s > rules.starvation_s and why.startswith("room"):
            cls = _claim_class(job, p.free, p.classes)
            if cls:
                done.head = job.key
                done.claimed[cls] = min(p.free[cls], job.least * job.devices_per_rank)
                why += (
                    f"; waiting over {rules.starvation_s:g} s: "
                    f"{done.claimed[cls]} free {cls} kept for it"
                )
        done.ahead[job.key] = len(blocked)
        if why.startswith("room"):
            blocked.append(job)
        done.waits.append((job, why))
    return done


def _toward_fair(
    done: _Done,
    *,
    running: Sequence[Job],
    p: _Pass,
    rules: Rules,
    budget_acu: float,
) -> Reclaim | None:
    """Elastic ranks lent back to the first gang waiting for room (the
    head, then queue order) they let start; else a fair reclaim for the
    first of them. Only the head counts the devices kept for it as free; a
    gang whose start the fair backfill rule would still refuse is not served."""
    roomless = sorted(
        (j for j, why in done.waits if why.startswith("room")), key=lambda j: j.key != done.head
    )
    kw = {"running": running, "classes": p.classes, "shares": p.shares, "used": p.used}
    kept = {k: n - done.claimed.get(k, 0) for k, n in p.free.items()}
    tries: list[tuple[Job, Callable[..., Reclaim | None]]] = []
    if rules.lend_elastic:
        tries += [(job, lend_back_for) for job in roomless]
    if rules.fair_reclaim and roomless:
        tries.append((roomless[0], fair_reclaim_for))
    for job, find in tries:
        free = p.free if job.key == done.head else kept
        found = find(job, **kw, free=free, hungry=p.hungry, budget_acu=budget_acu)
        if found is None:
            continue
        if found.ok and rules.fair_backfill and _still_unfair(job, found, done=done, p=p):
            continue
        return found
    return None


def _still_unfair(job: Job, found: Reclaim, *, done: _Done, p: _Pass) -> bool:
    """Whether the fair backfill rule would still refuse ``job`` the room
    ``found`` frees (a gang ahead of it waits for that class)."""
    left = dict(p.used)
    for v in found.victims:
        left[v.namespace] = left.get(v.namespace, NONE) - v.amount
    start = Start(job.key, found.cls, job.least, NONE)
    ahead = done.blocked[: done.ahead.get(job.key, 0)]
    return bool(
        _passes(job, start, ahead, used=left, shares=p.shares, pool=p.pool, classes=p.classes)
    )


def _passes(
    job: Job,
    start: Start,
    blocked: Sequence[Job],
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    classes: Mapping[str, ClassRoom],
) -> str:
    """Why ``start`` would be an unfair backfill ("" when it is not): it
    takes devices of a class a gang ahead of it waits for room on, and its
    namespace's weighted dominant share would end above that gang's."""
    mine = used.get(job.namespace, NONE) + classes[start.cls].amount(
        start.ranks * job.devices_per_rank
    )
    after = dominant_share(mine, pool=pool, weight=_share(shares, job.namespace).weight)
    for ahead in blocked:
        if ahead.namespace == job.namespace or not ahead.may_use(start.cls):
            continue
        theirs = dominant_share(
            used.get(ahead.namespace, NONE),
            pool=pool,
            weight=_share(shares, ahead.namespace).weight,
        )
        if after > theirs + _EPS:
            return (
                f"fair backfill: {ahead.key} waits for {start.cls} devices and namespace "
                f"{ahead.namespace} has the lower weighted share ({theirs:.3f} < {after:.3f})"
            )
    return ""


def _taken_in_order(order: Sequence[Job], p: _Pass, *, fresh: Collection[str]) -> Iterator[Job]:
    """The queue as a pass takes it: each next gang by ``order_key`` with the
    shares as the starts before it left them (``p.used`` is updated by the
    caller between steps; ``fresh``: the gangs ordered by ``share_after``);
    the same order as ``order`` until a start changes a namespace's share.
    A gang's key is worked out again only when its namespace's use changed."""
    left = list(order)
    keys: dict[str, tuple[int, float, float, str]] = {}
    seen: dict[str, Amount] = {}
    while left:
        for j in left:
            held = p.used.get(j.namespace, NONE)
            if seen.get(j.key) != held:
                seen[j.key] = held
                share = (
                    share_after(j, used=p.used, shares=p.shares, pool=p.pool, classes=p.classes)
                    if j.key in fresh
                    else p.share(j.namespace)
                )
                keys[j.key] = order_key(j, dominant={j.namespace: share})
        job = min(left, key=lambda j: keys[j.key])
        left.remove(job)
        yield job


def _try(
    job: Job, *, room: Mapping[str, int], p: _Pass, fair_class: bool
) -> tuple[str, Start | None]:
    """The start of ``job`` (at its least ranks) or why not."""
    ranks = job.least
    need = ranks * job.devices_per_rank
    cls = (
        _choose_class(job, need, room, p)
        if fair_class
        else _best_class(job, ranks, room, p.classes)
    )
    if not cls:
        usable = [k for k in sorted(p.classes) if job.may_use(k)]
        most = max((room.get(k, 0) for k in usable), default=0)
        return (
            f"room: needs {need} devices of one class "
            f"({', '.join(job.classes) or 'any'}); most free {most}",
            None,
        )
    ask = p.classes[cls].amount(need)
    why = entitled(job, ask, used=p.used, shares=p.shares, pool=p.pool, hungry=p.hungry)
    if why:
        return why, None
    share = _share(p.shares, job.namespace)
    mine = p.used.get(job.namespace, NONE)
    lent = borrowed(mine + ask, share) - borrowed(mine, share)
    return "", Start(job.key, cls, ranks, lent.floor0())


def _choose_class(job: Job, need: int, room: Mapping[str, int], p: _Pass) -> str:
    """Of the classes that hold ``need`` devices now ("" none), the fairest
    (``fairest_class``)."""
    able = [k for k in sorted(p.classes) if job.may_use(k) and room.get(k, 0) >= need]
    return fairest_class(
        job,
        need,
        able,
        room=room,
        used=p.used,
        shares=p.shares,
        pool=p.pool,
        classes=p.classes,
        asking=p.asking,
        pinned=p.pinned,
    )


def fairest_class(
    job: Job,
    need: int,
    able: Sequence[str],
    *,
    room: Mapping[str, int],
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    classes: Mapping[str, ClassRoom],
    asking: Collection[str],
    pinned: Mapping[str, float],
) -> str:
    """Of the classes ``able`` to hold ``need`` devices of ``job`` now ("" none),
    the one that leaves the weighted dominant shares of the namespaces with
    work waiting (``asking``) most even (Jain's index, to three places: a
    namespace behind the others takes the class worth more, one ahead the
    class worth less); then, when the start borrows, the one that adds least
    to its namespace's share; then the one with the most ``room`` left
    beyond what gangs bound to it ask (``pinned``: devices per class)."""
    if len(able) <= 1:
        return able[0] if able else ""

    def share(namespace: str, extra: Amount = NONE) -> float:
        held = used.get(namespace, NONE) + extra
        return dominant_share(held, pool=pool, weight=_share(shares, namespace).weight)

    theirs = [share(ns) for ns in sorted(set(asking) - {job.namespace})]
    guarantee = _share(shares, job.namespace).guaranteed
    mine = used.get(job.namespace, NONE)
    own = dict(_pinning(job))

    def rank(k: str) -> tuple[float, float, float, str]:
        ask = classes[k].amount(need)
        after = share(job.namespace, ask)
        lends = not (mine + ask).within(guarantee)
        spare = room[k] - need - (pinned.get(k, 0.0) - own.get(k, 0.0))
        return (round(jain([*theirs, after]), 3), -round(after, 3) if lends else 0.0, spare, k)

    return max(able, key=rank)


def _claim_class(job: Job, free: Mapping[str, int], classes: Mapping[str, ClassRoom]) -> str:
    need = job.least * job.devices_per_rank
    able = [k for k in sorted(classes) if job.may_use(k) and classes[k].devices >= need]
    return min(able, key=lambda k: (-free.get(k, 0), k), default="")


def _grow(
    running: Sequence[Job],
    *,
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: dict[str, Amount],
    free: dict[str, int],
    pool: Amount,
    hungry: Collection[str],
) -> tuple[tuple[str, int], ...]:
    """Elastic gangs grow one rank at a time, lowest weighted dominant share
    first, into free devices of their class within their headroom: devices
    no waiting gang could take in this pass (every gang that fits and may
    start has started) and no starving head claims."""
    room = {j.key: j.ranks for j in running if j.most > j.ranks}
    most = {j.key: j.most for j in running}
    added: dict[str, int] = {}
    while True:
        dominant = shares_of(used, shares, pool=pool)
        able = [
            j
            for j in running
            if j.key in room
            and room[j.key] + added.get(j.key, 0) < most[j.key]
            and free.get(j.cls, 0) >= j.devices_per_rank
            and classes[j.cls]
            .amount(j.devices_per_rank)
            .within(headroom(j.namespace, used=used, shares=shares, pool=pool, hungry=hungry))
        ]
        if not able:
            break
        job = min(able, key=lambda j: order_key(j, dominant=dominant))
        added[job.key] = added.get(job.key, 0) + 1
        free[job.cls] -= job.devices_per_rank
        used[job.namespace] = used.get(job.namespace, NONE) + classes[job.cls].amount(
            job.devices_per_rank
        )
    return tuple(sorted(added.items()))


# ---------------------------------------------------------------- reclaim --


def owed(job: Job, ask: Amount, *, used: Mapping[str, Amount], shares: Mapping[str, Share]) -> bool:
    """Whether ``job`` runs within its namespace's guarantee (reclaim may serve it)."""
    share = _share(shares, job.namespace)
    return (used.get(job.namespace, NONE) + ask).within(share.guaranteed)


def _first_reclaim(
    waits: Sequence[Job],
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    budget_acu: float,
) -> Reclaim | None:
    """The reclaim (done or refused) for the first gang, in queue order,
    owed one; None when no gang is owed one."""
    for job in waits:
        found = reclaim_for(
            job,
            running=running,
            classes=classes,
            shares=shares,
            used=used,
            free=free,
            budget_acu=budget_acu,
        )
        if found is not None:
            return found
    return None


def reclaim_for(
    job: Job,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    budget_acu: float,
) -> Reclaim | None:
    """The victims whose devices let ``job`` start within its guarantee;
    None when it is not owed one (it would borrow), a refused ``Reclaim``
    (with its reason) when no class can be freed within the rules."""
    need = job.least * job.devices_per_rank
    tried: list[Reclaim] = []
    for cls in sorted(classes):
        if not job.may_use(cls) or classes[cls].devices < need:
            continue
        if not owed(job, classes[cls].amount(need), used=used, shares=shares):
            continue
        short = need - free.get(cls, 0)
        if short <= 0:
            continue  # room is there: it waits on nothing reclaim can give
        tried.append(
            _victims(job, cls, short, running=running, classes=classes, shares=shares, used=used)
        )
    if not tried:
        return None
    found = [r for r in tried if r.ok]
    if not found:
        return tried[0]
    return _within_budget(job, min(found, key=_cost), budget_acu)


def _cost(r: Reclaim) -> tuple[float, int, str]:
    return (r.amount.acu, len(r.victims), r.cls)


def _within_budget(job: Job, best: Reclaim, budget_acu: float) -> Reclaim:
    if best.amount.acu > budget_acu + _EPS:
        return Reclaim(
            ok=False,
            reason=f"reclaim for {job.key} deferred: {best.amount.acu:g} ACU over the "
            f"budget left this minute ({max(budget_acu, 0.0):g} ACU)",
            cls=best.cls,
        )
    return best


def _victims(
    job: Job,
    cls: str,
    short: int,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
) -> Reclaim:
    taken, freed = _take(
        job,
        cls,
        short,
        running=running,
        classes=classes,
        shares=shares,
        used=used,
        may=lambda _victim, _after: True,
    )
    if freed < short:
        return Reclaim(
            ok=False,
            reason=f"reclaim for {job.key}: namespaces above their guarantee hold "
            f"{freed} of the {short} {cls} devices it lacks",
            cls=cls,
        )
    return Reclaim(
        ok=True,
        reason=f"reclaim for {job.key} (within its guarantee): {freed} {cls} devices",
        victims=_merged(taken),
        cls=cls,
    )


def _take(
    job: Job,
    cls: str,
    short: int,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    may: Callable[[Job, Amount], bool],
    whole: bool = True,
    rest: bool = True,
    own: bool = False,
) -> tuple[list[Taken], int]:
    """Victims on ``cls`` for ``job`` until ``short`` devices are freed:
    elastic ranks above their minimum first, then (``whole``) whole gangs,
    newest first in each; a gang that gave ranks in the first step goes
    whole only with ``rest`` (what is left of it). A victim is never taken
    when its namespace would fall below its guarantee or ``may(victim, its
    namespace's use after)`` says no; gangs of ``job``'s own namespace only
    when ``own``."""
    left = dict(used)
    room = classes[cls]
    taken: list[Taken] = []
    gave: dict[str, int] = {}
    freed = 0
    on_class = [
        r
        for r in running
        if r.cls == cls and r.key != job.key and (own or r.namespace != job.namespace)
    ]
    newest = sorted(on_class, key=lambda r: (-r.since_s, r.key))
    for elastic in (True, False) if whole else (True,):
        for victim in newest:
            if freed >= short:
                break
            already = gave.get(victim.key, 0)
            if elastic:
                spare = victim.ranks - victim.least - already
                ranks = min(spare, -(-(short - freed) // victim.devices_per_rank))
            else:
                ranks = victim.ranks - already if rest or not already else 0
            if ranks <= 0:
                continue
            amount = room.amount(ranks * victim.devices_per_rank)
            after = left.get(victim.namespace, NONE) - amount
            if not after.covers(_share(shares, victim.namespace).guaranteed):
                continue  # never below its own guarantee
            if not may(victim, after):
                continue
            left[victim.namespace] = after
            gave[victim.key] = already + ranks
            taken.append(
                Taken(victim.key, victim.namespace, ranks, already + ranks == victim.ranks, amount)
            )
            freed += ranks * victim.devices_per_rank
    return taken, freed


def lend_back_for(
    job: Job,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    hungry: Collection[str],
    budget_acu: float,
) -> Reclaim | None:
    """Elastic ranks above their minimum are capacity lent: for ``job``
    waiting for room, the ranks of elastic gangs (of any namespace) on a
    class it may use that, with the free devices, let it start now (no work
    is lost; never a namespace below its guarantee). None when no class can
    be freed so."""
    return _toward(
        job,
        "lent back",
        running=running,
        classes=classes,
        shares=shares,
        used=used,
        free=free,
        hungry=hungry,
        budget_acu=budget_acu,
        fair=False,
    )


def fair_reclaim_for(
    job: Job,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    hungry: Collection[str],
    budget_acu: float,
) -> Reclaim | None:
    """Reclaim toward fair shares, for ``job`` waiting for room: victims are
    gangs of other namespaces of no higher priority whose weighted dominant
    share stays above ``job``'s namespace's once it runs (so a victim queues
    behind it and cannot take the room back): elastic ranks above their
    minimum first, then whole gangs it has not shrunk, newest first in each;
    never below a guarantee; within the budget. None when no class can be
    freed so."""
    return _toward(
        job,
        "fair reclaim",
        running=running,
        classes=classes,
        shares=shares,
        used=used,
        free=free,
        hungry=hungry,
        budget_acu=budget_acu,
        fair=True,
    )


def _toward(
    job: Job,
    what: str,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    hungry: Collection[str],
    budget_acu: float,
    fair: bool,
) -> Reclaim | None:
    pool = pool_total(classes.values())
    need = job.least * job.devices_per_rank
    found: list[Reclaim] = []
    for cls in sorted(classes):
        short = need - free.get(cls, 0)
        if not job.may_use(cls) or classes[cls].devices < need or short <= 0:
            continue
        ask = classes[cls].amount(need)
        mine = dominant_share(
            used.get(job.namespace, NONE) + ask,
            pool=pool,
            weight=_share(shares, job.namespace).weight,
        )

        def may(victim: Job, after: Amount, mine: float = mine) -> bool:
            if not fair:
                return True
            weight = _share(shares, victim.namespace).weight
            return victim.priority <= job.priority and (
                dominant_share(after, pool=pool, weight=weight) > mine + _EPS
            )

        taken, freed = _take(
            job,
            cls,
            short,
            running=running,
            classes=classes,
            shares=shares,
            used=used,
            may=may,
            whole=fair,
            rest=False,  # a gang shrunk toward fair shares is not also ended
            own=not fair,
        )
        if freed < short:
            continue
        left = dict(used)
        for t in taken:
            left[t.namespace] = left[t.namespace] - t.amount
        if entitled(job, ask, used=left, shares=shares, pool=pool, hungry=hungry):
            continue  # freed, it still could not start
        found.append(
            Reclaim(
                ok=True,
                reason=f"{what} for {job.key}: {freed} {cls} devices",
                victims=_merged(taken),
                cls=cls,
            )
        )
    if not found:
        return None
    return _within_budget(job, min(found, key=_cost), budget_acu)


def _merged(taken: Sequence[Taken]) -> tuple[Taken, ...]:
    out: dict[str, Taken] = {}
    for t in taken:
        was = out.get(t.key)
        if was is None:
            out[t.key] = t
        else:
            out[t.key] = replace(
                was, ranks=was.ranks + t.ranks, whole=t.whole, amount=was.amount + t.amount
            )
    return tuple(out.values())


def spent_last_minute(history: Iterable[tuple[float, float]], *, now: float) -> float:
    """ACU reclaimed in ``(now - 60, now]`` from (time, ACU) records."""
    return sum(acu for t, acu in history if now - 60.0 < t <= now)


# -------------------------------------------------------------- conditions --


@dataclass(frozen=True, slots=True)
class Condition:
    """One ``status.conditions`` entry of a ComputeQuota."""

    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


def guarantee_conditions(
    shares: Mapping[str, Share],
    *,
    pool: Amount,
    by_class: Mapping[str, Mapping[str, Amount]] | None = None,
    class_pool: Mapping[str, Amount] | None = None,
) -> dict[str, Condition]:
    """``GuaranteeFits`` per namespace: False with the reason when its
    guarantee is larger than the pool (``GuaranteeExceedsPool``), a class
    guarantee larger than that class (``ClassGuaranteeExceedsClass``), or all
    guarantees together exceed the pool (``GuaranteesOversubscribed``: every
    namespace with a guarantee is told). Reported only: nothing running is
    evicted because of it."""
    total = NONE
    for s in shares.values():
        total += s.guaranteed
    out: dict[str, Condition] = {}
    for ns, share in sorted(shares.items()):
        g = share.guaranteed
        if not g.within(pool):
            out[ns] = Condition(
                "GuaranteeFits",
                "False",
                "GuaranteeExceedsPool",
                f"guarantee {_fmt(g)} is larger than the pool ({_fmt(pool)})",
            )
            continue
        bad = _class_problem(by_class.get(ns, {}) if by_class else {}, class_pool or {})
        if bad:
            out[ns] = Condition("GuaranteeFits", "False", "ClassGuaranteeExceedsClass", bad)
            continue
        if g != NONE and not total.within(pool):
            out[ns] = Condition(
                "GuaranteeFits",
                "False",
                "GuaranteesOversubscribed",
                f"the guarantees of all namespaces sum to {_fmt(total)}, beyond the pool "
                f"({_fmt(pool)}); this one ({_fmt(g)}) may not be met in full",
            )
            continue
        out[ns] = Condition("GuaranteeFits", "True", "Fits", f"guarantee {_fmt(g)} fits the pool")
    return out


def _class_problem(mine: Mapping[str, Amount], class_pool: Mapping[str, Amount]) -> str:
    for cls, g in sorted(mine.items()):
        have = class_pool.get(cls, NONE)
        if not g.within(have):
            return f"guarantee on {cls} {_fmt(g)} is larger than that class ({_fmt(have)})"
    return ""


# ------------------------------------------------------------ from quotas --


def share_of(namespace: str, limits: QuotaLimits | None, *, pool: Amount | None = None) -> Share:
    """A namespace's share from its ComputeQuota limits: no quota, no
    guarantee and the whole pool as ceiling; a ceiling given in one resource
    only leaves the other unbounded; a guarantee given in one resource only
    guarantees the same fraction of ``pool`` in the other (nothing when the
    pool is not given)."""
    if limits is None:
        return Share(namespace)
    ceiling = None
    if limits.acu is not None or limits.vram_mib is not None:
        ceiling = Amount(
            limits.acu if limits.acu is not None else _UNBOUNDED_ACU,
            limits.vram_mib if limits.vram_mib is not None else _UNBOUNDED_MIB,
        )
    acu, vram = limits.guaranteed_acu, limits.guaranteed_vram_mib
    if pool is not None and pool.acu > 0 and pool.vram_mib > 0:
        if acu is not None and vram is None:
            vram = round(acu / pool.acu * pool.vram_mib)
        elif vram is not None and acu is None:
            acu = vram / pool.vram_mib * pool.acu
    if ceiling is not None:  # a derived guarantee stays under the ceiling
        acu = min(acu, ceiling.acu) if acu is not None else None
        vram = min(vram, ceiling.vram_mib) if vram is not None else None
    return Share(
        namespace,
        guaranteed=Amount(acu or 0.0, vram or 0),
        ceiling=ceiling,
        weight=limits.weight,
    )


def class_guarantees(limits: QuotaLimits | None) -> dict[str, Amount]:
    """Guarantees per class (vendor/model or collective library)."""
    if limits is None:
        return {}
    return {key: Amount(acu or 0.0, vram or 0) for key, vram, acu in limits.guaranteed_classes}


_UNBOUNDED_ACU = float("inf")
_UNBOUNDED_MIB = 1 << 62
