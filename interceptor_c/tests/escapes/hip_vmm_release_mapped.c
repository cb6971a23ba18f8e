/* HIP VMM: create, map, release while mapped; then allocate again. */
#include "escape.h"
int main(void) {
    setup();
    hipMemAllocationProp p = device_prop(0);
    hipMemGenericAllocationHandle_t h;
    void *va, *b;
    hipMemCreate(&h, HALF, &p, 0);
    hipMemAddressReserve(&va, HALF, 0, NULL, 0);
    hipMemMap(va, HALF, 0, h, 0);
    hipMemRelease(h);
    int rc = hipMalloc(&b, HALF);
    char extra[32];
    snprintf(extra, sizeof extra, "second=%d", rc);
    result(extra);
    return 0;
}
