/* AMD HIP hooks: every device allocation entry point of libamdhip64. */
#include "hcs.h"

static inline int hip_device(int *dev) {
    __typeof__(&hipGetDevice) f = REAL(hipGetDevice);
    return f && f(dev) == hipSuccess;
}

static inline uint64_t hip_current_pool(int dev) {
    __typeof__(&hipDeviceGetMemPool) f = REAL(hipDeviceGetMemPool);
    hipMemPool_t pool = NULL;
    return f && f(&pool, dev) == hipSuccess ? (uint64_t)(uintptr_t)pool : 0;
}

#define HIP_REAL_OR_FAIL(name)                \
    __typeof__(&name) real = REAL(name);      \
    if (HCS_UNLIKELY(!real)) return hipErrorNotInitialized
#define HIP_ALLOC(size, call, ptr)                                                                 \
    HCS_ALLOC(hipSuccess, hipErrorOutOfMemory, hip_device, size, call, HCS_KEY_PTR(*(ptr)), \
              HCS_CALL_IF(hipFree, (*(ptr))))

HCS_EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
    HIP_REAL_OR_FAIL(hipMalloc);
    HIP_ALLOC(size, real(ptr, size), ptr);
}

HCS_EXPORT hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags) {
    HIP_REAL_OR_FAIL(hipMallocManaged);
    HIP_ALLOC(size, real(ptr, size, flags), ptr);
}

HCS_EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags) {
    HIP_REAL_OR_FAIL(hipExtMallocWithFlags);
    HIP_ALLOC(size, real(ptr, size, flags), ptr);
}

HCS_EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height) {
    HIP_REAL_OR_FAIL(hipMallocPitch);
    HCS_PITCH_ALLOC(hipSuccess, hipErrorOutOfMemory, hip_device, real(ptr, pitch, width, height), width, height,
                    pitch, HCS_KEY_PTR(*ptr), HCS_CALL_IF(hipFree, (*ptr)));
}

HCS_EXPORT hipError_t hipMemAllocPitch(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes, size_t height,
                                       unsigned int elementSizeBytes) {
    HIP_REAL_OR_FAIL(hipMemAllocPitch);
    HCS_PITCH_ALLOC(hipSuccess, hipErrorOutOfMemory, hip_device,
                    real(dptr, pitch, widthInBytes, height, elementSizeBytes), widthInBytes, height, pitch,
                    HCS_KEY_PTR(*dptr), HCS_CALL_IF(hipFree, ((void *)(uintptr_t)*dptr)));
}

HCS_EXPORT hipError_t hipMallocArray(hipArray_t *array, const hipChannelFormatDesc *desc, size_t width,
                                     size_t height, unsigned int flags) {
    HIP_REAL_OR_FAIL(hipMallocArray);
    uint64_t bits = desc ? (uint64_t)(desc->x + desc->y + desc->z + desc->w) : 0;
    uint64_t bytes = hcs_mul_sat(hcs_mul_sat(width, height ? height : 1), (bits + 7) / 8);
    HCS_ALLOC(hipSuccess, hipErrorOutOfMemory, hip_device, bytes, real(array, desc, width, height, flags),
              HCS_KEY_ARRAY(*array), HCS_CALL_IF(hipFreeArray, (*array)));
}

HCS_EXPORT hipError_t hipFreeArray(hipArray_t array) {
    HIP_REAL_OR_FAIL(hipFreeArray);
    HCS_FREE(hipSuccess, HCS_KEY_ARRAY(array), real(array));
}

HCS_EXPORT hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream) {
    HIP_REAL_OR_FAIL(hipMallocAsync);
    HCS_POOL_ALLOC(HCS_LIB_HIP, hipSuccess, hipErrorOutOfMemory, hip_device, hip_current_pool, size,
                   real(ptr, size, stream), HCS_KEY_PTR(*ptr), HCS_CALL_IF(hipFreeAsync, (*ptr, stream)));
}

#define GIVEN_POOL(dev) ((void)(dev), (uint64_t)(uintptr_t)pool)
HCS_EXPORT hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream) {
    HIP_REAL_OR_FAIL(hipMallocFromPoolAsync);
    HCS_POOL_ALLOC(HCS_LIB_HIP, hipSuccess, hipErrorOutOfMemory, hip_device, GIVEN_POOL, size,
                   real(ptr, size, pool, stream), HCS_KEY_PTR(*ptr), HCS_CALL_IF(hipFreeAsync, (*ptr, stream)));
}

HCS_EXPORT hipError_t hipFree(void *ptr) {
    HIP_REAL_OR_FAIL(hipFree);
    HCS_FREE(hipSuccess, HCS_KEY_PTR(ptr), real(ptr));
}

HCS_EXPORT hipError_t hipFreeAsync(void *ptr, hipStream_t stream) {
    HIP_REAL_OR_FAIL(hipFreeAsync);
    HCS_FREE(hipSuccess, HCS_KEY_PTR(ptr), real(ptr, stream));
}

HCS_EXPORT hipError_t hipMemPoolTrimTo(hipMemPool_t pool, size_t minBytesToHold) {
    HIP_REAL_OR_FAIL(hipMemPoolTrimTo);
    hipError_t r = real(pool, minBytesToHold);
    if (r == hipSuccess && hcs_tracking()) hcs_pool_trimmed(HCS_LIB_HIP, (uint64_t)(uintptr_t)pool, minBytesToHold);
    return r;
}

HCS_EXPORT hipError_t hipMemPoolSetAttribute(hipMemPool_t pool, int attr, void *value) {
    HIP_REAL_OR_FAIL(hipMemPoolSetAttribute);
    hipError_t r = real(pool, attr, value);
    int dev;
    if (r == hipSuccess && attr == hipMemPoolAttrReleaseThreshold && value && hcs_tracking() && hip_device(&dev))
        hcs_pool_threshold(HCS_LIB_HIP, (uint64_t)(uintptr_t)pool, dev, *(uint64_t *)value);
    return r;
}

HCS_EXPORT hipError_t hipMemPoolDestroy(hipMemPool_t pool) {
    HIP_REAL_OR_FAIL(hipMemPoolDestroy);
    hipError_t r = real(pool);
    if (r == hipSuccess && hcs_tracking()) hcs_pool_trimmed(HCS_LIB_HIP, (uint64_t)(uintptr_t)pool, 0);
    return r;
}

static inline int hip_vmm_device(const hipMemAllocationProp *prop, int *dev) {
    if (!prop || prop->location.type != hipMemLocationTypeDevice) return 0;
    *dev = prop->location.id;
    return 1;
}

HCS_EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
                                   const hipMemAllocationProp *prop, unsigned long long flags) {
    HIP_REAL_OR_FAIL(hipMemCreate);
#define VMM_DEV(d) hip_vmm_device(prop, (d))
    HCS_VMM_CREATE(HCS_LIB_HIP, hipSuccess, hipErrorOutOfMemory, VMM_DEV, size, real(handle, size, prop, flags),
                   (uintptr_t)*handle, HCS_CALL_IF(hipMemRelease, (*handle)));
#undef VMM_DEV
}

HCS_EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
    HIP_REAL_OR_FAIL(hipMemRelease);
    hipError_t r = real(handle);
    if (r == hipSuccess && hcs_tracking()) hcs_vmm_released(HCS_LIB_HIP, (uint64_t)(uintptr_t)handle);
    return r;
}

HCS_EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
                                unsigned long long flags) {
    HIP_REAL_OR_FAIL(hipMemMap);
    hipError_t r = real(ptr, size, offset, handle, flags);
    if (r == hipSuccess && hcs_tracking())
        hcs_vmm_mapped(HCS_LIB_HIP, (uint64_t)(uintptr_t)ptr, size, (uint64_t)(uintptr_t)handle);
    return r;
}

HCS_EXPORT hipError_t hipMemUnmap(void *ptr, size_t size) {
    HIP_REAL_OR_FAIL(hipMemUnmap);
    hipError_t r = real(ptr, size);
    if (r == hipSuccess && hcs_tracking()) hcs_vmm_unmapped(HCS_LIB_HIP, (uint64_t)(uintptr_t)ptr, size);
    return r;
}

HCS_EXPORT hipError_t hipMemGetInfo(size_t *free, size_t *total) {
    HIP_REAL_OR_FAIL(hipMemGetInfo);
    hipError_t r = real(free, total);
    if (r == hipSuccess) HCS_MEMINFO(hip_device, free, total);
    return r;
}
