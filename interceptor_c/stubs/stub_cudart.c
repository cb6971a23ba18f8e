/* Stub libcudart.so: like the real runtime (>= 11.3) it dlopens libcuda.so.1
 * and fetches every driver entry point through cuGetProcAddress. */
#include <dlfcn.h>
#include <pthread.h>

#include "stub.h"

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static struct {
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free)(CUdeviceptr);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*info)(size_t *, size_t *);
} drv;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ok;

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    gpa_v2_t gpa = (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) return;
    CUdriverProcAddressQueryResult st;
    ok = gpa("cuMemAlloc", (void **)&drv.alloc, 12000, 0, &st) == 0 &&
         gpa("cuMemAllocManaged", (void **)&drv.managed, 12000, 0, &st) == 0 &&
         gpa("cuMemAllocAsync", (void **)&drv.async, 12000, 0, &st) == 0 &&
         gpa("cuMemFree", (void **)&drv.free, 12000, 0, &st) == 0 &&
         gpa("cuMemFreeAsync", (void **)&drv.free_async, 12000, 0, &st) == 0 &&
         gpa("cuMemGetInfo", (void **)&drv.info, 12000, 0, &st) == 0;
}
#define LOAD()                                             \
    do {                                                   \
        pthread_once(&once, load);                         \
        if (!ok) return cudaErrorInitializationError;      \
    } while (0)

static cudaError_t rt(CUresult r) {
    return r == CUDA_SUCCESS ? cudaSuccess : r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation
                                                                           : cudaErrorInvalidValue;
}

cudaError_t cudaGetDevice(int *d) { *d = stub_get_device(); return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return stub_set_device(d) == STUB_OK ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaMalloc(void **p, size_t n) { LOAD(); return rt(drv.alloc((CUdeviceptr *)p, n)); }
cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int f) { LOAD(); return rt(drv.managed((CUdeviceptr *)p, n, f)); }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { LOAD(); return rt(drv.async((CUdeviceptr *)p, n, s)); }
cudaError_t cudaFree(void *p) {
    LOAD();
    if (!p) return cudaSuccess;
    return rt(drv.free((CUdeviceptr)(uintptr_t)p));
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { LOAD(); return rt(drv.free_async((CUdeviceptr)(uintptr_t)p, s)); }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) { LOAD(); return rt(drv.info(f, t)); }
