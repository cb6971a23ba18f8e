/* CUDA runtime API hooks (dynamically linked libcudart). The runtime calls
 * the driver through cuGetProcAddress, i.e. through our driver wrappers; a
 * thread-local depth keeps those nested calls from being charged twice.
 * Stream-ordered (pool) allocations are left to the driver hooks, which
 * know the pools: cudaMallocAsync and cudaFreeAsync are not wrapped. */
#include "hcs.h"


static inline int rt_device(int *dev) {
    __typeof__(&cudaGetDevice) f = REAL(cudaGetDevice);
    return f && f(dev) == cudaSuccess;
}

#define RT_REAL_OR_FAIL(name)                                    \
    __typeof__(&name) real = REAL(name);                         \
    if (HCS_UNLIKELY(!real)) return cudaErrorInitializationError

/* Run the real runtime call with driver-level tracking suspended. */
#define NESTED(expr) (hcs_rt_depth++, nested_tmp_ = (expr), hcs_rt_depth--, nested_tmp_)

HCS_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
    RT_REAL_OR_FAIL(cudaMalloc);
    cudaError_t nested_tmp_;
    HCS_ALLOC(cudaSuccess, cudaErrorMemoryAllocation, rt_device, size, NESTED(real(devPtr, size)),
              HCS_KEY_PTR(*devPtr), HCS_CALL_IF(cudaFree, (*devPtr)));
}

HCS_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    RT_REAL_OR_FAIL(cudaMallocManaged);
    cudaError_t nested_tmp_;
    HCS_ALLOC(cudaSuccess, cudaErrorMemoryAllocation, rt_device, size, NESTED(real(devPtr, size, flags)),
              HCS_KEY_PTR(*devPtr), HCS_CALL_IF(cudaFree, (*devPtr)));
}

HCS_EXPORT cudaError_t cudaFree(void *devPtr) {
    RT_REAL_OR_FAIL(cudaFree);
    cudaError_t nested_tmp_;
    HCS_FREE(cudaSuccess, HCS_KEY_PTR(devPtr), NESTED(real(devPtr)));
}

HCS_EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    RT_REAL_OR_FAIL(cudaMemGetInfo);
    cudaError_t nested_tmp_;
    cudaError_t r = NESTED(real(free, total));
    if (r == cudaSuccess) HCS_MEMINFO(rt_device, free, total);
    return r;
}
