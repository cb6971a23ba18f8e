/* Stub libamdhip64.so. */
#include "stub.h"

static hipError_t map(int rc) {
    return rc == STUB_OK ? hipSuccess : rc == STUB_ENOMEM ? hipErrorOutOfMemory : hipErrorInvalidValue;
}
hipError_t hipSetDevice(int d) { return map(stub_set_device(d)); }
hipError_t hipGetDevice(int *d) { *d = stub_get_device(); return hipSuccess; }
hipError_t hipMalloc(void **p, size_t n) { return p ? map(stub_alloc(n, (uint64_t *)p)) : hipErrorInvalidValue; }
hipError_t hipFree(void *p) { return p ? map(stub_free((uint64_t)(uintptr_t)p)) : hipSuccess; }
hipError_t hipMemGetInfo(size_t *f, size_t *t) {
    uint64_t ff, tt;
    stub_meminfo(stub_get_device(), &ff, &tt);
    *f = ff;
    *t = tt;
    return hipSuccess;
}
hipError_t hipMallocManaged(void **p, size_t n, unsigned int f) { (void)f; return hipMalloc(p, n); }
hipError_t hipExtMallocWithFlags(void **p, size_t n, unsigned int f) { (void)f; return hipMalloc(p, n); }
hipError_t hipMallocPitch(void **p, size_t *pitch, size_t w, size_t h) {
    if (!pitch) return hipErrorInvalidValue;
    *pitch = (w + 511) / 512 * 512;
    return hipMalloc(p, *pitch * h);
}
hipError_t hipMemAllocPitch(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
    (void)e;
    return hipMallocPitch((void **)p, pitch, w, h);
}
hipError_t hipMallocArray(hipArray_t *a, const hipChannelFormatDesc *d, size_t w, size_t h, unsigned int f) {
    (void)f;
    if (!a || !d) return hipErrorInvalidValue;
    return hipMalloc((void **)a, w * (h ? h : 1) * (size_t)((d->x + d->y + d->z + d->w + 7) / 8));
}
hipError_t hipFreeArray(hipArray_t a) { return hipFree(a); }
hipError_t hipMallocAsync(void **p, size_t n, hipStream_t s) { (void)s; return hipMalloc(p, n); }
hipError_t hipMallocFromPoolAsync(void **p, size_t n, hipMemPool_t pool, hipStream_t s) {
    (void)pool, (void)s;
    return hipMalloc(p, n);
}
hipError_t hipFreeAsync(void *p, hipStream_t s) { (void)s; return hipFree(p); }
hipError_t hipDeviceGetMemPool(hipMemPool_t *pool, int d) {
    *pool = (hipMemPool_t)(uintptr_t)(0x3000 + d);
    return hipSuccess;
}
hipError_t hipMemPoolTrimTo(hipMemPool_t pool, size_t keep) { (void)pool, (void)keep; return hipSuccess; }
hipError_t hipMemPoolSetAttribute(hipMemPool_t pool, int attr, void *v) { (void)pool, (void)attr, (void)v; return hipSuccess; }
hipError_t hipMemPoolDestroy(hipMemPool_t pool) { (void)pool; return hipSuccess; }
hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *h, size_t n, const hipMemAllocationProp *prop,
                        unsigned long long f) {
    if (!h || !prop || f) return hipErrorInvalidValue;
    return map(stub_alloc_dev(prop->location.id, n, (uint64_t *)h));
}
hipError_t hipMemRelease(hipMemGenericAllocationHandle_t h) { return map(stub_free((uint64_t)(uintptr_t)h)); }
static uint64_t next_va = 0x600000000000ULL;
hipError_t hipMemAddressReserve(void **p, size_t n, size_t align, void *addr, unsigned long long f) {
    (void)align, (void)addr, (void)f;
    *p = (void *)(uintptr_t)__atomic_fetch_add(&next_va, (n + 0xfffff) & ~(size_t)0xfffff, __ATOMIC_RELAXED);
    return hipSuccess;
}
hipError_t hipMemMap(void *p, size_t n, size_t off, hipMemGenericAllocationHandle_t h, unsigned long long f) {
    (void)p, (void)n, (void)off, (void)h, (void)f;
    return hipSuccess;
}
hipError_t hipMemUnmap(void *p, size_t n) { (void)p, (void)n; return hipSuccess; }
