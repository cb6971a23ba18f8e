/* NVML memory info: the same quota view as cuMemGetInfo. */
#include "hcs.h"


/* NVML index -> visible CUDA ordinal (see CUDA_VISIBLE_DEVICES handling). */
static int nvml_ordinal(nvmlDevice_t device, int *dev) {
    __typeof__(&nvmlDeviceGetIndex) f = REAL(nvmlDeviceGetIndex);
    unsigned int idx;
    if (!f || f(device, &idx) != NVML_SUCCESS || idx >= 64 || hcs_g.nvml_map[idx] < 0) return 0;
    *dev = hcs_g.nvml_map[idx];
    return 1;
}

static void apply(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                  unsigned long long *used, unsigned long long *reserved) {
    int dev;
    uint64_t f, t;
    if (!hcs_tracking() || !nvml_ordinal(device, &dev) || !hcs_view(dev, *free, &f, &t)) return;
    *total = t;
    *free = f;
    *used = t - f; /* whatever the container cannot get is "used" */
    if (reserved) *reserved = 0;
}

HCS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    __typeof__(&nvmlDeviceGetMemoryInfo) real = REAL(nvmlDeviceGetMemoryInfo);
    if (!real) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real(device, memory);
    if (r == NVML_SUCCESS && memory) apply(device, &memory->total, &memory->free, &memory->used, NULL);
    return r;
}

HCS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) real = REAL(nvmlDeviceGetMemoryInfo_v2);
    if (!real) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = real(device, memory);
    if (r == NVML_SUCCESS && memory) apply(device, &memory->total, &memory->free, &memory->used, &memory->reserved);
    return r;
}
