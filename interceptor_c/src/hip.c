/* AMD HIP hooks. */
#include "hcs.h"


static inline int hip_device(int *dev) {
    __typeof__(&hipGetDevice) f = REAL(hipGetDevice);
    return f && f(dev) == hipSuccess;
}

HCS_EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
    __typeof__(&hipMalloc) real = REAL(hipMalloc);
    if (!real) return hipErrorNotInitialized;
    HCS_ALLOC(hipSuccess, hipErrorOutOfMemory, hip_device, size, real(ptr, size), HCS_KEY_PTR(*ptr),
              HCS_CALL_IF(hipFree, (*ptr)));
}

HCS_EXPORT hipError_t hipFree(void *ptr) {
    __typeof__(&hipFree) real = REAL(hipFree);
    if (!real) return hipErrorNotInitialized;
    HCS_FREE(hipSuccess, HCS_KEY_PTR(ptr), real(ptr));
}

HCS_EXPORT hipError_t hipMemGetInfo(size_t *free, size_t *total) {
    __typeof__(&hipMemGetInfo) real = REAL(hipMemGetInfo);
    if (!real) return hipErrorNotInitialized;
    hipError_t r = real(free, total);
    if (r == hipSuccess) HCS_MEMINFO(hip_device, free, total);
    return r;
}
