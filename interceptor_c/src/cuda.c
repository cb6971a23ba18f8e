/* CUDA driver API hooks, including cuGetProcAddress. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "hcs.h"


#define CUDA_REAL_OR_FAIL(name)                                  \
    __typeof__(&name) real = REAL(name);                         \
    if (HCS_UNLIKELY(!real)) return CUDA_ERROR_NOT_INITIALIZED

static inline int cuda_device(int *dev) {
    __typeof__(&cuCtxGetDevice) f = REAL(cuCtxGetDevice);
    CUdevice d;
    if (HCS_UNLIKELY(!f) || f(&d) != CUDA_SUCCESS) return 0;
    *dev = d;
    return 1;
}

static inline uint64_t mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t nz(uint64_t v) { return v ? v : 1; }

static uint64_t elem_size(int format) {
    switch (format) {
    case 0x01: case 0x08: return 1; /* (UN)SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2; /* INT16, HALF */
    case 0x03: case 0x0a: case 0x20: return 4; /* INT32, FLOAT */
    default: return 4; /* newer formats: a conservative estimate */
    }
}

static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t texel = mul_sat(elem_size(d->Format), nz(d->NumChannels)), total = 0;
    for (unsigned l = 0; l < nz(levels) && l < 64; l++) {
        uint64_t w = nz(d->Width >> l), h = d->Height ? nz(d->Height >> l) : 1, z = d->Depth ? nz(d->Depth >> l) : 1;
        uint64_t b = mul_sat(mul_sat(mul_sat(w, h), z), texel);
        total = total > UINT64_MAX - b ? UINT64_MAX : total + b;
    }
    return total;
}

/* ------------------------------------------------------------ alloc --- */
HCS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUDA_REAL_OR_FAIL(cuMemAlloc_v2);
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytesize, real(dptr, bytesize),
              HCS_KEY_PTR(*dptr), HCS_CALL_IF(cuMemFree_v2, (*dptr)));
}

HCS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    CUDA_REAL_OR_FAIL(cuMemAllocManaged);
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytesize, real(dptr, bytesize, flags),
              HCS_KEY_PTR(*dptr), HCS_CALL_IF(cuMemFree_v2, (*dptr)));
}

/* The pool cuMemAllocAsync draws from: the device's current pool. */
static inline uint64_t cuda_current_pool(int dev) {
    __typeof__(&cuDeviceGetMemPool) f = REAL(cuDeviceGetMemPool);
    CUmemoryPool pool = NULL;
    if (!f || f(&pool, dev) != CUDA_SUCCESS) return 0;
    return (uint64_t)(uintptr_t)pool;
}

HCS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    CUDA_REAL_OR_FAIL(cuMemAllocAsync);
    HCS_POOL_ALLOC(HCS_LIB_CUDA, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, cuda_current_pool, bytesize,
                   real(dptr, bytesize, hStream), HCS_KEY_PTR(*dptr), HCS_CALL_IF(cuMemFreeAsync, (*dptr, hStream)));
}

HCS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    CUDA_REAL_OR_FAIL(cuMemAllocAsync_ptsz);
    HCS_POOL_ALLOC(HCS_LIB_CUDA, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, cuda_current_pool, bytesize,
                   real(dptr, bytesize, hStream), HCS_KEY_PTR(*dptr),
                   HCS_CALL_IF(cuMemFreeAsync_ptsz, (*dptr, hStream)));
}

#define GIVEN_POOL(dev) ((void)(dev), (uint64_t)(uintptr_t)pool)
HCS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    CUDA_REAL_OR_FAIL(cuMemAllocFromPoolAsync);
    HCS_POOL_ALLOC(HCS_LIB_CUDA, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, GIVEN_POOL, bytesize,
                   real(dptr, bytesize, pool, hStream), HCS_KEY_PTR(*dptr),
                   HCS_CALL_IF(cuMemFreeAsync, (*dptr, hStream)));
}

HCS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream) {
    CUDA_REAL_OR_FAIL(cuMemAllocFromPoolAsync_ptsz);
    HCS_POOL_ALLOC(HCS_LIB_CUDA, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, GIVEN_POOL, bytesize,
                   real(dptr, bytesize, pool, hStream), HCS_KEY_PTR(*dptr),
                   HCS_CALL_IF(cuMemFreeAsync_ptsz, (*dptr, hStream)));
}

HCS_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    CUDA_REAL_OR_FAIL(cuMemPoolTrimTo);
    CUresult r = real(pool, minBytesToKeep);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_pool_trimmed(HCS_LIB_CUDA, (uint64_t)(uintptr_t)pool, minBytesToKeep);
    return r;
}

HCS_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    CUDA_REAL_OR_FAIL(cuMemPoolSetAttribute);
    CUresult r = real(pool, attr, value);
    int dev;
    if (r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && value && hcs_tracking() && cuda_device(&dev))
        hcs_pool_threshold(HCS_LIB_CUDA, (uint64_t)(uintptr_t)pool, dev, *(cuuint64_t *)value);
    return r;
}

HCS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CUDA_REAL_OR_FAIL(cuMemPoolDestroy);
    CUresult r = real(pool);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_pool_trimmed(HCS_LIB_CUDA, (uint64_t)(uintptr_t)pool, 0);
    return r;
}

#define PITCH_ALLOC(call, width, height, pitchp, key, undo) \
    HCS_PITCH_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, call, width, height, pitchp, key, undo)

HCS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                       unsigned int ElementSizeBytes) {
    CUDA_REAL_OR_FAIL(cuMemAllocPitch_v2);
    PITCH_ALLOC(real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes), WidthInBytes, Height, pPitch,
                HCS_KEY_PTR(*dptr), HCS_CALL_IF(cuMemFree_v2, (*dptr)));
}

/* ------------------------------------------- legacy (v1) entry points --- */
HCS_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CUDA_REAL_OR_FAIL(cuMemAlloc);
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytesize, real(dptr, bytesize),
              HCS_KEY_PTR(*dptr), HCS_CALL_IF(cuMemFree, (*dptr)));
}

HCS_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                    unsigned int Height, unsigned int ElementSizeBytes) {
    CUDA_REAL_OR_FAIL(cuMemAllocPitch);
    PITCH_ALLOC(real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes), WidthInBytes, Height, pPitch,
                HCS_KEY_PTR(*dptr), HCS_CALL_IF(cuMemFree, (*dptr)));
}

HCS_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    CUDA_REAL_OR_FAIL(cuMemFree);
    HCS_FREE(CUDA_SUCCESS, HCS_KEY_PTR(dptr), real(dptr));
}

HCS_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) {
    CUDA_REAL_OR_FAIL(cuMemGetInfo);
    CUresult r = real(free, total);
    int dev;
    uint64_t f, t;
    if (r == CUDA_SUCCESS && free && total && hcs_tracking() && cuda_device(&dev) && hcs_view(dev, *free, &f, &t)) {
        *free = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
        *total = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
    }
    return r;
}

HCS_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    CUDA_REAL_OR_FAIL(cuArrayCreate);
    uint64_t bytes = 0;
    if (desc) {
        CUDA_ARRAY3D_DESCRIPTOR d3 = {desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0};
        bytes = array3d_bytes(&d3, 1);
    }
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytes, real(pHandle, desc),
              HCS_KEY_ARRAY(*pHandle), HCS_CALL_IF(cuArrayDestroy, (*pHandle)));
}

HCS_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    CUDA_REAL_OR_FAIL(cuArray3DCreate);
    uint64_t bytes = 0;
    if (desc) {
        CUDA_ARRAY3D_DESCRIPTOR d3 = {desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 0};
        bytes = array3d_bytes(&d3, 1);
    }
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytes, real(pHandle, desc),
              HCS_KEY_ARRAY(*pHandle), HCS_CALL_IF(cuArrayDestroy, (*pHandle)));
}

static inline int vmm_device(const CUmemAllocationProp *prop, int *dev) {
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return 0;
    *dev = prop->location.id;
    return 1;
}

HCS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                unsigned long long flags) {
    CUDA_REAL_OR_FAIL(cuMemCreate);
#define VMM_DEV(d) vmm_device(prop, (d))
    HCS_VMM_CREATE(HCS_LIB_CUDA, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, VMM_DEV, size,
                   real(handle, size, prop, flags), *handle, HCS_CALL_IF(cuMemRelease, (*handle)));
#undef VMM_DEV
}

/* The memory of a handle stays allocated while it is mapped: it is refunded
 * when the handle is released and its last mapping is gone. */
HCS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUDA_REAL_OR_FAIL(cuMemRelease);
    CUresult r = real(handle);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_vmm_released(HCS_LIB_CUDA, handle);
    return r;
}

HCS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                             unsigned long long flags) {
    CUDA_REAL_OR_FAIL(cuMemMap);
    CUresult r = real(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_vmm_mapped(HCS_LIB_CUDA, ptr, size, handle);
    return r;
}

HCS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUDA_REAL_OR_FAIL(cuMemUnmap);
    CUresult r = real(ptr, size);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_vmm_unmapped(HCS_LIB_CUDA, ptr, size);
    return r;
}

/* ------------------------------------------------------ graph memory --- */
HCS_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                           size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    CUDA_REAL_OR_FAIL(cuGraphAddMemAllocNode);
    CUresult r = real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (r == CUDA_SUCCESS && nodeParams && hcs_tracking() &&
        nodeParams->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        hcs_graph_alloc_node((uint64_t)(uintptr_t)hGraph, nodeParams->poolProps.location.id, nodeParams->bytesize);
    return r;
}

HCS_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
    CUDA_REAL_OR_FAIL(cuGraphDestroy);
    CUresult r = real(hGraph);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_graph_destroyed((uint64_t)(uintptr_t)hGraph);
    return r;
}

/* Graph memory is charged when the graph is instantiated. */
#define GRAPH_INSTANTIATE(call, pexec, graph)                                  \
    do {                                                                       \
        uint64_t ch_[HCS_MAX_DEVICES];                                         \
        if (!hcs_tracking() || !(pexec)) return (call);                        \
        if (hcs_graph_charge((uint64_t)(uintptr_t)(graph), ch_) < 0)          \
            return CUDA_ERROR_OUT_OF_MEMORY;                                   \
        CUresult r_ = (call);                                                  \
        if (r_ != CUDA_SUCCESS) hcs_graph_uncharge(ch_);                       \
        else hcs_graph_instantiated((uint64_t)(uintptr_t)*(pexec), ch_);       \
        return r_;                                                             \
    } while (0)

HCS_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize) {
    CUDA_REAL_OR_FAIL(cuGraphInstantiate);
    GRAPH_INSTANTIATE(real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize), phGraphExec, hGraph);
}

HCS_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                          char *logBuffer, size_t bufferSize) {
    CUDA_REAL_OR_FAIL(cuGraphInstantiate_v2);
    GRAPH_INSTANTIATE(real(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize), phGraphExec, hGraph);
}

HCS_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    CUDA_REAL_OR_FAIL(cuGraphInstantiateWithFlags);
    GRAPH_INSTANTIATE(real(phGraphExec, hGraph, flags), phGraphExec, hGraph);
}

HCS_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                 CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    CUDA_REAL_OR_FAIL(cuGraphInstantiateWithParams);
    GRAPH_INSTANTIATE(real(phGraphExec, hGraph, instantiateParams), phGraphExec, hGraph);
}

HCS_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CUDA_REAL_OR_FAIL(cuGraphExecDestroy);
    CUresult r = real(hGraphExec);
    if (r == CUDA_SUCCESS && hcs_tracking()) hcs_graph_exec_destroyed((uint64_t)(uintptr_t)hGraphExec);
    return r;
}

HCS_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    CUDA_REAL_OR_FAIL(cuArrayCreate_v2);
    uint64_t bytes = 0;
    if (desc) {
        CUDA_ARRAY3D_DESCRIPTOR d3 = {desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0};
        bytes = array3d_bytes(&d3, 1);
    }
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytes, real(pHandle, desc),
              HCS_KEY_ARRAY(*pHandle), HCS_CALL_IF(cuArrayDestroy, (*pHandle)));
}

HCS_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    CUDA_REAL_OR_FAIL(cuArray3DCreate_v2);
    uint64_t bytes = desc ? array3d_bytes(desc, 1) : 0;
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytes, real(pHandle, desc),
              HCS_KEY_ARRAY(*pHandle), HCS_CALL_IF(cuArrayDestroy, (*pHandle)));
}

HCS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                           unsigned int numMipmapLevels) {
    CUDA_REAL_OR_FAIL(cuMipmappedArrayCreate);
    uint64_t bytes = desc ? array3d_bytes(desc, numMipmapLevels) : 0;
    HCS_ALLOC(CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, cuda_device, bytes, real(pHandle, desc, numMipmapLevels),
              HCS_KEY_MIPMAP(*pHandle), HCS_CALL_IF(cuMipmappedArrayDestroy, (*pHandle)));
}

/* ------------------------------------------------------------- free --- */
HCS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUDA_REAL_OR_FAIL(cuMemFree_v2);
    HCS_FREE(CUDA_SUCCESS, HCS_KEY_PTR(dptr), real(dptr));
}

HCS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    CUDA_REAL_OR_FAIL(cuMemFreeAsync);
    HCS_FREE(CUDA_SUCCESS, HCS_KEY_PTR(dptr), real(dptr, hStream));
}

HCS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    CUDA_REAL_OR_FAIL(cuMemFreeAsync_ptsz);
    HCS_FREE(CUDA_SUCCESS, HCS_KEY_PTR(dptr), real(dptr, hStream));
}

HCS_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
    CUDA_REAL_OR_FAIL(cuArrayDestroy);
    HCS_FREE(CUDA_SUCCESS, HCS_KEY_ARRAY(hArray), real(hArray));
}

HCS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hArray) {
    CUDA_REAL_OR_FAIL(cuMipmappedArrayDestroy);
    HCS_FREE(CUDA_SUCCESS, HCS_KEY_MIPMAP(hArray), real(hArray));
}

/* ---------------------------------------------------------- meminfo --- */
HCS_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    CUDA_REAL_OR_FAIL(cuMemGetInfo_v2);
    CUresult r = real(free, total);
    if (r == CUDA_SUCCESS) HCS_MEMINFO(cuda_device, free, total);
    return r;
}

/* ---------------------------------------------------- cuGetProcAddress --- */
/* "" | _vN | _ptsz | _ptds | _vN_ptsz ... */
static int parse_suffix(const char *s, int *ver, int *ptsz) {
    *ver = 1;
    *ptsz = 0;
    if (s[0] == '_' && s[1] == 'v' && isdigit((unsigned char)s[2])) {
        *ver = atoi(s + 2);
        s += 2;
        while (isdigit((unsigned char)*s)) s++;
    }
    if (!strcmp(s, "_ptsz") || !strcmp(s, "_ptds")) {
        *ptsz = 1;
        s += 5;
    }
    return *s == 0;
}

/* Map a driver entry point handed out by cuGetProcAddress to our wrapper.
 * First by identity with the exported real symbol of every candidate
 * (symbol + version/stream suffix); failing that, by the suffix the driver
 * would pick for (cudaVersion, flags). */
void *hcs_cuda_wrap_proc(const char *symbol, void *pfn, int cuda_version, cuuint64_t flags) {
    if (hcs_mode() != HCS_MODE_ENFORCE) return pfn;
    /* From CUDA 12, cuGraphInstantiate is cuGraphInstantiateWithFlags. */
    if (cuda_version >= 12000 && !strcmp(symbol, "cuGraphInstantiate")) symbol = "cuGraphInstantiateWithFlags";
    size_t n = strlen(symbol);
    int exact = -1, best = -1, best_ver = 0;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (int i = 0; i < HK_COUNT; i++) {
        const struct hcs_sym_info *s = &hcs_syms[i];
        int ver, ptsz;
        if (s->lib != HCS_LIB_CUDA || !s->wrapper || strncmp(s->name, symbol, n) != 0) continue;
        if (!parse_suffix(s->name + n, &ver, &ptsz)) continue;
        if (pfn == s->wrapper) return pfn;
        if (hcs_real(i) == pfn) {
            exact = i;
            break;
        }
        int min_version = ver < 2 ? 0 : (!strcmp(symbol, "cuGetProcAddress") ? 12000 : 3020);
        if (ptsz != want_ptsz || cuda_version < min_version) continue;
        if (ver > best_ver) {
            best = i;
            best_ver = ver;
        }
    }
    int i = exact >= 0 ? exact : best;
    if (i < 0) return pfn;
    if (exact < 0) {
        hcs_learn_real(i, pfn);
        HCS_LOG(HCS_LOG_DEBUG, "cuGetProcAddress(%s, %d, %llu): wrapped as %s by suffix", symbol, cuda_version,
                (unsigned long long)flags, hcs_syms[i].name);
    }
    return hcs_syms[i].wrapper;
}

HCS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    CUDA_REAL_OR_FAIL(cuGetProcAddress);
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = hcs_cuda_wrap_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

HCS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus) {
    CUDA_REAL_OR_FAIL(cuGetProcAddress_v2);
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = hcs_cuda_wrap_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}
