/* A driver whose cuGetProcAddress hands out internal entry points. */
#include "escape.h"
int main(void) {
    setenv("STUB_GPA_INDIRECT", "1", 1);
    setup();
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, NULL);
    CUdeviceptr a, b;
    alloc(&a, HALF);
    alloc(&b, HALF);
    result(NULL);
    return 0;
}
