/* Minimal vendor declarations (no vendor headers are needed or available).
 * Layouts and values follow the public headers: cuda.h, cuda_runtime_api.h,
 * nvml.h, acl/acl_rt.h, hip/hip_runtime_api.h, cnrt.h. */
#ifndef HCS_VENDOR_H
#define HCS_VENDOR_H
#include <stddef.h>
#include <stdint.h>

/* ---- CUDA driver ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUdriverProcAddressQueryResult;

typedef struct {
    size_t Width;
    size_t Height;
    int Format; /* CUarray_format */
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef unsigned int CUdeviceptr_v1; /* legacy 32-bit entry points */
typedef struct {
    unsigned int Width;
    unsigned int Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct {
    int allocType;   /* CUmemAllocationType */
    int handleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32SecurityAttributes;
    unsigned char reserved[64];
} CUmemPoolProps;
typedef struct {
    CUmemPoolProps poolProps;
    const void *accessDescs; /* const CUmemAccessDesc * */
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out; /* CUgraphInstantiateResult */
} CUDA_GRAPH_INSTANTIATE_PARAMS;

#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NOT_FOUND 500
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM (1ULL << 0)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1ULL << 1)
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* ---- CUDA runtime ---- */
typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
#define cudaSuccess 0
#define cudaErrorInvalidValue 1
#define cudaErrorMemoryAllocation 2
#define cudaErrorInitializationError 3

/* ---- NVML ---- */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* ---- Ascend ACL ---- */
typedef int aclError;
typedef int aclrtMemMallocPolicy;
typedef int aclrtMemAttr;
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_DDR_MEM 0
#define ACL_HBM_MEM 1
#define ACL_HBM_MEM_HUGE 4
#define ACL_HBM_MEM_NORMAL 5
#define ACL_HBM_MEM_P2P_HUGE 8
#define ACL_HBM_MEM_P2P_NORMAL 9

typedef void *aclrtDrvMemHandle;
typedef struct {
    int handleType;     /* aclrtMemHandleType */
    int allocationType; /* aclrtMemAllocationType */
    aclrtMemAttr memAttr;
    struct {
        uint32_t id;
        int type; /* aclrtMemLocationType: 1 = device */
    } location;
    uint64_t reserve;
} aclrtPhysicalMemProp;
#define ACL_MEM_LOCATION_TYPE_DEVICE 1

/* ---- HIP ---- */
typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipMemPoolHandle_t *hipMemPool_t;
typedef struct ihipMemGenericAllocationHandle *hipMemGenericAllocationHandle_t;
typedef CUmemAllocationProp hipMemAllocationProp; /* same layout */
typedef struct hipArray *hipArray_t;
typedef struct {
    int x, y, z, w; /* bits per channel */
    int f;          /* hipChannelFormatKind */
} hipChannelFormatDesc;
#define hipMemPoolAttrReleaseThreshold 4
#define hipMemLocationTypeDevice 1
#define hipSuccess 0
#define hipErrorInvalidValue 1
#define hipErrorOutOfMemory 2 /* == hipErrorMemoryAllocation */
#define hipErrorNotInitialized 3

/* ---- Cambricon CNRT ---- */
typedef int cnrtRet_t;
typedef struct CNqueue_st *cnrtQueue_t;
typedef struct CNmemPool_st *cnrtMemPool_t;
#define cnrtMemPoolAttrReleaseThreshold 4
#define cnrtSuccess 0
#define cnrtErrorArgsInvalid 100002 /* stubs only */
#define cnrtErrorNoDevice 100004
#define cnrtErrorNoMem 100100     /* CNRT >= 5 (cnrtRet_t == cnrtError_t) */
#define CNRT_RET_ERR_NOMEM 632008 /* legacy CNRT 4.x */

/* ---- prototypes (real signatures) ---- */
#ifndef HCS_VENDOR_API
#define HCS_VENDOR_API
#endif
#define V HCS_VENDOR_API
V CUresult cuInit(unsigned int flags);
V CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
V CUresult cuCtxSetCurrent(CUcontext ctx);
V CUresult cuCtxGetDevice(CUdevice *device);
V CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
V CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
V CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
V CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
V CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
V CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
V CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                              unsigned int ElementSizeBytes);
V CUresult cuMemFree_v2(CUdeviceptr dptr);
V CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
V CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
V CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
V CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                       unsigned long long flags);
V CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
V CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
V CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
V CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                  unsigned int numMipmapLevels);
V CUresult cuArrayDestroy(CUarray hArray);
V CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);
V CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
V CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                               CUdriverProcAddressQueryResult *symbolStatus);
V CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
V CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
                           unsigned int ElementSizeBytes);
V CUresult cuMemFree(CUdeviceptr_v1 dptr);
V CUresult cuMemGetInfo(unsigned int *free, unsigned int *total);
V CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray);
V CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray);
V CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                    unsigned long long flags);
V CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
V CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                               unsigned long long flags);
V CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
V CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
V CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
V CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
V CUresult cuMemPoolDestroy(CUmemoryPool pool);
V CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value);
V CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
V CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
V CUresult cuGraphDestroy(CUgraph hGraph);
V CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
V CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                              size_t bufferSize);
V CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                 char *logBuffer, size_t bufferSize);
V CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
V CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
V CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
V cudaError_t cudaGetDevice(int *device);
V cudaError_t cudaMalloc(void **devPtr, size_t size);
V cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
V cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
V cudaError_t cudaFree(void *devPtr);
V cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream);
V cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
V nvmlReturn_t nvmlInit_v2(void);
V nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
V nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
V nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
V nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
V aclError aclrtSetDevice(int32_t deviceId);
V aclError aclrtGetDevice(int32_t *deviceId);
V aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
V aclError aclrtFree(void *devPtr);
V aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);
V aclError aclrtMallocCached(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
V aclError aclrtMallocAlign32(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
V aclError aclrtMallocWithCfg(void **devPtr, size_t size, aclrtMemMallocPolicy policy, void *cfg);
V aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                               uint64_t flags);
V aclError aclrtFreePhysical(aclrtDrvMemHandle handle);
V aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags);
V aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags);
V aclError aclrtUnmapMem(void *virPtr);
V hipError_t hipMallocManaged(void **ptr, size_t size, unsigned int flags);
V hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned int flags);
V hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream);
V hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, hipMemPool_t pool, hipStream_t stream);
V hipError_t hipFreeAsync(void *ptr, hipStream_t stream);
V hipError_t hipDeviceGetMemPool(hipMemPool_t *pool, int device);
V hipError_t hipMemPoolTrimTo(hipMemPool_t pool, size_t minBytesToHold);
V hipError_t hipMemPoolSetAttribute(hipMemPool_t pool, int attr, void *value);
V hipError_t hipMemPoolDestroy(hipMemPool_t pool);
V hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height);
V hipError_t hipMemAllocPitch(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes, size_t height,
                              unsigned int elementSizeBytes);
V hipError_t hipMallocArray(hipArray_t *array, const hipChannelFormatDesc *desc, size_t width, size_t height,
                            unsigned int flags);
V hipError_t hipFreeArray(hipArray_t array);
V hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop,
                          unsigned long long flags);
V hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle);
V hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr, unsigned long long flags);
V hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
                       unsigned long long flags);
V hipError_t hipMemUnmap(void *ptr, size_t size);
V cnrtRet_t cnrtMallocConstant(void **pPtr, size_t bytes);
V cnrtRet_t cnrtMemAllocAsync(void **pPtr, size_t bytes, cnrtQueue_t queue);
V cnrtRet_t cnrtMemFreeAsync(void *ptr, cnrtQueue_t queue);
V cnrtRet_t cnrtDeviceGetMemPool(cnrtMemPool_t *pool, int dev);
V cnrtRet_t cnrtMemPoolTrimTo(cnrtMemPool_t pool, size_t minBytesToKeep);
V cnrtRet_t cnrtMemPoolSetAttribute(cnrtMemPool_t pool, int attr, void *value);
V hipError_t hipSetDevice(int deviceId);
V hipError_t hipGetDevice(int *deviceId);
V hipError_t hipMalloc(void **ptr, size_t size);
V hipError_t hipFree(void *ptr);
V hipError_t hipMemGetInfo(size_t *free, size_t *total);
V cnrtRet_t cnrtSetDevice(int dev);
V cnrtRet_t cnrtGetDevice(int *dev);
V cnrtRet_t cnrtGetLibVersion(int *major, int *minor, int *patch);
V cnrtRet_t cnrtMalloc(void **pPtr, size_t bytes);
V cnrtRet_t cnrtFree(void *ptr);
V cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total);
#undef V

#endif
