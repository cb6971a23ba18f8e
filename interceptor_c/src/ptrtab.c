/* Per-process table pointer -> (device, size). Open addressing with a
 * bounded probe window, lock-free (CAS on the key). A small primary table
 * keeps the hot path in cache; a large overflow table is mapped the first
 * time a window of the primary is full. Keys never go back to EMPTY, so a
 * lookup may stop at the first EMPTY slot. */
#include <sys/mman.h>

#include "hcs.h"

#define PRIMARY_BITS 16   /* 64 Ki entries, 1 MiB */
#define OVERFLOW_BITS 22  /* 4 Mi entries, 64 MiB virtual, touched lazily */
#define PROBE 64
#define K_EMPTY 0ULL
#define K_TOMB 1ULL

struct entry {
    _Atomic uint64_t key;
    _Atomic uint64_t meta; /* size << 16 | tag (device, pool) */
};

static struct entry *_Atomic primary;
static struct entry *_Atomic overflow;

static struct entry *map_table(unsigned bits) {
    void *m = mmap(NULL, sizeof(struct entry) << bits, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

int hcs_ptrtab_init(void) {
    struct entry *t = map_table(PRIMARY_BITS);
    if (!t) return -1;
    atomic_store(&primary, t);
    return 0;
}

void hcs_ptrtab_reset(void) {
    /* after fork, single-threaded: forget the parent's allocations */
    struct entry *p = atomic_exchange(&primary, map_table(PRIMARY_BITS));
    struct entry *o = atomic_exchange(&overflow, NULL);
    if (p) munmap(p, sizeof(struct entry) << PRIMARY_BITS);
    if (o) munmap(o, sizeof(struct entry) << OVERFLOW_BITS);
}

static inline uint32_t home(uint64_t key, unsigned bits) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static int put(struct entry *t, unsigned bits, uint64_t key, uint64_t meta) {
    uint32_t mask = (1u << bits) - 1, h = home(key, bits);
    for (uint32_t i = 0; i < PROBE; i++) {
        struct entry *e = &t[(h + i) & mask];
        uint64_t k = atomic_load_explicit(&e->key, memory_order_relaxed);
        if (k != K_EMPTY && k != K_TOMB) continue;
        if (atomic_compare_exchange_strong_explicit(&e->key, &k, key, memory_order_acq_rel, memory_order_relaxed)) {
            atomic_store_explicit(&e->meta, meta, memory_order_release);
            return 1;
        }
    }
    return 0;
}

static int take(struct entry *t, unsigned bits, uint64_t key, uint64_t *meta) {
    uint32_t mask = (1u << bits) - 1, h = home(key, bits);
    for (uint32_t i = 0; i < PROBE; i++) {
        struct entry *e = &t[(h + i) & mask];
        uint64_t k = atomic_load_explicit(&e->key, memory_order_acquire);
        if (k == K_EMPTY) return 0;
        if (k != key) continue;
        uint64_t m = atomic_load_explicit(&e->meta, memory_order_acquire);
        /* a lost race here is a concurrent double free: the other one wins */
        if (!atomic_compare_exchange_strong_explicit(&e->key, &k, K_TOMB, memory_order_acq_rel, memory_order_relaxed))
            return 0;
        *meta = m;
        return 1;
    }
    return 0;
}

int hcs_ptr_put(uint64_t key, int dev, uint64_t size) {
    if (HCS_UNLIKELY(key <= K_TOMB || size >> 48)) return 0;
    uint64_t meta = size << 16 | (uint64_t)(dev & 0xffff);
    struct entry *t = atomic_load_explicit(&primary, memory_order_acquire);
    if (HCS_LIKELY(t && put(t, PRIMARY_BITS, key, meta))) return 1;
    struct entry *o = atomic_load_explicit(&overflow, memory_order_acquire);
    if (!o) {
        struct entry *fresh = map_table(OVERFLOW_BITS);
        if (!fresh) return 0;
        if (atomic_compare_exchange_strong(&overflow, &o, fresh)) {
            o = fresh;
            HCS_LOG(HCS_LOG_INFO, "allocation table: primary window full, overflow table in use");
        } else {
            munmap(fresh, sizeof(struct entry) << OVERFLOW_BITS);
        }
    }
    return put(o, OVERFLOW_BITS, key, meta);
}

int hcs_ptr_take(uint64_t key, int *dev, uint64_t *size) {
    if (HCS_UNLIKELY(key <= K_TOMB)) return 0;
    uint64_t m;
    struct entry *t = atomic_load_explicit(&primary, memory_order_acquire);
    int found = t && take(t, PRIMARY_BITS, key, &m);
    if (!found) {
        struct entry *o = atomic_load_explicit(&overflow, memory_order_acquire);
        found = o && take(o, OVERFLOW_BITS, key, &m);
    }
    if (!found) return 0;
    *dev = (int)(m & 0xffff);
    *size = m >> 16;
    return 1;
}
