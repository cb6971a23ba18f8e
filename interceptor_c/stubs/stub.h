/* Host-only stand-ins for vendor GPU libraries, used by tests and the bench.
 * Allocations get unique fake device addresses; bytes are tracked per device
 * against STUB_TOTAL_BYTES so the "physical" limit and peak are observable. */
#ifndef HCS_STUB_H
#define HCS_STUB_H
#include <stdint.h>
#include "../src/vendor.h"

#define STUB_OK 0
#define STUB_EINVAL 1
#define STUB_ENOMEM 2

int stub_alloc(uint64_t size, uint64_t *addr);          /* current device */
int stub_alloc_dev(int dev, uint64_t size, uint64_t *addr);
int stub_free(uint64_t addr);                            /* STUB_EINVAL if unknown */
void stub_meminfo(int dev, uint64_t *free, uint64_t *total);
int stub_get_device(void);
int stub_set_device(int dev);
int stub_device_count(void);
void stubGetStats(int dev, unsigned long long *used, unsigned long long *peak);
void stubResetPeak(int dev);
void stub_phys_add(int dev, int64_t delta); /* memory kept outside any address */
int stub_lookup(uint64_t addr, int *dev, uint64_t *size);
#endif
