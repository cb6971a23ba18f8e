/* Shared accounting file: versioned header, per-device counters, per-process
 * slots. Hot path: hcs_charge / hcs_refund (atomics only). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hcs.h"

static uint64_t proc_start_time(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* after ") " comes field 3; starttime is field 22 */
    for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

static int pid_alive(int pid, uint64_t start) {
    if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
    if (start) {
        uint64_t now = proc_start_time(pid);
        if (now && now != start) return 0; /* pid reused */
    }
    return 1;
}

static void init_header(struct hcs_shm *s) {
    memset(s, 0, sizeof *s);
    s->h.version = HCS_SHM_VERSION;
    s->h.header_size = sizeof(struct hcs_shm_header);
    s->h.max_devices = HCS_MAX_DEVICES;
    s->h.max_slots = HCS_MAX_SLOTS;
    s->h.total_size = sizeof(struct hcs_shm);
    s->h.slot_shards = HCS_SLOT_SHARDS;
    s->h.line = HCS_LINE;
    for (int i = 0; i < HCS_MAX_DEVICES; i++) s->dev[i].quota = hcs_g.quota[i];
    __atomic_store_n(&s->h.magic, HCS_SHM_MAGIC, __ATOMIC_RELEASE);
}

static int open_private(void) {
    void *m = mmap(NULL, sizeof(struct hcs_shm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    init_header(m);
    hcs_g.shm = m;
    hcs_g.shared = 0;
    return 0;
}

/* Map (creating if needed) the accounting file. On an unusable file fall
 * back to process-private accounting, complaining loudly. */
int hcs_shm_open(const char *path) {
    const size_t size = sizeof(struct hcs_shm);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        HCS_LOG(HCS_LOG_ERROR, "open %s: %s; quota enforced per process only", path, strerror(errno));
        return open_private();
    }
    (void)fchmod(fd, 0666); /* every process of the container shares it */
    if (flock(fd, LOCK_EX) != 0) {
        HCS_LOG(HCS_LOG_ERROR, "flock %s: %s", path, strerror(errno));
        close(fd);
        return open_private();
    }
    struct stat st;
    int fresh = 0;
    const char *why = NULL;
    if (fstat(fd, &st) != 0) why = "fstat failed";
    else if (st.st_size == 0) {
        if (ftruncate(fd, (off_t)size) != 0) why = "ftruncate failed";
        fresh = 1;
    } else if ((size_t)st.st_size < sizeof(struct hcs_shm_header)) {
        why = "file too small for header";
    }
    struct hcs_shm *s = NULL;
    if (!why) {
        size_t map_size = fresh ? size : (size_t)st.st_size;
        void *m = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) why = "mmap failed";
        else s = m;
        if (s && fresh) init_header(s);
        if (s && !fresh) {
            if (s->h.magic != HCS_SHM_MAGIC) why = "bad magic";
            else if (s->h.version != HCS_SHM_VERSION) why = "layout version mismatch";
            else if (s->h.max_devices != HCS_MAX_DEVICES || s->h.max_slots != HCS_MAX_SLOTS ||
                     s->h.slot_shards != HCS_SLOT_SHARDS || s->h.line != HCS_LINE ||
                     s->h.header_size != sizeof(struct hcs_shm_header) || s->h.total_size != size ||
                     (size_t)st.st_size < size)
                why = "layout geometry mismatch";
            if (why) {
                HCS_LOG(HCS_LOG_ERROR, "%s: %s (found version %u, expected %u); refusing to use it", path, why,
                        s->h.magic == HCS_SHM_MAGIC ? s->h.version : 0u, HCS_SHM_VERSION);
                munmap(m, map_size);
                s = NULL;
                why = "";
            }
        }
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (!s) {
        if (why && *why) HCS_LOG(HCS_LOG_ERROR, "%s: %s", path, why);
        HCS_LOG(HCS_LOG_ERROR, "falling back to per-process accounting");
        return open_private();
    }
    hcs_g.shm = s;
    hcs_g.shared = 1;
    return 0;
}

/* Give a slot's usage back to the device counters and free the slot. The
 * caller must own the slot exclusively (pid already swapped to -1). */
static void drain_slot(struct hcs_shm_slot *sl) {
    for (int d = 0; d < HCS_MAX_DEVICES; d++) {
        uint64_t x = 0; /* the process's charge: shard sums, modulo 2^64 */
        for (int k = 0; k < HCS_SLOT_SHARDS; k++) {
            x += atomic_exchange_explicit(&sl->shard[k].used[d], 0, memory_order_acq_rel);
            x += atomic_exchange_explicit(&sl->shard[k].reserve[d], 0, memory_order_acq_rel);
        }
        if (x) atomic_fetch_sub_explicit(&hcs_g.shm->dev[d].used, x, memory_order_acq_rel);
    }
    atomic_store_explicit(&sl->start_time, 0, memory_order_relaxed);
    atomic_store_explicit(&sl->pid, 0, memory_order_release);
}

/* Reclaim the usage of processes that died without freeing. */
void hcs_reap(void) {
    struct hcs_shm *s = hcs_g.shm;
    if (!s) return;
    int self = (int)getpid();
    for (int i = 0; i < HCS_MAX_SLOTS; i++) {
        struct hcs_shm_slot *sl = &s->slot[i];
        int32_t pid = atomic_load_explicit(&sl->pid, memory_order_acquire);
        if (pid <= 0 || pid == self) continue;
        if (pid_alive(pid, atomic_load_explicit(&sl->start_time, memory_order_relaxed))) continue;
        int32_t expect = pid;
        if (!atomic_compare_exchange_strong(&sl->pid, &expect, -1)) continue;
        HCS_LOG(HCS_LOG_INFO, "reclaiming usage of dead process %d", pid);
        drain_slot(sl);
    }
}

static struct hcs_shm_slot *claim_slot(void) {
    struct hcs_shm *s = hcs_g.shm;
    int self = (int)getpid();
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < HCS_MAX_SLOTS; i++) {
            struct hcs_shm_slot *sl = &s->slot[i];
            int32_t expect = 0;
            if (atomic_load_explicit(&sl->pid, memory_order_relaxed) != 0) continue;
            if (!atomic_compare_exchange_strong(&sl->pid, &expect, self)) continue;
            for (int k = 0; k < HCS_SLOT_SHARDS; k++)
                for (int d = 0; d < HCS_MAX_DEVICES; d++) {
                    atomic_store_explicit(&sl->shard[k].used[d], 0, memory_order_relaxed);
                    atomic_store_explicit(&sl->shard[k].reserve[d], 0, memory_order_relaxed);
                }
            atomic_store_explicit(&sl->start_time, proc_start_time(self), memory_order_release);
            struct hcs_shm_slot *none = NULL;
            if (!atomic_compare_exchange_strong(&hcs_g.slot, &none, sl)) {
                /* another thread won the race: give ours back */
                atomic_store_explicit(&sl->start_time, 0, memory_order_relaxed);
                atomic_store_explicit(&sl->pid, 0, memory_order_release);
                return none;
            }
            return sl;
        }
        hcs_reap();
    }
    HCS_LOG(HCS_LOG_ERROR, "no free process slot in the accounting file; refusing allocation");
    return NULL;
}

void hcs_release_own_slot(void) {
    struct hcs_shm_slot *sl = atomic_exchange(&hcs_g.slot, NULL);
    if (!sl) return;
    int32_t expect = (int32_t)getpid();
    if (atomic_compare_exchange_strong(&sl->pid, &expect, -1)) drain_slot(sl);
}

void hcs_after_fork_child(void) {
    /* The child owns none of the parent's allocations. */
    atomic_store(&hcs_g.slot, NULL);
    hcs_ptrtab_reset();
}

/* Per thread: the shard of the process slot this thread adds to (0: not
 * picked yet), and the device counter value this thread last saw. */
static __thread unsigned tls_shard __attribute__((tls_model("initial-exec")));
static __thread uint64_t tls_seen __attribute__((tls_model("initial-exec")));
static _Atomic unsigned next_shard;

static inline struct hcs_shm_shard *my_shard(struct hcs_shm_slot *sl) {
    unsigned k = tls_shard;
    if (HCS_UNLIKELY(k == 0)) {
        k = atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) % HCS_SLOT_SHARDS + 1;
        tls_shard = k;
    }
    return &sl->shard[k - 1];
}

/* Give every reserve on dev (all processes) back to the device counter.
 * Runs before a refusal and in memory-info calls, never on the hot path.
 * The exchange hands each reserve to exactly one of: its owner (taking from
 * it), another stealer, or drain_slot. */
static int steal_reserves(int dev) {
    struct hcs_shm *s = hcs_g.shm;
    int any = 0;
    for (int i = 0; i < HCS_MAX_SLOTS; i++) {
        struct hcs_shm_slot *sl = &s->slot[i];
        if (atomic_load_explicit(&sl->pid, memory_order_relaxed) == 0) continue;
        for (int k = 0; k < HCS_SLOT_SHARDS; k++) {
            _Atomic uint64_t *r = &sl->shard[k].reserve[dev];
            if (atomic_load_explicit(r, memory_order_relaxed) == 0) continue;
            uint64_t x = atomic_exchange_explicit(r, 0, memory_order_acq_rel);
            if (x) {
                atomic_fetch_sub_explicit(&s->dev[dev].used, x, memory_order_release);
                any = 1;
            }
        }
    }
    return any;
}

/* Add size to *u unless the result would exceed q. The CAS only succeeds
 * when *u still equals cur, and cur + size <= q was checked just before, so
 * the counter never goes past the quota, whatever other threads and
 * processes do at the same time (every change of *u is an atomic RMW, so
 * they are all in one total order).
 *
 * The first CAS is tried with the value this thread last saw instead of a
 * fresh load. A load of a line another core is writing fetches it shared,
 * and the CAS then needs a second transfer to own it; a CAS with a stale
 * guess fails but leaves the line owned by this core and returns the current
 * value, so the retry normally succeeds without another transfer. Relaxed
 * order is enough: the quota invariant is about this one location. */
static inline int try_add(_Atomic uint64_t *u, uint64_t size, uint64_t q) {
    if (size > q) return 0;
    uint64_t cur = tls_seen;
    if (cur > q - size) cur = atomic_load_explicit(u, memory_order_relaxed);
    for (;;) {
        if (cur > q - size) {
            tls_seen = cur;
            return 0;
        }
        if (atomic_compare_exchange_weak_explicit(u, &cur, cur + size, memory_order_relaxed, memory_order_relaxed)) {
            tls_seen = cur + size;
            return 1;
        }
    }
}

/* Accounting, per device d:
 *   dev[d].used = sum over slots and shards of (used[d] + reserve[d])
 *                 (+ amounts in flight between two steps below)
 * The device counter only grows through try_add, which never takes it past
 * the quota, and the bytes of live allocations are part of it, so they never
 * exceed the quota either. Taking from a reserve and putting into one only
 * move bytes inside a slot; the device counter does not change.
 * Every move takes from its source first and adds to its target second, so
 * a process killed between the two leaves the bytes counted in dev[d].used
 * but in no slot: an over-count, never an under-count. */
int hcs_charge(int dev, uint64_t size) {
    if (HCS_UNLIKELY((unsigned)dev >= HCS_MAX_DEVICES)) return 0;
    uint64_t q = hcs_g.quota[dev];
    if (q == HCS_UNLIMITED) return 0;
    struct hcs_shm_slot *sl = atomic_load_explicit(&hcs_g.slot, memory_order_acquire);
    if (HCS_UNLIKELY(!sl)) {
        sl = claim_slot();
        if (!sl) return -1;
    }
    struct hcs_shm_shard *sh = my_shard(sl);
    /* 1. this thread's reserve: lines no other thread writes, normally */
    _Atomic uint64_t *res = &sh->reserve[dev];
    uint64_t r = atomic_load_explicit(res, memory_order_relaxed);
    while (r >= size) {
        if (atomic_compare_exchange_weak_explicit(res, &r, r - size, memory_order_relaxed, memory_order_relaxed)) {
            atomic_fetch_add_explicit(&sh->used[dev], size, memory_order_release);
            return 1;
        }
    }
    /* 2. the device counter, shared by all processes */
    _Atomic uint64_t *u = &hcs_g.shm->dev[dev].used;
    if (HCS_UNLIKELY(!try_add(u, size, q))) {
        /* reserves anywhere, then a crashed process, may hold the bytes */
        if (!(steal_reserves(dev) && try_add(u, size, q))) {
            hcs_reap();
            if (!try_add(u, size, q)) {
                HCS_LOG(HCS_LOG_INFO, "device %d: %llu bytes refused (used %llu of %llu)", dev,
                        (unsigned long long)size, (unsigned long long)atomic_load(u), (unsigned long long)q);
                return -1;
            }
        }
    }
    /* Release: whoever drains the slot sees the device add before it. */
    atomic_fetch_add_explicit(&sh->used[dev], size, memory_order_release);
    return 1;
}

void hcs_refund(int dev, uint64_t size) {
    struct hcs_shm_slot *sl = atomic_load_explicit(&hcs_g.slot, memory_order_acquire);
    if (HCS_UNLIKELY(!sl)) return; /* slot already released at exit */
    struct hcs_shm_shard *sh = my_shard(sl);
    atomic_fetch_sub_explicit(&sh->used[dev], size, memory_order_relaxed);
    /* Keep it as this thread's reserve if that stays under the cap (a soft
     * cap: threads sharing a shard may pass it a little). */
    uint64_t cap = hcs_g.quota[dev] >> HCS_RESERVE_SHIFT;
    _Atomic uint64_t *res = &sh->reserve[dev];
    uint64_t r = atomic_load_explicit(res, memory_order_relaxed);
    if (HCS_LIKELY(size <= cap && r <= cap - size)) {
        atomic_fetch_add_explicit(res, size, memory_order_release);
        return;
    }
    tls_seen = atomic_fetch_sub_explicit(&hcs_g.shm->dev[dev].used, size, memory_order_release) - size;
}

int hcs_view(int dev, uint64_t phys_free, uint64_t *free, uint64_t *total) {
    if ((unsigned)dev >= HCS_MAX_DEVICES || hcs_g.quota[dev] == HCS_UNLIMITED) return 0;
    uint64_t q = hcs_g.quota[dev];
    hcs_reap(); /* not a hot path: show memory of dead processes as free */
    steal_reserves(dev); /* and quota kept in reserves */
    uint64_t used = atomic_load_explicit(&hcs_g.shm->dev[dev].used, memory_order_acquire);
    uint64_t f = used < q ? q - used : 0;
    if (f > phys_free) f = phys_free;
    *free = f;
    *total = q;
    return 1;
}
