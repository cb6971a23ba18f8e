/* Stub libcuda.so.1. */
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
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return cuMemAlloc_v2(p, n); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    return pool ? cuMemAlloc_v2(p, n) : CUDA_ERROR_INVALID_VALUE;
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
CUresult cuMemFree_v2(CUdeviceptr p) { return map(stub_free(p)); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return map(stub_free(p)); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return map(stub_free(p)); }
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
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return map(stub_free(h)); }

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
    E(cuGetProcAddress), E(cuGetProcAddress_v2),
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
