/* Process-local tracking of what a plain pointer table cannot express:
 *  - VMM: a physical handle is charged at create and refunded when it has
 *    been released and its last mapping is gone (memory stays allocated
 *    while mapped, even after cuMemRelease);
 *  - memory pools: freed memory a pool keeps (up to its release threshold,
 *    or until trimmed) stays charged; later pool allocations reuse it;
 *  - graph memory: the allocation nodes of a graph are charged when the
 *    graph is instantiated and refunded when the executable graph goes.
 * None of this is a hot path: one mutex guards it all. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hcs.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* Growable arrays of plain structs. */
#define VEC(T) struct { T *v; size_t n, cap; }
#define VEC_PUSH(vec, x)                                                        \
    ({                                                                          \
        int ok_ = 1;                                                            \
        if ((vec).n == (vec).cap) {                                             \
            size_t c_ = (vec).cap ? (vec).cap * 2 : 16;                         \
            void *p_ = realloc((vec).v, c_ * sizeof *(vec).v);                  \
            if (p_) (vec).v = p_, (vec).cap = c_;                               \
            else ok_ = 0;                                                       \
        }                                                                       \
        if (ok_) (vec).v[(vec).n++] = (x);                                      \
        ok_;                                                                    \
    })
#define VEC_DEL(vec, i) ((vec).v[i] = (vec).v[--(vec).n])

/* ---------------------------------------------------------------- VMM --- */
struct phys { int lib, dev, released; uint64_t handle, size; long maps; };
struct mapping { int lib; uint64_t va, size, handle; };
static VEC(struct phys) physs;
static VEC(struct mapping) mappings;

static long find_phys(int lib, uint64_t handle) {
    for (size_t i = 0; i < physs.n; i++)
        if (physs.v[i].lib == lib && physs.v[i].handle == handle) return (long)i;
    return -1;
}

/* Refund and forget a handle that is released and unmapped (mu held). */
static void settle_phys(long i) {
    struct phys p = physs.v[i];
    if (!p.released || p.maps > 0) return;
    VEC_DEL(physs, i);
    hcs_refund(p.dev, p.size);
}

int hcs_vmm_created(int lib, uint64_t handle, int dev, uint64_t size) {
    pthread_mutex_lock(&mu);
    int ok = VEC_PUSH(physs, ((struct phys){lib, dev, 0, handle, size, 0}));
    pthread_mutex_unlock(&mu);
    if (!ok) {
        hcs_refund(dev, size);
        HCS_LOG(HCS_LOG_ERROR, "VMM table full; refusing allocation");
    }
    return ok;
}

int hcs_vmm_tracked(int lib, uint64_t handle) {
    pthread_mutex_lock(&mu);
    long i = find_phys(lib, handle);
    pthread_mutex_unlock(&mu);
    return i >= 0;
}

void hcs_vmm_released(int lib, uint64_t handle) {
    pthread_mutex_lock(&mu);
    long i = find_phys(lib, handle);
    if (i >= 0) {
        physs.v[i].released = 1;
        settle_phys(i);
    }
    pthread_mutex_unlock(&mu);
}

void hcs_vmm_mapped(int lib, uint64_t va, uint64_t size, uint64_t handle) {
    pthread_mutex_lock(&mu);
    long i = find_phys(lib, handle);
    if (i >= 0 && VEC_PUSH(mappings, ((struct mapping){lib, va, size, handle}))) physs.v[i].maps++;
    pthread_mutex_unlock(&mu);
}

/* Every mapping that starts inside [va, va + size) is gone. */
void hcs_vmm_unmapped(int lib, uint64_t va, uint64_t size) {
    pthread_mutex_lock(&mu);
    for (size_t m = 0; m < mappings.n;) {
        struct mapping x = mappings.v[m];
        if (x.lib != lib || x.va < va || x.va - va >= size) {
            m++;
            continue;
        }
        VEC_DEL(mappings, m);
        long i = find_phys(lib, x.handle);
        if (i >= 0) {
            physs.v[i].maps--;
            settle_phys(i);
        }
    }
    pthread_mutex_unlock(&mu);
}

/* -------------------------------------------------------------- pools --- */
#define MAX_POOLS 255
struct pool {
    int lib, dev;
    uint64_t handle;
    _Atomic uint64_t retained;  /* freed into the pool, still charged */
    _Atomic uint64_t threshold; /* the pool's release threshold */
};
static struct pool pools[MAX_POOLS + 1]; /* index 0: no pool */
static _Atomic int npools;

static int find_pool(int lib, uint64_t handle) {
    int n = atomic_load_explicit(&npools, memory_order_acquire);
    for (int i = 1; i <= n; i++)
        if (pools[i].handle == handle && pools[i].lib == lib) return i;
    return 0;
}

static int pool_index(int lib, uint64_t handle, int dev) {
    if (!handle) return 0;
    int i = find_pool(lib, handle);
    if (i) return i;
    pthread_mutex_lock(&mu);
    i = find_pool(lib, handle);
    if (!i && atomic_load(&npools) < MAX_POOLS) {
        i = atomic_load(&npools) + 1;
        pools[i].lib = lib;
        pools[i].dev = dev;
        pools[i].handle = handle;
        atomic_store_explicit(&npools, i, memory_order_release);
    }
    pthread_mutex_unlock(&mu);
    return i;
}

static uint64_t take_retained(struct pool *p, uint64_t max) {
    uint64_t r = atomic_load(&p->retained);
    for (;;) {
        uint64_t t = r < max ? r : max;
        if (!t || atomic_compare_exchange_weak(&p->retained, &r, r - t)) return t;
    }
}

/* Trim what the pool keeps down to `keep`, refunding the rest. */
static void trim_pool(struct pool *p, uint64_t keep) {
    uint64_t r = atomic_load(&p->retained);
    while (r > keep && !atomic_compare_exchange_weak(&p->retained, &r, keep)) {
    }
    if (r > keep) hcs_refund(p->dev, r - keep);
}

/* Before a pool allocation: reuse what the pool keeps, charge the rest.
 * 1 charged (*tag, *taken set), 0 untracked, -1 over quota. */
int hcs_pool_charge(int lib, uint64_t handle, int dev, uint64_t size, int *tag, uint64_t *taken) {
    if ((unsigned)dev >= HCS_MAX_DEVICES || hcs_g.quota[dev] == HCS_UNLIMITED) return 0;
    int i = pool_index(lib, handle, dev);
    uint64_t t = i ? take_retained(&pools[i], size) : 0;
    if (t < size) {
        int c = hcs_charge(dev, size - t);
        if (c <= 0) {
            if (t) atomic_fetch_add(&pools[i].retained, t);
            return c;
        }
    }
    *tag = dev | i << 8;
    *taken = t;
    return 1;
}

/* The real pool allocation failed: undo hcs_pool_charge. */
void hcs_pool_undo(int tag, uint64_t size, uint64_t taken) {
    int i = tag >> 8, dev = tag & 0xff;
    if (taken) atomic_fetch_add(&pools[i].retained, taken);
    if (size > taken) hcs_refund(dev, size - taken);
}

/* A pool allocation was freed: the pool keeps it up to its threshold. */
void hcs_pool_freed(int tag, uint64_t size) {
    struct pool *p = &pools[tag >> 8];
    atomic_fetch_add(&p->retained, size);
    trim_pool(p, atomic_load(&p->threshold));
}

void hcs_pool_trimmed(int lib, uint64_t handle, uint64_t keep) {
    int i = find_pool(lib, handle);
    if (i) trim_pool(&pools[i], keep);
}

void hcs_pool_threshold(int lib, uint64_t handle, int dev, uint64_t threshold) {
    int i = pool_index(lib, handle, dev);
    if (!i) return;
    atomic_store(&pools[i].threshold, threshold);
    trim_pool(&pools[i], threshold);
}

/* -------------------------------------------------------------- graphs --- */
struct graph_mem { uint64_t graph; int dev; uint64_t size; };
struct exec_mem { uint64_t exec; uint64_t size[HCS_MAX_DEVICES]; };
static VEC(struct graph_mem) graph_mems;
static VEC(struct exec_mem) exec_mems;

void hcs_graph_alloc_node(uint64_t graph, int dev, uint64_t size) {
    if ((unsigned)dev >= HCS_MAX_DEVICES) return;
    pthread_mutex_lock(&mu);
    (void)VEC_PUSH(graph_mems, ((struct graph_mem){graph, dev, size}));
    pthread_mutex_unlock(&mu);
}

void hcs_graph_destroyed(uint64_t graph) {
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < graph_mems.n;)
        if (graph_mems.v[i].graph == graph) VEC_DEL(graph_mems, i);
        else i++;
    pthread_mutex_unlock(&mu);
}

/* Charge the memory nodes of a graph about to be instantiated, per device,
 * all or nothing. -1 over quota; else out[] holds what was charged. */
int hcs_graph_charge(uint64_t graph, uint64_t out[HCS_MAX_DEVICES]) {
    memset(out, 0, sizeof(uint64_t) * HCS_MAX_DEVICES);
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < graph_mems.n; i++)
        if (graph_mems.v[i].graph == graph) out[graph_mems.v[i].dev] += graph_mems.v[i].size;
    pthread_mutex_unlock(&mu);
    for (int d = 0; d < HCS_MAX_DEVICES; d++) {
        if (!out[d]) continue;
        int c = hcs_charge(d, out[d]);
        if (c > 0) continue;
        if (c == 0) {
            out[d] = 0; /* no quota on this device */
            continue;
        }
        out[d] = 0;
        hcs_graph_uncharge(out);
        return -1;
    }
    return 0;
}

void hcs_graph_uncharge(const uint64_t charged[HCS_MAX_DEVICES]) {
    for (int d = 0; d < HCS_MAX_DEVICES; d++)
        if (charged[d]) hcs_refund(d, charged[d]);
}

void hcs_graph_instantiated(uint64_t exec, const uint64_t charged[HCS_MAX_DEVICES]) {
    struct exec_mem e = {exec, {0}};
    int any = 0;
    for (int d = 0; d < HCS_MAX_DEVICES; d++) any |= (e.size[d] = charged[d]) != 0;
    if (!any) return;
    pthread_mutex_lock(&mu);
    int ok = VEC_PUSH(exec_mems, e);
    pthread_mutex_unlock(&mu);
    if (!ok) hcs_graph_uncharge(charged); /* cannot refund later: do not keep it */
}

void hcs_graph_exec_destroyed(uint64_t exec) {
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < exec_mems.n; i++) {
        if (exec_mems.v[i].exec != exec) continue;
        struct exec_mem e = exec_mems.v[i];
        VEC_DEL(exec_mems, i);
        pthread_mutex_unlock(&mu);
        hcs_graph_uncharge(e.size);
        return;
    }
    pthread_mutex_unlock(&mu);
}

/* After fork: the child owns none of this. */
void hcs_track_reset(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&mu, &fresh, sizeof fresh);
    physs.n = mappings.n = graph_mems.n = exec_mems.n = 0;
    for (int i = 1; i <= atomic_load(&npools); i++) atomic_store(&pools[i].retained, 0);
}
