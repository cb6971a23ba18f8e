/* NVIDIA's VMM sample: create, map, release the handle while mapped. */
#include "escape.h"
int main(void) {
    setup();
    CUmemAllocationProp p = device_prop(0);
    for (int i = 0; i < 2; i++) {
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        if (cuMemCreate(&h, HALF, &p, 0)) continue;
        cuMemAddressReserve(&va, HALF, 0, 0, 0);
        cuMemMap(va, HALF, 0, h, 0);
        cuMemRelease(h); /* the mapping keeps the memory */
    }
    result(NULL);
    return 0;
}
