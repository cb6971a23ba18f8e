/* CNRT: every allocator, 768 MiB each; at most one fits. */
#include "escape.h"
int main(void) {
    setup();
    void *p[3];
    cnrtMalloc(&p[0], HALF);
    cnrtMallocConstant(&p[1], HALF);
    cnrtMemAllocAsync(&p[2], HALF, NULL);
    result(NULL);
    return 0;
}
