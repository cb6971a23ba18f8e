/* Plain cuMemAlloc_v2, twice. */
#include "escape.h"
int main(void) {
    setup();
    CUdeviceptr a, b;
    cuMemAlloc_v2(&a, HALF);
    cuMemAlloc_v2(&b, HALF);
    result(NULL);
    return 0;
}
