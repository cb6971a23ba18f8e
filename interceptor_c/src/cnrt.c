/* Cambricon CNRT hooks. CNRT >= 5 reports cnrtErrorNoMem (100100); the
 * legacy 4.x runtime (no cnrtGetLibVersion) uses CNRT_RET_ERR_NOMEM. */
#include "hcs.h"


static inline int cnrt_device(int *dev) {
    __typeof__(&cnrtGetDevice) f = REAL(cnrtGetDevice);
    return f && f(dev) == cnrtSuccess;
}

static int cnrt_oom_code(void) {
    static _Atomic int code;
    int c = atomic_load_explicit(&code, memory_order_relaxed);
    if (!c) {
        c = hcs_real(HK_cnrtGetLibVersion) ? cnrtErrorNoMem : CNRT_RET_ERR_NOMEM;
        atomic_store_explicit(&code, c, memory_order_relaxed);
    }
    return c;
}

HCS_EXPORT cnrtRet_t cnrtMalloc(void **pPtr, size_t bytes) {
    __typeof__(&cnrtMalloc) real = REAL(cnrtMalloc);
    if (!real) return cnrtErrorNoDevice;
    HCS_ALLOC(cnrtSuccess, cnrt_oom_code(), cnrt_device, bytes, real(pPtr, bytes), HCS_KEY_PTR(*pPtr),
              HCS_CALL_IF(cnrtFree, (*pPtr)));
}

HCS_EXPORT cnrtRet_t cnrtMallocConstant(void **pPtr, size_t bytes) {
    __typeof__(&cnrtMallocConstant) real = REAL(cnrtMallocConstant);
    if (!real) return cnrtErrorNoDevice;
    HCS_ALLOC(cnrtSuccess, cnrt_oom_code(), cnrt_device, bytes, real(pPtr, bytes), HCS_KEY_PTR(*pPtr),
              HCS_CALL_IF(cnrtFree, (*pPtr)));
}

static inline uint64_t cnrt_current_pool(int dev) {
    __typeof__(&cnrtDeviceGetMemPool) f = REAL(cnrtDeviceGetMemPool);
    cnrtMemPool_t pool = NULL;
    return f && f(&pool, dev) == cnrtSuccess ? (uint64_t)(uintptr_t)pool : 0;
}

HCS_EXPORT cnrtRet_t cnrtMemAllocAsync(void **pPtr, size_t bytes, cnrtQueue_t queue) {
    __typeof__(&cnrtMemAllocAsync) real = REAL(cnrtMemAllocAsync);
    if (!real) return cnrtErrorNoDevice;
    HCS_POOL_ALLOC(HCS_LIB_CNRT, cnrtSuccess, cnrt_oom_code(), cnrt_device, cnrt_current_pool, bytes,
                   real(pPtr, bytes, queue), HCS_KEY_PTR(*pPtr), HCS_CALL_IF(cnrtMemFreeAsync, (*pPtr, queue)));
}

HCS_EXPORT cnrtRet_t cnrtMemFreeAsync(void *ptr, cnrtQueue_t queue) {
    __typeof__(&cnrtMemFreeAsync) real = REAL(cnrtMemFreeAsync);
    if (!real) return cnrtErrorNoDevice;
    HCS_FREE(cnrtSuccess, HCS_KEY_PTR(ptr), real(ptr, queue));
}

HCS_EXPORT cnrtRet_t cnrtMemPoolTrimTo(cnrtMemPool_t pool, size_t minBytesToKeep) {
    __typeof__(&cnrtMemPoolTrimTo) real = REAL(cnrtMemPoolTrimTo);
    if (!real) return cnrtErrorNoDevice;
    cnrtRet_t r = real(pool, minBytesToKeep);
    if (r == cnrtSuccess && hcs_tracking()) hcs_pool_trimmed(HCS_LIB_CNRT, (uint64_t)(uintptr_t)pool, minBytesToKeep);
    return r;
}

HCS_EXPORT cnrtRet_t cnrtMemPoolSetAttribute(cnrtMemPool_t pool, int attr, void *value) {
    __typeof__(&cnrtMemPoolSetAttribute) real = REAL(cnrtMemPoolSetAttribute);
    if (!real) return cnrtErrorNoDevice;
    cnrtRet_t r = real(pool, attr, value);
    int dev;
    if (r == cnrtSuccess && attr == cnrtMemPoolAttrReleaseThreshold && value && hcs_tracking() && cnrt_device(&dev))
        hcs_pool_threshold(HCS_LIB_CNRT, (uint64_t)(uintptr_t)pool, dev, *(uint64_t *)value);
    return r;
}

HCS_EXPORT cnrtRet_t cnrtFree(void *ptr) {
    __typeof__(&cnrtFree) real = REAL(cnrtFree);
    if (!real) return cnrtErrorNoDevice;
    HCS_FREE(cnrtSuccess, HCS_KEY_PTR(ptr), real(ptr));
}

HCS_EXPORT cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total) {
    __typeof__(&cnrtMemGetInfo) real = REAL(cnrtMemGetInfo);
    if (!real) return cnrtErrorNoDevice;
    cnrtRet_t r = real(free, total);
    if (r == cnrtSuccess) HCS_MEMINFO(cnrt_device, free, total);
    return r;
}
