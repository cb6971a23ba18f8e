/* Pitched allocation: charged by the pitch the driver picks, not the width. */
#include "escape.h"
int main(void) {
    setup();
    setenv("STUB_PITCH_ALIGN", "65536", 1); /* 1-byte rows become 64 KiB rows */
    CUdeviceptr a;
    size_t pitch;
    cuMemAllocPitch_v2(&a, &pitch, 4, 16384, 4); /* 16384 x 64 KiB = 1 GiB */
    CUdeviceptr b;
    cuMemAlloc_v2(&b, 256 * MiB);
    result(NULL);
    return 0;
}
