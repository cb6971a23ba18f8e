/* Stub libcnrt.so (CNRT >= 5 flavour: exports cnrtGetLibVersion). */
#include "stub.h"

static cnrtRet_t map(int rc) {
    return rc == STUB_OK ? cnrtSuccess : rc == STUB_ENOMEM ? cnrtErrorNoMem : cnrtErrorArgsInvalid;
}
cnrtRet_t cnrtGetLibVersion(int *a, int *b, int *c) { *a = 6; *b = 6; *c = 0; return cnrtSuccess; }
cnrtRet_t cnrtSetDevice(int d) { return map(stub_set_device(d)); }
cnrtRet_t cnrtGetDevice(int *d) { *d = stub_get_device(); return cnrtSuccess; }
cnrtRet_t cnrtMalloc(void **p, size_t n) { return p ? map(stub_alloc(n, (uint64_t *)p)) : cnrtErrorArgsInvalid; }
cnrtRet_t cnrtFree(void *p) { return map(stub_free((uint64_t)(uintptr_t)p)); }
cnrtRet_t cnrtMemGetInfo(size_t *f, size_t *t) {
    uint64_t ff, tt;
    stub_meminfo(stub_get_device(), &ff, &tt);
    *f = ff;
    *t = tt;
    return cnrtSuccess;
}
cnrtRet_t cnrtMallocConstant(void **p, size_t n) { return cnrtMalloc(p, n); }
cnrtRet_t cnrtMemAllocAsync(void **p, size_t n, cnrtQueue_t q) { (void)q; return cnrtMalloc(p, n); }
cnrtRet_t cnrtMemFreeAsync(void *p, cnrtQueue_t q) { (void)q; return cnrtFree(p); }
cnrtRet_t cnrtDeviceGetMemPool(cnrtMemPool_t *pool, int d) {
    *pool = (cnrtMemPool_t)(uintptr_t)(0x4000 + d);
    return cnrtSuccess;
}
cnrtRet_t cnrtMemPoolTrimTo(cnrtMemPool_t pool, size_t keep) { (void)pool, (void)keep; return cnrtSuccess; }
cnrtRet_t cnrtMemPoolSetAttribute(cnrtMemPool_t pool, int attr, void *v) { (void)pool, (void)attr, (void)v; return cnrtSuccess; }
