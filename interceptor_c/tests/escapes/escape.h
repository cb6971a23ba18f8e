/* Shared by the escape programs: each one tries to hold more device memory
 * than HCS_VRAM_QUOTA through one path, then prints one line for the test:
 *   result peak=<most the driver ever held> held=<held now> seen=<used in the
 *   quota view> quota=<quota> [k=v ...]
 * Blocked: peak <= quota. Counted: seen >= held (what the driver holds
 * shows in the ledger). */
#ifndef HCS_ESCAPE_H
#define HCS_ESCAPE_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../stubs/stub.h"

#define MiB (1ULL << 20)
#define HALF (768 * MiB) /* two of these do not fit a 1 GiB quota */

static inline void setup(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuInit(0);
}

static inline void result(const char *extra) {
    unsigned long long held, peak;
    size_t f = 0, t = 0;
    stubGetStats(0, &held, &peak);
    cuMemGetInfo_v2(&f, &t);
    printf("result peak=%llu held=%llu seen=%llu quota=%zu %s\n", peak, held, (unsigned long long)(t - f), t,
           extra ? extra : "");
}

static inline CUmemAllocationProp device_prop(int dev) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = 1;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}
#endif
