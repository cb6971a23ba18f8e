/* Stub libnvidia-ml.so.1: same physical numbers as the stub driver. */
#include "stub.h"

struct nvmlDevice_st { unsigned int index; };
static struct nvmlDevice_st devs[16];

nvmlReturn_t nvmlInit_v2(void) {
    for (unsigned i = 0; i < 16; i++) devs[i].index = i;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = (unsigned)stub_device_count(); return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= (unsigned)stub_device_count() || !d) return NVML_ERROR_INVALID_ARGUMENT;
    devs[i].index = i;
    *d = &devs[i];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    if (!d || !i) return NVML_ERROR_INVALID_ARGUMENT;
    *i = d->index;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    uint64_t f, t;
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    stub_meminfo((int)d->index, &f, &t);
    m->total = t;
    m->free = f;
    m->used = t - f;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    uint64_t f, t;
    if (!d || !m || m->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
    stub_meminfo((int)d->index, &f, &t);
    m->total = t;
    m->free = f;
    m->reserved = 0;
    m->used = t - f;
    return NVML_SUCCESS;
}
