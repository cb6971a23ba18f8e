/* The legacy 32-bit cuMemAlloc (v1). */
#include "escape.h"
int main(void) {
    setup();
    CUdeviceptr_v1 a, b;
    cuMemAlloc(&a, (unsigned)HALF);
    cuMemAlloc(&b, (unsigned)HALF);
    result(NULL);
    return 0;
}
