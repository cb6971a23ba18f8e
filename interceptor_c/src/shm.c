/* Shared accounting file: versioned header, per-process slots whose shards
 * hold (charged, reserve) pairs per device. Hot path: hcs_charge /
 * hcs_refund on the calling thread's own shard (one atomic each).
 *
 * Crash safety: every change of the file is one atomic instruction, so a
 * process killed at any instruction leaves every pair consistent, and all
 * of its usage sits in its own slot. There is no device total that could
 * keep a dead process's bytes: the usage of a device is the sum over the
 * slots in use, computed when an allocation does not fit the thread's
 * reserve.
 *
 * Ownership: a process owns its slot by holding an OFD lock (fcntl
 * F_OFD_SETLK) on one byte of the file. The kernel drops the lock when the
 * process dies, whatever its pid namespace, so the containers of a pod (each
 * with its own pid namespace) share one file safely: no pid is ever compared
 * across namespaces, and pid reuse cannot fool it. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hcs.h"

/* Serialises claiming and reaping inside the process: threads share the OFD
 * and therefore its locks. */
static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t proc_start_time(int pid) {
    char path[64], buf[1024];
    if (pid > 0) snprintf(path, sizeof path, "/proc/%d/stat", pid);
    else snprintf(path, sizeof path, "/proc/self/stat");
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

static uint64_t own_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Only meaningful for a pid of our own pid namespace. */
static int pid_alive(int pid, uint64_t start) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
    if (start) {
        uint64_t now = proc_start_time(pid);
        if (now && now != start) return 0; /* pid reused */
    }
    return 1;
}

static int ofd_lock(int fd, uint64_t byte, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)byte;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl) == 0;
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

static const char *check_layout(const struct hcs_shm *s, size_t file_size) {
    if (s->h.magic != HCS_SHM_MAGIC) return "bad magic";
    if (s->h.version != HCS_SHM_VERSION) return "layout version mismatch";
    if (s->h.max_devices != HCS_MAX_DEVICES || s->h.max_slots != HCS_MAX_SLOTS ||
        s->h.slot_shards != HCS_SLOT_SHARDS || s->h.line != HCS_LINE ||
        s->h.header_size != sizeof(struct hcs_shm_header) || s->h.total_size != sizeof(struct hcs_shm) ||
        file_size < sizeof(struct hcs_shm))
        return "layout geometry mismatch";
    return NULL;
}

static int open_private(void) {
    void *m = mmap(NULL, sizeof(struct hcs_shm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    init_header(m);
    hcs_g.shm = m;
    hcs_g.shared = 0;
    hcs_g.fd = -1;
    return 0;
}

/* Who may use the file: a regular file (no symlink), writable by nobody
 * outside the owner and its group. A file we own with wider permissions is
 * narrowed; anyone else's is refused. */
static const char *check_owner(int fd, const struct stat *st) {
    if (!S_ISREG(st->st_mode)) return "not a regular file";
    if (st->st_mode & (S_IWOTH | S_IROTH)) {
        if (st->st_uid != geteuid()) return "accessible to other users and not ours";
        if (fchmod(fd, st->st_mode & 0660) != 0) return "cannot narrow its permissions";
    }
    return NULL;
}

/* Open the accounting file, creating it when absent. An existing file is
 * opened without O_CREAT: in a sticky world-writable directory such as the
 * pod's /dev/shm, fs.protected_regular refuses O_CREAT on a file that another
 * user created, even one we may write. */
static int open_or_create(const char *path) {
    for (int tries = 0; tries < 3; tries++) {
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 || errno != ENOENT) return fd;
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0660);
        if (fd >= 0 || errno != EEXIST) return fd;  /* EEXIST: another process won */
    }
    return -1;
}

/* Map (creating if needed) the accounting file. On an unusable file fall
 * back to process-private accounting, complaining loudly. The descriptor
 * stays open: it carries the OFD lock of our slot. */
int hcs_shm_open(const char *path) {
    const size_t size = sizeof(struct hcs_shm);
    snprintf(hcs_g.path, sizeof hcs_g.path, "%s", path);
    hcs_g.pidns = own_pidns();
    int fd = open_or_create(path);
    if (fd < 0) {
        HCS_LOG(HCS_LOG_ERROR, "open %s: %s; quota enforced per process only", path, strerror(errno));
        return open_private();
    }
    if (flock(fd, LOCK_EX) != 0) {
        HCS_LOG(HCS_LOG_ERROR, "flock %s: %s", path, strerror(errno));
        close(fd);
        return open_private();
    }
    struct stat st;
    int fresh = 0;
    const char *why = NULL;
    if (fstat(fd, &st) != 0) why = "fstat failed";
    else if ((why = check_owner(fd, &st)) != NULL) {
    } else if (st.st_size == 0) {
        /* every page allocated now: on a tmpfs the workload also fills
         * (/dev/shm), a sparse file would fault with SIGBUS later instead */
        int rc = posix_fallocate(fd, 0, (off_t)size);
        if (rc != 0) {
            why = rc == ENOSPC ? "no room for it (the file system is full)" : "cannot allocate it";
            if (ftruncate(fd, 0) != 0) why = "cannot allocate it, nor empty it again";
        }
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
        if (s && !fresh && (why = check_layout(s, (size_t)st.st_size)) != NULL) {
            HCS_LOG(HCS_LOG_ERROR, "%s: %s (found version %u, expected %u); refusing to use it", path, why,
                    s->h.magic == HCS_SHM_MAGIC ? s->h.version : 0u, HCS_SHM_VERSION);
            munmap(m, map_size);
            s = NULL;
            why = "";
        }
    }
    flock(fd, LOCK_UN);
    if (!s) {
        close(fd);
        if (why && *why) HCS_LOG(HCS_LOG_ERROR, "%s: %s", path, why);
        HCS_LOG(HCS_LOG_ERROR, "falling back to per-process accounting");
        return open_private();
    }
    /* The pod's quota is the smallest any of its processes was given: a
     * child whose variable was changed or unset cannot widen it. */
    for (int d = 0; d < HCS_MAX_DEVICES; d++)
        if (s->dev[d].quota < hcs_g.quota[d]) hcs_g.quota[d] = s->dev[d].quota;
    hcs_g.shm = s;
    hcs_g.shared = 1;
    hcs_g.fd = fd;
    return 0;
}

/* The quotas recorded in an existing accounting file (for a process started
 * without HCS_VRAM_QUOTA). 0 when found. */
int hcs_shm_recorded_quota(const char *path, uint64_t out[HCS_MAX_DEVICES]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    struct hcs_shm_header h;
    struct hcs_shm_dev dev[HCS_MAX_DEVICES];
    int ok = pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
             pread(fd, dev, sizeof dev, sizeof h) == (ssize_t)sizeof dev && h.magic == HCS_SHM_MAGIC &&
             h.version == HCS_SHM_VERSION && h.max_devices == HCS_MAX_DEVICES;
    close(fd);
    if (!ok) return -1;
    int any = 0;
    for (int d = 0; d < HCS_MAX_DEVICES; d++) {
        out[d] = dev[d].quota;
        any |= out[d] != HCS_UNLIMITED;
    }
    return any ? 0 : -1;
}

/* ------------------------------------------------------------- pairs --- */
static inline uint64_t ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* One instruction on both halves (cmpxchg16b / casp). */
static inline int pair_cas(struct hcs_pair *p, uint64_t c0, uint64_t r0, uint64_t c1, uint64_t r1) {
    unsigned __int128 o = (unsigned __int128)r0 << 64 | c0, n = (unsigned __int128)r1 << 64 | c1;
    return __sync_bool_compare_and_swap((unsigned __int128 *)(void *)p, o, n);
}

/* Move the reserve of a pair out of its charge: (c, r) -> (c - r, 0). */
static uint64_t pair_steal(struct hcs_pair *p) {
    for (;;) {
        uint64_t r = ld(&p->reserve);
        if (!r) return 0;
        uint64_t c = ld(&p->charged);
        if (pair_cas(p, c, r, c - r, 0)) return r;
    }
}

/* Empty a slot whose owner is gone (we hold its lock). A stealer racing
 * with us works on whole pairs, so zeroing the reserve first and the charge
 * second never lets it subtract from an emptied charge. */
static void clear_slot(struct hcs_shm_slot *sl) {
    for (int k = 0; k < HCS_SLOT_SHARDS; k++)
        for (int d = 0; d < HCS_MAX_DEVICES; d++) {
            struct hcs_pair *p = &sl->shard[k].p[d];
            while (ld(&p->reserve) || ld(&p->charged)) {
                uint64_t c = ld(&p->charged), r = ld(&p->reserve);
                (void)pair_cas(p, c, r, 0, 0);
            }
        }
}

static uint32_t slot_index(const struct hcs_shm_slot *sl) { return (uint32_t)(sl - hcs_g.shm->slot); }

/* ----------------------------------------------------------- reaping --- */
/* Is the owner of an OWNED slot gone? We then hold its lock. */
static int take_if_dead(struct hcs_shm_slot *sl) {
    if (hcs_g.fd < 0) /* private accounting: only our own forks share it */
        return !pid_alive(sl->pid, sl->start_time);
    if (!ofd_lock(hcs_g.fd, HCS_LOCK_SLOT0 + slot_index(sl), F_WRLCK)) return 0;
    /* The lock was free. In our own pid namespace the pid can confirm it:
     * an owner that closed our descriptor still counts while it lives. */
    if (sl->pidns == hcs_g.pidns && pid_alive(sl->pid, sl->start_time)) {
        ofd_lock(hcs_g.fd, HCS_LOCK_SLOT0 + slot_index(sl), F_UNLCK);
        return 0;
    }
    return 1;
}

static void reap_locked(void) {
    struct hcs_shm *s = hcs_g.shm;
    struct hcs_shm_slot *own = atomic_load(&hcs_g.slot);
    uint32_t hwm = atomic_load_explicit(&s->h.slot_hwm, memory_order_acquire);
    for (uint32_t i = 0; i < hwm && i < HCS_MAX_SLOTS; i++) {
        struct hcs_shm_slot *sl = &s->slot[i];
        if (sl == own || atomic_load_explicit(&sl->state, memory_order_acquire) != HCS_SLOT_OWNED) continue;
        if (!take_if_dead(sl)) continue;
        HCS_LOG(HCS_LOG_INFO, "reclaiming usage of slot %u (pid %d of pid namespace %llu), its owner is gone", i,
                sl->pid, (unsigned long long)sl->pidns);
        clear_slot(sl);
        atomic_store_explicit(&sl->state, HCS_SLOT_FREE, memory_order_release);
        if (hcs_g.fd >= 0) ofd_lock(hcs_g.fd, HCS_LOCK_SLOT0 + i, F_UNLCK);
    }
}

/* Reclaim the usage of processes that died, wherever they ran. */
void hcs_reap(void) {
    if (!hcs_g.shm) return;
    pthread_mutex_lock(&slot_mu);
    reap_locked();
    pthread_mutex_unlock(&slot_mu);
}

static struct hcs_shm_slot *claim_locked(void) {
    struct hcs_shm *s = hcs_g.shm;
    for (int attempt = 0; attempt < 2; attempt++) {
        for (uint32_t i = 0; i < HCS_MAX_SLOTS; i++) {
            struct hcs_shm_slot *sl = &s->slot[i];
            if (atomic_load_explicit(&sl->state, memory_order_acquire) != HCS_SLOT_FREE) continue;
            if (hcs_g.fd >= 0 && !ofd_lock(hcs_g.fd, HCS_LOCK_SLOT0 + i, F_WRLCK)) continue;
            if (hcs_g.fd < 0) {
                int32_t expect = HCS_SLOT_FREE;
                if (!atomic_compare_exchange_strong(&sl->state, &expect, HCS_SLOT_OWNED)) continue;
            } else if (atomic_load_explicit(&sl->state, memory_order_acquire) != HCS_SLOT_FREE) {
                ofd_lock(hcs_g.fd, HCS_LOCK_SLOT0 + i, F_UNLCK); /* reclaimed and taken meanwhile */
                continue;
            }
            clear_slot(sl); /* a claimer killed halfway may have left something */
            sl->pid = (int32_t)getpid();
            sl->pidns = hcs_g.pidns;
            sl->start_time = proc_start_time(0);
            uint32_t hwm = atomic_load(&s->h.slot_hwm);
            while (hwm < i + 1 && !atomic_compare_exchange_weak(&s->h.slot_hwm, &hwm, i + 1)) {
            }
            atomic_store_explicit(&sl->state, HCS_SLOT_OWNED, memory_order_release);
            return sl;
        }
        reap_locked();
    }
    HCS_LOG(HCS_LOG_ERROR, "no free process slot in the accounting file; refusing allocation");
    return NULL;
}

static struct hcs_shm_slot *claim_slot(void) {
    pthread_mutex_lock(&slot_mu);
    struct hcs_shm_slot *sl = atomic_load(&hcs_g.slot);
    if (!sl) {
        sl = claim_locked();
        if (sl) atomic_store_explicit(&hcs_g.slot, sl, memory_order_release);
    }
    pthread_mutex_unlock(&slot_mu);
    return sl;
}

void hcs_release_own_slot(void) {
    pthread_mutex_lock(&slot_mu);
    struct hcs_shm_slot *sl = atomic_exchange(&hcs_g.slot, NULL);
    if (sl) {
        clear_slot(sl);
        atomic_store_explicit(&sl->state, HCS_SLOT_FREE, memory_order_release);
        if (hcs_g.fd >= 0) ofd_lock(hcs_g.fd, HCS_LOCK_SLOT0 + slot_index(sl), F_UNLCK);
    }
    pthread_mutex_unlock(&slot_mu);
}

void hcs_after_fork_child(void) {
    /* The child owns none of the parent's allocations, and must not keep the
     * parent's slot alive: it gets an open file description of its own. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&slot_mu, &fresh, sizeof fresh);
    atomic_store(&hcs_g.slot, NULL);
    hcs_g.pidns = own_pidns(); /* a child forked after unshare(CLONE_NEWPID) */
    if (hcs_g.fd >= 0) {
        int fd = open(hcs_g.path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        close(hcs_g.fd);
        hcs_g.fd = fd;
        if (fd < 0) HCS_LOG(HCS_LOG_ERROR, "reopen %s after fork: %s", hcs_g.path, strerror(errno));
    }
    hcs_ptrtab_reset();
    hcs_track_reset();
}

/* ---------------------------------------------------------- charging --- */
/* Per thread: the shard of the process slot this thread works on (0: not
 * picked yet). */
static __thread unsigned tls_shard __attribute__((tls_model("initial-exec")));
static _Atomic unsigned next_shard;

static inline struct hcs_shm_shard *my_shard(struct hcs_shm_slot *sl) {
    unsigned k = tls_shard;
    if (HCS_UNLIKELY(k == 0)) {
        k = atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) % HCS_SLOT_SHARDS + 1;
        tls_shard = k;
    }
    return &sl->shard[k - 1];
}

/* Usage of a device: the charges of every slot that may be in use. */
static uint64_t device_usage(int dev) {
    struct hcs_shm *s = hcs_g.shm;
    uint32_t hwm = atomic_load_explicit(&s->h.slot_hwm, memory_order_seq_cst);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < hwm && i < HCS_MAX_SLOTS; i++)
        for (int k = 0; k < HCS_SLOT_SHARDS; k++)
            sum += __atomic_load_n(&s->slot[i].shard[k].p[dev].charged, __ATOMIC_SEQ_CST);
    return sum;
}

/* Give every reserve on dev (all processes) back. Runs before a refusal and
 * in memory-info calls, never on the hot path. */
static int steal_reserves(int dev) {
    struct hcs_shm *s = hcs_g.shm;
    uint32_t hwm = atomic_load_explicit(&s->h.slot_hwm, memory_order_acquire);
    int any = 0;
    for (uint32_t i = 0; i < hwm && i < HCS_MAX_SLOTS; i++)
        for (int k = 0; k < HCS_SLOT_SHARDS; k++) any |= pair_steal(&s->slot[i].shard[k].p[dev]) != 0;
    return any;
}

/* Charge, per device d and thread shard p = (charged, reserve):
 *  1. from the reserve: r -= size (one CAS; nobody else's line);
 *  2. otherwise charged += size, then the usage of the device (the sum of
 *     every slot's charges) is read back; over the quota, the charge is
 *     taken back. Two processes racing for the last bytes both see each
 *     other's charge (every add and load is sequentially consistent), so at
 *     most the fitting ones keep theirs; one that lost only to a charge
 *     that was then taken back tries again.
 * The usage never exceeds the quota while an allocation it admitted lives. */
int hcs_charge(int dev, uint64_t size) {
    if (HCS_UNLIKELY((unsigned)dev >= HCS_MAX_DEVICES)) return 0;
    uint64_t q = hcs_g.quota[dev];
    if (q == HCS_UNLIMITED) return 0;
    struct hcs_shm_slot *sl = atomic_load_explicit(&hcs_g.slot, memory_order_acquire);
    if (HCS_UNLIKELY(!sl)) {
        sl = claim_slot();
        if (!sl) return -1;
    }
    struct hcs_pair *p = &my_shard(sl)->p[dev];
    uint64_t r = ld(&p->reserve);
    while (r >= size) {
        if (__atomic_compare_exchange_n(&p->reserve, &r, r - size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return 1;
    }
    uint64_t last = UINT64_MAX;
    for (int attempt = 0; attempt < 8 && size <= q; attempt++) {
        __atomic_fetch_add(&p->charged, size, __ATOMIC_SEQ_CST);
        uint64_t used = device_usage(dev);
        if (used <= q) return 1;
        __atomic_fetch_sub(&p->charged, size, __ATOMIC_SEQ_CST);
        if (attempt == 0) {
            steal_reserves(dev); /* quota kept by reserves anywhere */
        } else if (attempt == 1) {
            hcs_reap(); /* or by processes that are gone */
        } else {
            if (used == last) break; /* nothing moves: it does not fit */
            sched_yield();           /* others are charging and backing out */
        }
        last = used;
    }
    HCS_LOG(HCS_LOG_INFO, "device %d: %llu bytes refused (used %llu of %llu)", dev, (unsigned long long)size,
            (unsigned long long)device_usage(dev), (unsigned long long)q);
    return -1;
}

void hcs_refund(int dev, uint64_t size) {
    struct hcs_shm_slot *sl = atomic_load_explicit(&hcs_g.slot, memory_order_acquire);
    if (HCS_UNLIKELY(!sl)) return; /* slot already released at exit */
    struct hcs_pair *p = &my_shard(sl)->p[dev];
    /* Keep it as this thread's reserve if that stays under the cap (a soft
     * cap: threads sharing a shard may pass it a little). */
    uint64_t cap = hcs_g.quota[dev] >> HCS_RESERVE_SHIFT;
    uint64_t r = ld(&p->reserve);
    if (HCS_LIKELY(size <= cap && r <= cap - size)) {
        __atomic_fetch_add(&p->reserve, size, __ATOMIC_RELEASE);
        return;
    }
    __atomic_fetch_sub(&p->charged, size, __ATOMIC_RELEASE);
}

int hcs_view(int dev, uint64_t phys_free, uint64_t *free, uint64_t *total) {
    if ((unsigned)dev >= HCS_MAX_DEVICES || hcs_g.quota[dev] == HCS_UNLIMITED) return 0;
    uint64_t q = hcs_g.quota[dev];
    hcs_reap();          /* not a hot path: show memory of dead processes as free */
    steal_reserves(dev); /* and quota kept in reserves */
    uint64_t used = device_usage(dev);
    uint64_t f = used < q ? q - used : 0;
    if (f > phys_free) f = phys_free;
    *free = f;
    *total = q;
    return 1;
}
