/* Stream-ordered allocation from the device's default pool. */
#include "escape.h"
int main(void) {
    setup();
    CUdeviceptr a, b;
    cuMemAllocAsync(&a, HALF, NULL);
    cuMemAllocAsync_ptsz(&b, HALF, NULL);
    result(NULL);
    return 0;
}
