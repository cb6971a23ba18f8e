/* Stub libcuda.so.1. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub.h"

static CUresult map(int rc) {
    return rc == STUB_OK ? CUDA_SUCCESS : rc == STUB_ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = stub_device_count(); return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= stub_device_count()) return CUDA_ERROR_INVALID_VALUE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    *ctx = (CUcontext)(uintptr_t)(dev + 1);
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext ctx) { return map(stub_set_device((int)(uintptr_t)ctx - 1)); }
CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = stub_get_device();
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return p ? map(stub_alloc(n, (uint64_t *)p)) : CUDA_ERROR_INVALID_VALUE; }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int f) { (void)f; return cuMemAlloc_v2(p, n); }
/* Stream-ordered allocator. Default pool of device d: handle 0x1000 + d.
 * Freed memory stays in the pool (still used on the device) up to the
 * pool's release threshold, or until trimmed. */
#define NPOOL 64
static struct { uint64_t threshold, retained; int dev; } pools[NPOOL];
static int npools = 16;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define NPA 4096
static struct { uint64_t addr; int pool; } pool_allocs[NPA];
static _Atomic int live_pool_allocs; /* frees skip the pool table while 0 */

static int pool_idx(CUmemoryPool pool) {
    uintptr_t h = (uintptr_t)pool;
    if (h < 0x1000 || h >= 0x1000 + NPOOL) return -1;
    int i = (int)(h - 0x1000);
    if (i < 16) pools[i].dev = i;
    return i < npools ? i : -1;
}
static CUresult pool_alloc(CUdeviceptr *p, size_t n, int pi) {
    pthread_mutex_lock(&mu);
    uint64_t reuse = pools[pi].retained < n ? pools[pi].retained : n;
    pools[pi].retained -= reuse;
    stub_phys_add(pools[pi].dev, -(int64_t)reuse);
    pthread_mutex_unlock(&mu);
    CUresult r = map(stub_alloc_dev(pools[pi].dev, n, (uint64_t *)p));
    pthread_mutex_lock(&mu);
    if (r != CUDA_SUCCESS) {
        pools[pi].retained += reuse;
        stub_phys_add(pools[pi].dev, (int64_t)reuse);
    } else {
        for (int k = 0; k < NPA; k++)
            if (!pool_allocs[k].addr) {
                pool_allocs[k].addr = *p;
                pool_allocs[k].pool = pi;
                atomic_fetch_add(&live_pool_allocs, 1);
                break;
            }
    }
    pthread_mutex_unlock(&mu);
    return r;
}
static void pool_trim(int pi, uint64_t keep) {
    if (pools[pi].retained > keep) {
        stub_phys_add(pools[pi].dev, -(int64_t)(pools[pi].retained - keep));
        pools[pi].retained = keep;
    }
}
static CUresult any_free(CUdeviceptr p) {
    if (atomic_load_explicit(&live_pool_allocs, memory_order_acquire) == 0) return map(stub_free(p));
    int dev;
    uint64_t size;
    if (stub_lookup(p, &dev, &size) != STUB_OK) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int pi = -1;
    for (int k = 0; k < NPA; k++)
        if (pool_allocs[k].addr == p) {
            pi = pool_allocs[k].pool;
            pool_allocs[k].addr = 0;
            atomic_fetch_sub(&live_pool_allocs, 1);
            break;
        }
    CUresult r = map(stub_free(p));
    if (r == CUDA_SUCCESS && pi >= 0) {
        pools[pi].retained += size;
        stub_phys_add(dev, (int64_t)size);
        pool_trim(pi, pools[pi].threshold);
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool || dev < 0 || dev >= stub_device_count()) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)(uintptr_t)(0x1000 + dev);
    pools[dev].dev = dev;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) { return cuDeviceGetMemPool(pool, dev); }
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int i = npools < NPOOL ? npools++ : -1;
    if (i >= 0) pools[i].dev = props->location.id;
    pthread_mutex_unlock(&mu);
    if (i < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = (CUmemoryPool)(uintptr_t)(0x1000 + i);
    return CUDA_SUCCESS;
}
CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    int i = pool_idx(pool);
    if (i < 16) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    pool_trim(i, 0);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    int i = pool_idx(pool);
    if (i < 0 || !value) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        pthread_mutex_lock(&mu);
        pools[i].threshold = *(cuuint64_t *)value;
        pool_trim(i, pools[i].threshold);
        pthread_mutex_unlock(&mu);
    }
    return CUDA_SUCCESS;
}
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    int i = pool_idx(pool);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    pool_trim(i, keep);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    (void)s;
    return p ? pool_alloc(p, n, stub_get_device()) : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    int i = pool_idx(pool);
    return p && i >= 0 ? pool_alloc(p, n, i) : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
    if (!pitch || (e != 4 && e != 8 && e != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t align = getenv("STUB_PITCH_ALIGN") ? strtoul(getenv("STUB_PITCH_ALIGN"), NULL, 10) : 512;
    size_t pt = (w + align - 1) / align * align;
    CUresult r = cuMemAlloc_v2(p, pt * h);
    if (r == CUDA_SUCCESS) *pitch = pt;
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return any_free(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return any_free(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return any_free(p); }

/* Legacy 32-bit entry points: a v1 pointer is the offset from the stub's base. */
#define V1(p) ((CUdeviceptr_v1)((p) - 0x10000000000ULL))
#define V2(p) ((CUdeviceptr)(p) + 0x10000000000ULL)
CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n) {
    CUdeviceptr d;
    CUresult r = p ? cuMemAlloc_v2(&d, n) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) *p = V1(d);
    return r;
}
CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int e) {
    CUdeviceptr d;
    size_t pt;
    CUresult r = p && pitch ? cuMemAllocPitch_v2(&d, &pt, w, h, e) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) *p = V1(d), *pitch = (unsigned int)pt;
    return r;
}
CUresult cuMemFree(CUdeviceptr_v1 p) { return cuMemFree_v2(V2(p)); }
CUresult cuMemGetInfo(unsigned int *f, unsigned int *t) {
    size_t ff, tt;
    CUresult r = f && t ? cuMemGetInfo_v2(&ff, &tt) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) *f = ff > UINT32_MAX ? UINT32_MAX : (unsigned)ff, *t = tt > UINT32_MAX ? UINT32_MAX : (unsigned)tt;
    return r;
}
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    uint64_t ff, tt;
    if (!f || !t) return CUDA_ERROR_INVALID_VALUE;
    stub_meminfo(stub_get_device(), &ff, &tt);
    *f = ff;
    *t = tt;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    if (!h || !prop || flags || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    return map(stub_alloc_dev(prop->location.id, n, (uint64_t *)h));
}
/* VMM: a handle's memory stays allocated until it is released and unmapped. */
#define NMAP 1024
static struct { CUdeviceptr va; size_t size; CUmemGenericAllocationHandle h; } maps[NMAP];
static struct { CUmemGenericAllocationHandle h; int released; } dead[NMAP];
static CUdeviceptr next_va = 0x700000000000ULL;
static int mapped(CUmemGenericAllocationHandle h) {
    int n = 0;
    for (int i = 0; i < NMAP; i++) n += maps[i].size && maps[i].h == h;
    return n;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    if (mapped(h)) {
        for (int i = 0; i < NMAP; i++)
            if (!dead[i].released) {
                dead[i].h = h, dead[i].released = 1;
                break;
            }
    } else {
        r = map(stub_free(h));
    }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    (void)align, (void)addr, (void)flags;
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *p = next_va;
    next_va += (size + 0xfffff) & ~(CUdeviceptr)0xfffff;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p, (void)size; return CUDA_SUCCESS; }
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long flags) {
    int dev;
    uint64_t hsize;
    if (off || flags || stub_lookup(h, &dev, &hsize) != STUB_OK || size > hsize) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < NMAP; i++)
        if (!maps[i].size) {
            maps[i].va = va, maps[i].size = size, maps[i].h = h;
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&mu);
    return r;
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < NMAP; i++) {
        if (!maps[i].size || maps[i].va < va || maps[i].va - va >= size) continue;
        CUmemGenericAllocationHandle h = maps[i].h;
        maps[i].size = 0;
        if (mapped(h)) continue;
        for (int k = 0; k < NMAP; k++)
            if (dead[k].released && dead[k].h == h) {
                dead[k].released = 0;
                stub_free(h); /* released earlier: its memory goes now */
            }
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* Graphs: memory nodes get their memory when the graph is instantiated. */
#define NGRAPH 64
static struct { int used; size_t bytes[16]; } graphs[NGRAPH];
static struct { int used; uint64_t mem[16]; } execs[NGRAPH];
CUresult cuGraphCreate(CUgraph *g, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < NGRAPH && graphs[i].used) i++;
    if (i < NGRAPH) memset(&graphs[i], 0, sizeof graphs[i]), graphs[i].used = 1;
    pthread_mutex_unlock(&mu);
    if (i == NGRAPH) return CUDA_ERROR_OUT_OF_MEMORY;
    *g = (CUgraph)(uintptr_t)(0x5000 + i * 16);
    return CUDA_SUCCESS;
}
static int graph_idx(CUgraph g) {
    uintptr_t h = (uintptr_t)g;
    int i = (int)((h - 0x5000) / 16);
    return h >= 0x5000 && i < NGRAPH && graphs[i].used ? i : -1;
}
CUresult cuGraphDestroy(CUgraph g) {
    int i = graph_idx(g);
    if (i < 0) return CUDA_ERROR_INVALID_VALUE;
    graphs[i].used = 0;
    return CUDA_SUCCESS;
}
CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    (void)deps, (void)n;
    int i = graph_idx(g);
    if (i < 0 || !node || !p || !p->bytesize || (unsigned)p->poolProps.location.id >= 16) return CUDA_ERROR_INVALID_VALUE;
    graphs[i].bytes[p->poolProps.location.id] += p->bytesize;
    p->dptr = next_va;
    next_va += (p->bytesize + 0xfffff) & ~(CUdeviceptr)0xfffff;
    *node = (CUgraphNode)(uintptr_t)p->dptr;
    return CUDA_SUCCESS;
}
static CUresult instantiate(CUgraphExec *e, CUgraph g) {
    int i = graph_idx(g);
    if (i < 0 || !e) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int x = 0;
    while (x < NGRAPH && execs[x].used) x++;
    if (x < NGRAPH) memset(&execs[x], 0, sizeof execs[x]), execs[x].used = 1;
    pthread_mutex_unlock(&mu);
    if (x == NGRAPH) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int d = 0; d < 16; d++) {
        if (!graphs[i].bytes[d]) continue;
        if (stub_alloc_dev(d, graphs[i].bytes[d], &execs[x].mem[d]) != STUB_OK) {
            for (int k = 0; k < d; k++)
                if (execs[x].mem[k]) stub_free(execs[x].mem[k]);
            execs[x].used = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *e = (CUgraphExec)(uintptr_t)(0x9000 + x * 16);
    return CUDA_SUCCESS;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)flags;
    return instantiate(e, g);
}
CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n) {
    (void)err, (void)log, (void)n;
    return instantiate(e, g);
}
CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n) {
    return cuGraphInstantiate(e, g, err, log, n);
}
CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    CUresult r = instantiate(e, g);
    if (p) p->result_out = r == CUDA_SUCCESS ? 0 : 1;
    return r;
}
CUresult cuGraphExecDestroy(CUgraphExec e) {
    uintptr_t h = (uintptr_t)e;
    int x = (int)((h - 0x9000) / 16);
    if (h < 0x9000 || x >= NGRAPH || !execs[x].used) return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < 16; d++)
        if (execs[x].mem[d]) stub_free(execs[x].mem[d]);
    execs[x].used = 0;
    return CUDA_SUCCESS;
}

static size_t texel(const CUDA_ARRAY3D_DESCRIPTOR *d) {
    size_t e = (d->Format == 0x01 || d->Format == 0x08) ? 1 : (d->Format == 0x02 || d->Format == 0x09 || d->Format == 0x10) ? 2 : 4;
    return e * (d->NumChannels ? d->NumChannels : 1);
}
static CUresult array_alloc(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels, void **out) {
    size_t total = 0;
    if (!d || !out || !d->Width) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        size_t w = d->Width >> l ? d->Width >> l : 1, h = d->Height ? (d->Height >> l ? d->Height >> l : 1) : 1,
               z = d->Depth ? (d->Depth >> l ? d->Depth >> l : 1) : 1;
        total += w * h * z * texel(d);
    }
    uint64_t a;
    CUresult r = map(stub_alloc(total, &a));
    if (r == CUDA_SUCCESS) *out = (void *)(uintptr_t)a;
    return r;
}
CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
    return array_alloc(&d3, 1, (void **)a);
}
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) { return array_alloc(d, 1, (void **)a); }
CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
    return array_alloc(&d3, 1, (void **)a);
}
CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 0};
    return array_alloc(&d3, 1, (void **)a);
}
CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    return array_alloc(d, levels, (void **)a);
}
CUresult cuArrayDestroy(CUarray a) { return map(stub_free((uint64_t)(uintptr_t)a)); }
CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return map(stub_free((uint64_t)(uintptr_t)a)); }

/* ---- cuGetProcAddress: name + (version, flags) -> exported entry point.
 * STUB_GPA_INDIRECT=1 hands out distinct trampolines instead of the
 * exported addresses (like a driver with internal entry points). */
static CUresult tramp_alloc(CUdeviceptr *p, size_t n) { return cuMemAlloc_v2(p, n); }
static CUresult tramp_free(CUdeviceptr p) { return cuMemFree_v2(p); }
static CUresult tramp_info(size_t *f, size_t *t) { return cuMemGetInfo_v2(f, t); }
static CUresult tramp_async(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
static CUresult tramp_alloc_v1(CUdeviceptr_v1 *p, unsigned int n) { return cuMemAlloc(p, n); }

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

struct entry { const char *name; void *fn; void *indirect; };
#define E(n) {#n, (void *)n, NULL}
#define T(n, t) {#n, (void *)n, (void *)t}
static const struct entry table[] = {
    E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet), E(cuDevicePrimaryCtxRetain),
    E(cuCtxSetCurrent), E(cuCtxGetDevice), T(cuMemAlloc_v2, tramp_alloc), E(cuMemAllocManaged),
    T(cuMemAllocAsync, tramp_async), E(cuMemAllocAsync_ptsz), E(cuMemAllocFromPoolAsync),
    E(cuMemAllocFromPoolAsync_ptsz), E(cuMemAllocPitch_v2), T(cuMemFree_v2, tramp_free), E(cuMemFreeAsync),
    E(cuMemFreeAsync_ptsz), T(cuMemGetInfo_v2, tramp_info), E(cuMemCreate), E(cuMemRelease), E(cuArrayCreate_v2),
    E(cuArray3DCreate_v2), E(cuMipmappedArrayCreate), E(cuArrayDestroy), E(cuMipmappedArrayDestroy),
    E(cuGetProcAddress), E(cuGetProcAddress_v2), T(cuMemAlloc, tramp_alloc_v1), E(cuMemAllocPitch), E(cuMemFree), E(cuMemGetInfo),
    E(cuArrayCreate), E(cuArray3DCreate), E(cuMemMap), E(cuMemUnmap), E(cuMemAddressReserve), E(cuMemAddressFree),
    E(cuDeviceGetMemPool), E(cuDeviceGetDefaultMemPool), E(cuMemPoolCreate), E(cuMemPoolDestroy),
    E(cuMemPoolSetAttribute), E(cuMemPoolTrimTo), E(cuGraphCreate), E(cuGraphDestroy), E(cuGraphAddMemAllocNode),
    E(cuGraphInstantiate), E(cuGraphInstantiate_v2), E(cuGraphInstantiateWithFlags), E(cuGraphInstantiateWithParams),
    E(cuGraphExecDestroy),
};

static const struct entry *find(const char *name) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

static CUresult lookup(const char *symbol, void **pfn, int ver, cuuint64_t flags, int *status) {
    char buf[256];
    const struct entry *e = NULL;
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn || strlen(symbol) > 200) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(buf, sizeof buf, "%s_ptsz", symbol);
        e = find(buf);
    }
    if (ver >= 12000 && !strcmp(symbol, "cuGraphInstantiate")) symbol = "cuGraphInstantiateWithFlags";
    int v2min = !strcmp(symbol, "cuGetProcAddress") ? 12000 : 3020;
    if (!e && ver >= v2min) {
        snprintf(buf, sizeof buf, "%s_v2", symbol);
        e = find(buf);
    }
    if (!e) e = find(symbol);
    if (!e) return CUDA_ERROR_NOT_FOUND;
    const char *ind = getenv("STUB_GPA_INDIRECT");
    *pfn = (ind && *ind == '1' && e->indirect) ? e->indirect : e->fn;
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    int st;
    return lookup(symbol, pfn, cudaVersion, flags, &st);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    int st;
    CUresult r = lookup(symbol, pfn, cudaVersion, flags, &st);
    if (status) *status = st;
    return r;
}
