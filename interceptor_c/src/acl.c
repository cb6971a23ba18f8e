/* Ascend ACL hooks: every device allocation entry point of libascendcl. */
#include "hcs.h"

static inline int acl_device(int *dev) {
    __typeof__(&aclrtGetDevice) f = REAL(aclrtGetDevice);
    int32_t d;
    if (!f || f(&d) != ACL_SUCCESS) return 0;
    *dev = d;
    return 1;
}

static inline int acl_hbm(aclrtMemAttr attr) {
    return attr == ACL_HBM_MEM || attr == ACL_HBM_MEM_HUGE || attr == ACL_HBM_MEM_NORMAL ||
           attr == ACL_HBM_MEM_P2P_HUGE || attr == ACL_HBM_MEM_P2P_NORMAL;
}

#define ACL_REAL_OR_FAIL(name)                \
    __typeof__(&name) real = REAL(name);      \
    if (HCS_UNLIKELY(!real)) return ACL_ERROR_UNINITIALIZE
#define ACL_ALLOC(size, call, ptr)                                                               \
    HCS_ALLOC(ACL_SUCCESS, ACL_ERROR_RT_MEMORY_ALLOCATION, acl_device, size, call, HCS_KEY_PTR(*(ptr)), \
              HCS_CALL_IF(aclrtFree, (*(ptr))))

HCS_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    ACL_REAL_OR_FAIL(aclrtMalloc);
    ACL_ALLOC(size, real(devPtr, size, policy), devPtr);
}

HCS_EXPORT aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    ACL_REAL_OR_FAIL(aclrtMallocCached);
    ACL_ALLOC(size, real(devPtr, size, policy), devPtr);
}

HCS_EXPORT aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    ACL_REAL_OR_FAIL(aclrtMallocAlign32);
    ACL_ALLOC(size, real(devPtr, size, policy), devPtr);
}

HCS_EXPORT aclError aclrtMallocWithCfg(void **devPtr, size_t size, aclrtMemMallocPolicy policy, void *cfg) {
    ACL_REAL_OR_FAIL(aclrtMallocWithCfg);
    ACL_ALLOC(size, real(devPtr, size, policy, cfg), devPtr);
}

HCS_EXPORT aclError aclrtFree(void *devPtr) {
    ACL_REAL_OR_FAIL(aclrtFree);
    HCS_FREE(ACL_SUCCESS, HCS_KEY_PTR(devPtr), real(devPtr));
}

/* VMM: physical memory is charged at aclrtMallocPhysical and refunded when
 * it is freed and no longer mapped. */
static inline int acl_phys_device(const aclrtPhysicalMemProp *prop, int *dev) {
    if (!prop || prop->location.type != ACL_MEM_LOCATION_TYPE_DEVICE || !acl_hbm(prop->memAttr)) return 0;
    *dev = (int)prop->location.id;
    return 1;
}

HCS_EXPORT aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                                        uint64_t flags) {
    ACL_REAL_OR_FAIL(aclrtMallocPhysical);
#define VMM_DEV(d) acl_phys_device(prop, (d))
    HCS_VMM_CREATE(HCS_LIB_ACL, ACL_SUCCESS, ACL_ERROR_RT_MEMORY_ALLOCATION, VMM_DEV, size,
                   real(handle, size, prop, flags), (uintptr_t)*handle, HCS_CALL_IF(aclrtFreePhysical, (*handle)));
#undef VMM_DEV
}

HCS_EXPORT aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
    ACL_REAL_OR_FAIL(aclrtFreePhysical);
    aclError r = real(handle);
    if (r == ACL_SUCCESS && hcs_tracking()) hcs_vmm_released(HCS_LIB_ACL, (uint64_t)(uintptr_t)handle);
    return r;
}

HCS_EXPORT aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags) {
    ACL_REAL_OR_FAIL(aclrtMapMem);
    aclError r = real(virPtr, size, offset, handle, flags);
    if (r == ACL_SUCCESS && hcs_tracking())
        hcs_vmm_mapped(HCS_LIB_ACL, (uint64_t)(uintptr_t)virPtr, size, (uint64_t)(uintptr_t)handle);
    return r;
}

HCS_EXPORT aclError aclrtUnmapMem(void *virPtr) {
    ACL_REAL_OR_FAIL(aclrtUnmapMem);
    aclError r = real(virPtr);
    if (r == ACL_SUCCESS && hcs_tracking()) hcs_vmm_unmapped(HCS_LIB_ACL, (uint64_t)(uintptr_t)virPtr, 1);
    return r;
}

HCS_EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total) {
    ACL_REAL_OR_FAIL(aclrtGetMemInfo);
    aclError r = real(attr, free, total);
    if (r == ACL_SUCCESS && acl_hbm(attr)) HCS_MEMINFO(acl_device, free, total);
    return r;
}
