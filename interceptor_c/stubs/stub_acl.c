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
