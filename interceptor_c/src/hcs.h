/* Internal interfaces of libhcs_interceptor.so. Everything here is hidden;
 * only the vendor hooks (and dlsym) are exported. */
#ifndef HCS_H
#define HCS_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HCS_VENDOR_API __attribute__((visibility("default")))
#include "vendor.h"

#define HCS_HIDDEN __attribute__((visibility("hidden")))
#define HCS_EXPORT __attribute__((visibility("default")))
#define HCS_LIKELY(x) __builtin_expect(!!(x), 1)
#define HCS_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define HCS_MAX_DEVICES 16
#define HCS_MAX_SLOTS 1024
#define HCS_UNLIMITED UINT64_MAX
#define HCS_DEFAULT_SHM_PATH "/tmp/hcs_vram.shm"

/* ---------------------------------------------------------------- shm --- */
#define HCS_SHM_MAGIC 0x4d415256534348ULL /* "HCSVRAM" little endian */
#define HCS_SHM_VERSION 3u
/* Contended counters get a line pair of their own: Intel's spatial prefetcher
 * pulls 128-byte pairs of lines, so 64-byte padding still shares. */
#define HCS_LINE 128
/* A process's slot is split into shards; each thread works on one of them
 * (picked once per thread), so the threads of a process do not contend on
 * one line. Only sums over the shards mean anything: a free on another
 * thread than the allocation subtracts from another shard, and a shard's
 * counter may wrap below zero (unsigned, modulo 2^64). */
#define HCS_SLOT_SHARDS 8
/* A shard keeps freed quota, up to quota / 2^HCS_RESERVE_SHIFT per device,
 * as a reserve for its next allocations (see shm.c). */
#define HCS_RESERVE_SHIFT 2
/* Byte offsets of the OFD locks (fcntl F_OFD_SETLK), past the end of the
 * mapped layout: slot i is owned by whoever holds a lock on byte
 * HCS_LOCK_SLOT0 + i; the kernel drops it when the owner dies. */
#define HCS_LOCK_SLOT0 (1ULL << 32)

struct hcs_shm_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint32_t max_devices;
    uint32_t max_slots;
    uint64_t total_size;
    uint32_t slot_shards;
    uint32_t line;
    _Atomic uint32_t slot_hwm; /* slots [0, hwm) may be in use */
    uint32_t pad;
    uint64_t reserved[2];
} __attribute__((aligned(HCS_LINE)));

struct hcs_shm_dev {
    uint64_t quota; /* quota of the creating process; a later process takes the minimum */
} __attribute__((aligned(HCS_LINE)));

/* charged: this shard's share of the device's usage (live allocations, quota
 * in flight and the reserve). reserve: the part of charged that backs no
 * allocation. Every change is one atomic instruction on this pair, so a
 * process killed at any instruction leaves a consistent slot. */
struct hcs_pair {
    uint64_t charged;
    uint64_t reserve;
} __attribute__((aligned(16)));

struct hcs_shm_shard {
    struct hcs_pair p[HCS_MAX_DEVICES];
} __attribute__((aligned(HCS_LINE)));

enum { HCS_SLOT_FREE = 0, HCS_SLOT_OWNED = 1 };

struct hcs_shm_slot {
    _Atomic int32_t state; /* HCS_SLOT_* (the OFD lock decides who owns it) */
    int32_t pid;           /* in the owner's pid namespace (diagnostics) */
    uint64_t pidns;        /* inode of the owner's pid namespace */
    uint64_t start_time;   /* /proc/self/stat field 22 of the owner */
    struct hcs_shm_shard shard[HCS_SLOT_SHARDS] __attribute__((aligned(HCS_LINE)));
} __attribute__((aligned(HCS_LINE)));

struct hcs_shm {
    struct hcs_shm_header h;
    struct hcs_shm_dev dev[HCS_MAX_DEVICES];
    struct hcs_shm_slot slot[HCS_MAX_SLOTS];
};
_Static_assert(sizeof(struct hcs_shm_header) == 128, "header size");
_Static_assert(sizeof(struct hcs_shm_dev) == 128, "device entry size");
_Static_assert(sizeof(struct hcs_shm_slot) == 128 + HCS_SLOT_SHARDS * 256, "slot size");

/* -------------------------------------------------------------- state --- */
enum { HCS_MODE_UNINIT = 0, HCS_MODE_PASS = 1, HCS_MODE_ENFORCE = 2 };
enum { HCS_LOG_OFF = 0, HCS_LOG_ERROR, HCS_LOG_WARN, HCS_LOG_INFO, HCS_LOG_DEBUG };

struct hcs_state {
    _Atomic int mode;
    int log_level;
    uint64_t quota[HCS_MAX_DEVICES];
    struct hcs_shm *shm;
    struct hcs_shm_slot *_Atomic slot; /* claimed lazily on first charge */
    int fd;                            /* accounting file (OFD locks), -1 private */
    char path[256];                    /* accounting file path */
    uint64_t pidns;                    /* inode of our pid namespace */
    int nvml_map[64];                  /* NVML index -> visible ordinal, -1 none */
    int shared;                        /* 1 = shm file, 0 = private fallback */
};

extern struct hcs_state hcs_g HCS_HIDDEN;
extern __thread int hcs_rt_depth HCS_HIDDEN __attribute__((tls_model("initial-exec")));

HCS_HIDDEN void hcs_init(void);
HCS_HIDDEN void hcs_log_impl(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define HCS_LOG(lvl, ...)                                                  \
    do {                                                                   \
        if (HCS_UNLIKELY(hcs_g.log_level >= (lvl))) hcs_log_impl((lvl), __VA_ARGS__); \
    } while (0)

static inline int hcs_mode(void) {
    int m = atomic_load_explicit(&hcs_g.mode, memory_order_acquire);
    if (HCS_UNLIKELY(m == HCS_MODE_UNINIT)) {
        hcs_init();
        m = atomic_load_explicit(&hcs_g.mode, memory_order_acquire);
    }
    return m;
}

/* Tracking applies: enforcing, not nested inside a runtime-API wrapper. */
static inline int hcs_tracking(void) {
    return hcs_mode() == HCS_MODE_ENFORCE && HCS_LIKELY(hcs_rt_depth == 0);
}

/* config.c */
HCS_HIDDEN int hcs_parse_quota(const char *s, uint64_t out[HCS_MAX_DEVICES]);

/* shm.c: accounting */
HCS_HIDDEN int hcs_shm_open(const char *path);
HCS_HIDDEN int hcs_shm_recorded_quota(const char *path, uint64_t out[HCS_MAX_DEVICES]);
HCS_HIDDEN void hcs_reap(void);
HCS_HIDDEN void hcs_release_own_slot(void);
HCS_HIDDEN void hcs_after_fork_child(void);
/* 1 charged, 0 untracked device (pass through), -1 over quota */
HCS_HIDDEN int hcs_charge(int dev, uint64_t size);
HCS_HIDDEN void hcs_refund(int dev, uint64_t size);
/* Quota view; returns 0 when the device has no quota (keep real numbers). */
HCS_HIDDEN int hcs_view(int dev, uint64_t phys_free, uint64_t *free, uint64_t *total);

/* ptrtab.c: pointer -> (device, size) */
#define HCS_KEY_PTR(p) ((uint64_t)(p))
#define HCS_KEY_VMM(h) ((uint64_t)(h) ^ (1ULL << 62))
#define HCS_KEY_ARRAY(a) ((uint64_t)(uintptr_t)(a) ^ (2ULL << 62))
#define HCS_KEY_MIPMAP(a) ((uint64_t)(uintptr_t)(a) ^ (3ULL << 62))
HCS_HIDDEN int hcs_ptrtab_init(void);
HCS_HIDDEN void hcs_ptrtab_reset(void);
HCS_HIDDEN int hcs_ptr_put(uint64_t key, int dev, uint64_t size);
HCS_HIDDEN int hcs_ptr_take(uint64_t key, int *dev, uint64_t *size);

/* track.c: VMM handles and mappings, memory pools, graph memory */
HCS_HIDDEN int hcs_vmm_created(int lib, uint64_t handle, int dev, uint64_t size);
HCS_HIDDEN int hcs_vmm_tracked(int lib, uint64_t handle);
HCS_HIDDEN void hcs_vmm_released(int lib, uint64_t handle);
HCS_HIDDEN void hcs_vmm_mapped(int lib, uint64_t va, uint64_t size, uint64_t handle);
HCS_HIDDEN void hcs_vmm_unmapped(int lib, uint64_t va, uint64_t size);
HCS_HIDDEN int hcs_pool_charge(int lib, uint64_t handle, int dev, uint64_t size, int *tag, uint64_t *taken);
HCS_HIDDEN void hcs_pool_undo(int tag, uint64_t size, uint64_t taken);
HCS_HIDDEN void hcs_pool_freed(int tag, uint64_t size);
HCS_HIDDEN void hcs_pool_trimmed(int lib, uint64_t handle, uint64_t keep);
HCS_HIDDEN void hcs_pool_threshold(int lib, uint64_t handle, int dev, uint64_t threshold);
HCS_HIDDEN void hcs_graph_alloc_node(uint64_t graph, int dev, uint64_t size);
HCS_HIDDEN void hcs_graph_destroyed(uint64_t graph);
HCS_HIDDEN int hcs_graph_charge(uint64_t graph, uint64_t out[HCS_MAX_DEVICES]);
HCS_HIDDEN void hcs_graph_uncharge(const uint64_t charged[HCS_MAX_DEVICES]);
HCS_HIDDEN void hcs_graph_instantiated(uint64_t exec, const uint64_t charged[HCS_MAX_DEVICES]);
HCS_HIDDEN void hcs_graph_exec_destroyed(uint64_t exec);
HCS_HIDDEN void hcs_track_reset(void);

/* Allocation protocol shared by all vendors. */
/* After a successful real allocation: record it. 0 = table full (caller must
 * release the real allocation and report out-of-memory). */
/* A pointer table tag is the device, plus a pool index << 8 for pool
 * allocations (whose frees the pool may keep). */
static inline void hcs_refund_tag(int tag, uint64_t size) {
    if (HCS_LIKELY(tag < 256)) hcs_refund(tag, size);
    else hcs_pool_freed(tag, size);
}
static inline int hcs_commit(uint64_t key, int dev, uint64_t size) {
    if (HCS_LIKELY(hcs_ptr_put(key, dev, size))) return 1;
    hcs_refund_tag(dev, size);
    HCS_LOG(HCS_LOG_ERROR, "allocation table full; refusing allocation");
    return 0;
}
/* Free protocol: take before the real free, finish after it. */
static inline void hcs_free_done(int ok, uint64_t key, int dev, uint64_t size) {
    if (ok)
        hcs_refund_tag(dev, size);
    else
        (void)hcs_ptr_put(key, dev, size);
}

/* Wrapper bodies. `getdev(&dev)` returns 1 when the current device is known,
 * `call` is the real call, `key` the tracking key after success and `undo`
 * releases the real allocation when it cannot be recorded. */
#define HCS_ALLOC(ok, oom, getdev, size, call, key, undo)                        \
    do {                                                                       \
        int dev_ = 0, c_ = 0;                                                  \
        uint64_t sz_ = (uint64_t)(size);                                       \
        if (!hcs_tracking() || sz_ == 0 || !getdev(&dev_) ||                   \
            (c_ = hcs_charge(dev_, sz_)) == 0)                                 \
            return (call);                                                     \
        if (c_ < 0) return (oom);                                              \
        __typeof__(call) r_ = (call);                                          \
        if (r_ != (ok)) {                                                      \
            hcs_refund(dev_, sz_);                                             \
            return r_;                                                         \
        }                                                                      \
        if (HCS_UNLIKELY(!hcs_commit((key), dev_, sz_))) {                     \
            undo;                                                              \
            return (oom);                                                      \
        }                                                                      \
        return r_;                                                             \
    } while (0)

/* Pool allocation: `poolof(dev)` names the pool; freed memory that the pool
 * keeps stays charged (see track.c). */
#define HCS_POOL_ALLOC(lib, ok, oom, getdev, poolof, size, call, key, undo)      \
    do {                                                                       \
        int dev_ = 0, tag_ = 0, c_ = 0;                                        \
        uint64_t sz_ = (uint64_t)(size), tk_ = 0;                              \
        if (!hcs_tracking() || sz_ == 0 || !getdev(&dev_) ||                   \
            (c_ = hcs_pool_charge((lib), poolof(dev_), dev_, sz_, &tag_, &tk_)) == 0) \
            return (call);                                                     \
        if (c_ < 0) return (oom);                                              \
        __typeof__(call) r_ = (call);                                          \
        if (r_ != (ok)) {                                                      \
            hcs_pool_undo(tag_, sz_, tk_);                                     \
            return r_;                                                         \
        }                                                                      \
        if (HCS_UNLIKELY(!hcs_ptr_put((key), tag_, sz_))) {                    \
            undo;                                                              \
            hcs_pool_undo(tag_, sz_, tk_);                                     \
            return (oom);                                                      \
        }                                                                      \
        return r_;                                                             \
    } while (0)

/* VMM physical allocation: charged at create, tracked by handle. */
#define HCS_VMM_CREATE(lib, ok, oom, getdev, size, call, handle, undo)          \
    do {                                                                       \
        int dev_ = 0, c_ = 0;                                                  \
        uint64_t sz_ = (uint64_t)(size);                                       \
        if (!hcs_tracking() || sz_ == 0 || !getdev(&dev_) ||                   \
            (c_ = hcs_charge(dev_, sz_)) == 0)                                 \
            return (call);                                                     \
        if (c_ < 0) return (oom);                                              \
        __typeof__(call) r_ = (call);                                          \
        if (r_ != (ok)) {                                                      \
            hcs_refund(dev_, sz_);                                             \
            return r_;                                                         \
        }                                                                      \
        if (HCS_UNLIKELY(!hcs_vmm_created((lib), (uint64_t)(handle), dev_, sz_))) { \
            undo;                                                              \
            return (oom);                                                      \
        }                                                                      \
        return r_;                                                             \
    } while (0)

/* Pitched allocation: the pitch is only known after the call. Charge an
 * estimate (512-byte rows), then settle the difference; 0 = keep it. */
static inline int hcs_pitch_settle(int dev, uint64_t est, uint64_t actual, uint64_t key) {
    if (actual > est) {
        if (hcs_charge(dev, actual - est) < 0) {
            hcs_refund(dev, est);
            return -1;
        }
    } else if (actual < est) {
        hcs_refund(dev, est - actual);
    }
    return hcs_commit(key, dev, actual) ? 0 : -1;
}
static inline uint64_t hcs_mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
#define HCS_PITCH_ALLOC(ok, oom, getdev, call, width, height, pitchp, key, undo)                 \
    do {                                                                                      \
        uint64_t est_ = hcs_mul_sat(((uint64_t)(width) + 511) & ~(uint64_t)511, (height));    \
        int dev_ = 0, c_ = 0;                                                                 \
        if (!hcs_tracking() || est_ == 0 || !getdev(&dev_) || (c_ = hcs_charge(dev_, est_)) == 0) \
            return (call);                                                                    \
        if (c_ < 0) return (oom);                                                             \
        __typeof__(call) r_ = (call);                                                         \
        if (r_ != (ok)) {                                                                     \
            hcs_refund(dev_, est_);                                                           \
            return r_;                                                                        \
        }                                                                                     \
        uint64_t act_ = (pitchp) ? hcs_mul_sat(*(pitchp), (height)) : est_;                   \
        if (hcs_pitch_settle(dev_, est_, act_, (key))) {                                      \
            undo;                                                                             \
            return (oom);                                                                     \
        }                                                                                     \
        return r_;                                                                            \
    } while (0)

#define HCS_FREE(ok, key, call)                                                \
    do {                                                                       \
        int dev_;                                                              \
        uint64_t sz_, k_ = (key);                                              \
        if (!hcs_tracking() || !hcs_ptr_take(k_, &dev_, &sz_)) return (call);  \
        __typeof__(call) r_ = (call);                                          \
        hcs_free_done(r_ == (ok), k_, dev_, sz_);                              \
        return r_;                                                             \
    } while (0)

/* Memory-info body: overwrite (free,total) with the quota view. */
#define HCS_MEMINFO(getdev, freep, totalp)                                     \
    do {                                                                       \
        int dev_;                                                              \
        uint64_t f_, t_;                                                       \
        if ((freep) && (totalp) && hcs_tracking() && getdev(&dev_) &&          \
            hcs_view(dev_, *(freep), &f_, &t_)) {                              \
            *(freep) = f_;                                                     \
            *(totalp) = t_;                                                    \
        }                                                                      \
    } while (0)

/* ------------------------------------------------------ real symbols --- */
enum hcs_lib { HCS_LIB_CUDA, HCS_LIB_CUDART, HCS_LIB_NVML, HCS_LIB_ACL, HCS_LIB_HIP, HCS_LIB_CNRT, HCS_LIB_COUNT };

enum hcs_sym {
#define HOOK(lib, name) HK_##name,
#define HELPER(lib, name) HK_##name,
#include "hooks.def"
#undef HOOK
#undef HELPER
    HK_COUNT
};

struct hcs_sym_info {
    const char *name;
    void *wrapper; /* NULL for helpers */
    int lib;
};
extern const struct hcs_sym_info hcs_syms[HK_COUNT] HCS_HIDDEN;
extern void *hcs_real_ptr[HK_COUNT] HCS_HIDDEN;
HCS_HIDDEN void *hcs_resolve_slow(int idx);
HCS_HIDDEN void *hcs_dlsym_real(void *handle, const char *name);
/* Store the vendor pointer pfn as the real function of idx unless known. */
HCS_HIDDEN void hcs_learn_real(int idx, void *pfn);

static inline void *hcs_real(int idx) {
    void *p = __atomic_load_n(&hcs_real_ptr[idx], __ATOMIC_ACQUIRE);
    if (HCS_LIKELY(p != NULL)) return p;
    return hcs_resolve_slow(idx);
}
#define REAL(name) ((__typeof__(&name))hcs_real(HK_##name))
/* Call the real function if it can be found (rollback paths). */
#define HCS_CALL_IF(name, args)                      \
    do {                                             \
        __typeof__(&name) f_ = REAL(name);           \
        if (f_) (void)f_ args;                       \
    } while (0)

/* cuda.c */
HCS_HIDDEN void *hcs_cuda_wrap_proc(const char *symbol, void *pfn, int cuda_version, cuuint64_t flags);

#endif
