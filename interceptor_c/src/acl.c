/* Ascend ACL hooks. */
#include "hcs.h"


static inline int acl_device(int *dev) {
    __typeof__(&aclrtGetDevice) f = REAL(aclrtGetDevice);
    int32_t d;
    if (!f || f(&d) != ACL_SUCCESS) return 0;
    *dev = d;
    return 1;
}

HCS_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    __typeof__(&aclrtMalloc) real = REAL(aclrtMalloc);
    if (!real) return ACL_ERROR_UNINITIALIZE;
    HCS_ALLOC(ACL_SUCCESS, ACL_ERROR_RT_MEMORY_ALLOCATION, acl_device, size, real(devPtr, size, policy),
              HCS_KEY_PTR(*devPtr), HCS_CALL_IF(aclrtFree, (*devPtr)));
}

HCS_EXPORT aclError aclrtFree(void *devPtr) {
    __typeof__(&aclrtFree) real = REAL(aclrtFree);
    if (!real) return ACL_ERROR_UNINITIALIZE;
    HCS_FREE(ACL_SUCCESS, HCS_KEY_PTR(devPtr), real(devPtr));
}

HCS_EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total) {
    __typeof__(&aclrtGetMemInfo) real = REAL(aclrtGetMemInfo);
    if (!real) return ACL_ERROR_UNINITIALIZE;
    aclError r = real(attr, free, total);
    int hbm = attr == ACL_HBM_MEM || attr == ACL_HBM_MEM_HUGE || attr == ACL_HBM_MEM_NORMAL ||
              attr == ACL_HBM_MEM_P2P_HUGE || attr == ACL_HBM_MEM_P2P_NORMAL;
    if (r == ACL_SUCCESS && hbm) HCS_MEMINFO(acl_device, free, total);
    return r;
}
