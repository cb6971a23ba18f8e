/* HIP: every allocator, 768 MiB each; at most one fits. */
#include "escape.h"
int main(void) {
    setup();
    void *p[6];
    hipMalloc(&p[0], HALF);
    hipMallocManaged(&p[1], HALF, 1);
    hipExtMallocWithFlags(&p[2], HALF, 0);
    hipMallocAsync(&p[3], HALF, NULL);
    size_t pitch;
    hipMallocPitch(&p[4], &pitch, 65536, 12288);
    hipChannelFormatDesc d = {32, 0, 0, 0, 2};
    hipMallocArray((hipArray_t *)&p[5], &d, 16384, 12288, 0);
    result(NULL);
    return 0;
}
