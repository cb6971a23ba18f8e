/* Stub libascendcl.so. */
#include "stub.h"

static aclError map(int rc) {
    return rc == STUB_OK ? ACL_SUCCESS : rc == STUB_ENOMEM ? ACL_ERROR_RT_MEMORY_ALLOCATION : ACL_ERROR_INVALID_PARAM;
}
aclError aclInit(const char *cfg) { (void)cfg; return ACL_SUCCESS; }
aclError aclrtSetDevice(int32_t d) { return map(stub_set_device(d)); }
aclError aclrtGetDevice(int32_t *d) { *d = stub_get_device(); return ACL_SUCCESS; }
aclError aclrtMalloc(void **p, size_t n, aclrtMemMallocPolicy pol) {
    (void)pol;
    return p ? map(stub_alloc(n, (uint64_t *)p)) : ACL_ERROR_INVALID_PARAM;
}
aclError aclrtFree(void *p) { return map(stub_free((uint64_t)(uintptr_t)p)); }
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *f, size_t *t) {
    uint64_t ff, tt;
    stub_meminfo(stub_get_device(), &ff, &tt);
    if (attr == ACL_DDR_MEM) ff = tt = 64ULL << 30; /* host DDR: not sliced */
    *f = ff;
    *t = tt;
    return ACL_SUCCESS;
}
aclError aclrtMallocCached(void **p, size_t n, aclrtMemMallocPolicy pol) { return aclrtMalloc(p, n, pol); }
aclError aclrtMallocAlign32(void **p, size_t n, aclrtMemMallocPolicy pol) { return aclrtMalloc(p, n, pol); }
aclError aclrtMallocWithCfg(void **p, size_t n, aclrtMemMallocPolicy pol, void *cfg) {
    (void)cfg;
    return aclrtMalloc(p, n, pol);
}
aclError aclrtMallocPhysical(aclrtDrvMemHandle *h, size_t n, const aclrtPhysicalMemProp *prop, uint64_t f) {
    (void)f;
    if (!h || !prop) return ACL_ERROR_INVALID_PARAM;
    return map(stub_alloc_dev((int)prop->location.id, n, (uint64_t *)h));
}
aclError aclrtFreePhysical(aclrtDrvMemHandle h) { return map(stub_free((uint64_t)(uintptr_t)h)); }
static uint64_t next_va = 0x500000000000ULL;
aclError aclrtReserveMemAddress(void **p, size_t n, size_t align, void *expect, uint64_t f) {
    (void)align, (void)expect, (void)f;
    *p = (void *)(uintptr_t)__atomic_fetch_add(&next_va, (n + 0xfffff) & ~(size_t)0xfffff, __ATOMIC_RELAXED);
    return ACL_SUCCESS;
}
aclError aclrtMapMem(void *p, size_t n, size_t off, aclrtDrvMemHandle h, uint64_t f) {
    (void)p, (void)n, (void)off, (void)h, (void)f;
    return ACL_SUCCESS;
}
aclError aclrtUnmapMem(void *p) { (void)p; return ACL_SUCCESS; }
