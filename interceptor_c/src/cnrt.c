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
