/* ACL: every allocator, 768 MiB each; at most one fits. */
#include "escape.h"
int main(void) {
    setup();
    void *p[4];
    aclrtMalloc(&p[0], HALF, 0);
    aclrtMallocCached(&p[1], HALF, 0);
    aclrtMallocAlign32(&p[2], HALF, 0);
    aclrtMallocWithCfg(&p[3], HALF, 0, NULL);
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof prop);
    prop.memAttr = ACL_HBM_MEM_HUGE;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    aclrtDrvMemHandle h;
    aclrtMallocPhysical(&h, HALF, &prop, 0);
    result(NULL);
    return 0;
}
