/* dlopen the driver and look the entry point up by name. */
#include "escape.h"
int main(void) {
    setup();
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    CUdeviceptr a, b;
    alloc(&a, HALF);
    alloc(&b, HALF);
    result(NULL);
    return 0;
}
