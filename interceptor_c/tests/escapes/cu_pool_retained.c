/* A pool that keeps freed memory (release threshold at the maximum): the
 * memory is still the device's after cuMemFreeAsync. */
#include "escape.h"
int main(void) {
    setup();
    CUmemoryPool pool;
    cuDeviceGetMemPool(&pool, 0);
    cuuint64_t keep = ~0ULL;
    cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
    CUdeviceptr a, b;
    cuMemAllocFromPoolAsync(&a, HALF, pool, NULL);
    cuMemFreeAsync(a, NULL);
    int rc = cuMemAlloc_v2(&b, HALF);
    char extra[32];
    snprintf(extra, sizeof extra, "second=%d", rc);
    result(extra);
    return 0;
}
