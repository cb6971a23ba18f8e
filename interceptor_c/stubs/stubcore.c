/* Shared core of the stub vendor libraries (libhcsstubcore.so). */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stub.h"

#define MAXDEV 16
#define TAB_BITS 20
#define TAB_MASK ((1u << TAB_BITS) - 1)
#define BASE 0x10000000000ULL

struct counters {
    _Atomic uint64_t used[MAXDEV];
    _Atomic uint64_t peak[MAXDEV];
};
struct entry {
    _Atomic uint64_t id;
    _Atomic uint64_t size;
    _Atomic int dev;
};

static struct counters local_counters;
static struct counters *ctr = &local_counters;
static struct entry tab[1u << TAB_BITS];
static _Atomic uint64_t next_id;
static uint64_t total_bytes = 80ULL << 30, reserved_bytes;
static int ndev = 2;
static __thread int cur_dev;
/* Like a real driver, hand recently freed addresses out again (per thread). */
static __thread uint64_t recycled[64];
static __thread int nrecycled;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static uint64_t env_size(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *e;
    uint64_t x = strtoull(v, &e, 10);
    if (!strcmp(e, "Ki")) x <<= 10;
    else if (!strcmp(e, "Mi")) x <<= 20;
    else if (!strcmp(e, "Gi")) x <<= 30;
    else if (!strcmp(e, "Ti")) x <<= 40;
    return x;
}

static void init(void) {
    total_bytes = env_size("STUB_TOTAL_BYTES", total_bytes);
    reserved_bytes = env_size("STUB_RESERVED_BYTES", 0);
    ndev = (int)env_size("STUB_DEVICE_COUNT", 2);
    if (ndev < 1 || ndev > MAXDEV) ndev = 2;
    const char *path = getenv("STUB_SHM_PATH");
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd >= 0) {
            if (ftruncate(fd, sizeof(struct counters)) == 0) {
                void *m = mmap(NULL, sizeof(struct counters), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) ctr = m;
            }
            close(fd);
        }
    }
}
#define INIT() pthread_once(&once, init)

int stub_device_count(void) { INIT(); return ndev; }
int stub_get_device(void) { return cur_dev; }
int stub_set_device(int dev) {
    INIT();
    if (dev < 0 || dev >= ndev) return STUB_EINVAL;
    cur_dev = dev;
    return STUB_OK;
}

int stub_alloc_dev(int dev, uint64_t size, uint64_t *addr) {
    INIT();
    if (dev < 0 || dev >= ndev || size == 0 || !addr) return STUB_EINVAL;
    uint64_t limit = total_bytes > reserved_bytes ? total_bytes - reserved_bytes : 0;
    uint64_t cur = atomic_load(&ctr->used[dev]);
    do {
        if (size > limit || cur > limit - size) return STUB_ENOMEM;
    } while (!atomic_compare_exchange_weak(&ctr->used[dev], &cur, cur + size));
    uint64_t now = cur + size, pk = atomic_load_explicit(&ctr->peak[dev], memory_order_relaxed);
    while (now > pk && !atomic_compare_exchange_weak(&ctr->peak[dev], &pk, now)) {
    }
    uint64_t id = 0;
    while (nrecycled > 0) {
        uint64_t zero = 0, cand = recycled[--nrecycled];
        if (atomic_compare_exchange_strong(&tab[cand & TAB_MASK].id, &zero, cand)) {
            id = cand;
            break;
        }
    }
    while (!id) {
        id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed) + 1;
        uint64_t zero = 0;
        if (!atomic_compare_exchange_strong(&tab[id & TAB_MASK].id, &zero, id)) id = 0;
    }
    atomic_store_explicit(&tab[id & TAB_MASK].size, size, memory_order_relaxed);
    atomic_store_explicit(&tab[id & TAB_MASK].dev, dev, memory_order_release);
    *addr = BASE + (id << 12);
    return STUB_OK;
}

int stub_alloc(uint64_t size, uint64_t *addr) { return stub_alloc_dev(cur_dev, size, addr); }

int stub_free(uint64_t addr) {
    if (addr < BASE || ((addr - BASE) & 0xfff)) return STUB_EINVAL;
    uint64_t id = (addr - BASE) >> 12;
    struct entry *e = &tab[id & TAB_MASK];
    if (atomic_load_explicit(&e->id, memory_order_acquire) != id) return STUB_EINVAL;
    uint64_t size = atomic_load_explicit(&e->size, memory_order_relaxed);
    int dev = atomic_load_explicit(&e->dev, memory_order_acquire);
    uint64_t expect = id;
    if (!atomic_compare_exchange_strong(&e->id, &expect, 0)) return STUB_EINVAL;
    atomic_fetch_sub(&ctr->used[dev], size);
    if (nrecycled < 64) recycled[nrecycled++] = id;
    return STUB_OK;
}

void stub_meminfo(int dev, uint64_t *free, uint64_t *total) {
    INIT();
    if (dev < 0 || dev >= MAXDEV) dev = 0;
    uint64_t used = atomic_load(&ctr->used[dev]) + reserved_bytes;
    *total = total_bytes;
    *free = used < total_bytes ? total_bytes - used : 0;
}

void stubGetStats(int dev, unsigned long long *used, unsigned long long *peak) {
    INIT();
    *used = atomic_load(&ctr->used[dev]);
    *peak = atomic_load(&ctr->peak[dev]);
}

void stubResetPeak(int dev) {
    INIT();
    atomic_store(&ctr->peak[dev], atomic_load(&ctr->used[dev]));
}

void stub_phys_add(int dev, int64_t delta) {
    INIT();
    uint64_t now = atomic_fetch_add(&ctr->used[dev], (uint64_t)delta) + (uint64_t)delta;
    uint64_t pk = atomic_load_explicit(&ctr->peak[dev], memory_order_relaxed);
    while (now > pk && !atomic_compare_exchange_weak(&ctr->peak[dev], &pk, now)) {
    }
}

int stub_lookup(uint64_t addr, int *dev, uint64_t *size) {
    if (addr < BASE || ((addr - BASE) & 0xfff)) return STUB_EINVAL;
    uint64_t id = (addr - BASE) >> 12;
    struct entry *e = &tab[id & TAB_MASK];
    if (atomic_load_explicit(&e->id, memory_order_acquire) != id) return STUB_EINVAL;
    *size = atomic_load_explicit(&e->size, memory_order_relaxed);
    *dev = atomic_load_explicit(&e->dev, memory_order_acquire);
    return STUB_OK;
}
