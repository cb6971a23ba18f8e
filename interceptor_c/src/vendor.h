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

/* ---- HIP ---- */
typedef int hipError_t;
#define hipSuccess 0
#define hipErrorInvalidValue 1
#define hipErrorOutOfMemory 2 /* == hipErrorMemoryAllocation */
#define hipErrorNotInitialized 3

/* ---- Cambricon CNRT ---- */
typedef int cnrtRet_t;
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
