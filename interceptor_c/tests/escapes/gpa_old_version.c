/* cuGetProcAddress asked for CUDA 3.0: the driver hands out the v1 entry. */
#include "escape.h"
int main(void) {
    setup();
    CUresult (*alloc)(CUdeviceptr_v1 *, unsigned int) = NULL;
    cuGetProcAddress("cuMemAlloc", (void **)&alloc, 3000, 0);
    CUdeviceptr_v1 a, b;
    alloc(&a, (unsigned)HALF);
    alloc(&b, (unsigned)HALF);
    result(NULL);
    return 0;
}
