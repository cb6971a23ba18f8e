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
