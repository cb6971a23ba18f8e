/* Managed memory. */
#include "escape.h"
int main(void) {
    setup();
    CUdeviceptr a, b;
    cuMemAllocManaged(&a, HALF, 1);
    cuMemAllocManaged(&b, HALF, 1);
    result(NULL);
    return 0;
}
