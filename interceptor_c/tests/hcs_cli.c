/* Scenario runner for the tests: links every stub vendor library directly
 * (the "linked application" path) and executes the operations given on the
 * command line, printing one line per operation: "<op> rc=<n> [k=v ...]". */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../stubs/stub.h"

enum kind { K_CU, K_CU_ASYNC, K_CU_ASYNC_PTSZ, K_VMM, K_ARRAY, K_MIPMAP, K_RT, K_RT_ASYNC, K_ACL, K_HIP, K_CNRT, K_G, K_G_ASYNC,
            K_V1, K_MAP, K_GEXEC, K_G1, K_HIP_ASYNC, K_HIP_ARRAY, K_HIP_MAP, K_ACL_MAP, K_CNRT_ASYNC };
struct handle { enum kind kind; uint64_t v; uint64_t size; };
static CUgraph graph;
static struct {
    CUresult (*alloc)(CUdeviceptr_v1 *, unsigned int);
    CUresult (*free)(CUdeviceptr_v1);
    CUresult (*info)(unsigned int *, unsigned int *);
} g1;
static struct handle handles[4096];
static int nhandles;

static struct {
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
} g;

static uint64_t num(const char *s) {
    char *e;
    uint64_t v = strtoull(s, &e, 0);
    if (!strcmp(e, "Ki")) v <<= 10;
    else if (!strcmp(e, "Mi")) v <<= 20;
    else if (!strcmp(e, "Gi")) v <<= 30;
    else if (!strcmp(e, "Ti")) v <<= 40;
    else if (*e) {
        fprintf(stderr, "bad number %s\n", s);
        exit(2);
    }
    return v;
}

static void push(int rc, enum kind k, uint64_t v) {
    if (rc == 0 && nhandles < 4096) handles[nhandles++] = (struct handle){k, v, 0};
}

static int release(struct handle h) {
    switch (h.kind) {
    case K_CU: return cuMemFree_v2(h.v);
    case K_CU_ASYNC: return cuMemFreeAsync(h.v, NULL);
    case K_CU_ASYNC_PTSZ: return cuMemFreeAsync_ptsz(h.v, NULL);
    case K_VMM: return cuMemRelease(h.v);
    case K_ARRAY: return cuArrayDestroy((CUarray)(uintptr_t)h.v);
    case K_MIPMAP: return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h.v);
    case K_RT: return cudaFree((void *)(uintptr_t)h.v);
    case K_RT_ASYNC: return cudaFreeAsync((void *)(uintptr_t)h.v, NULL);
    case K_ACL: return aclrtFree((void *)(uintptr_t)h.v);
    case K_HIP: return hipFree((void *)(uintptr_t)h.v);
    case K_CNRT: return cnrtFree((void *)(uintptr_t)h.v);
    case K_G: return g.free(h.v);
    case K_G_ASYNC: return g.free_async(h.v, NULL);
    case K_V1: return cuMemFree((CUdeviceptr_v1)h.v);
    case K_MAP: return cuMemUnmap(h.v, h.size);
    case K_GEXEC: return cuGraphExecDestroy((CUgraphExec)(uintptr_t)h.v);
    case K_G1: return g1.free((CUdeviceptr_v1)h.v);
    case K_HIP_ASYNC: return hipFreeAsync((void *)(uintptr_t)h.v, NULL);
    case K_HIP_ARRAY: return hipFreeArray((hipArray_t)(uintptr_t)h.v);
    case K_HIP_MAP: return hipMemUnmap((void *)(uintptr_t)h.v, h.size);
    case K_ACL_MAP: return aclrtUnmapMem((void *)(uintptr_t)h.v);
    case K_CNRT_ASYNC: return cnrtMemFreeAsync((void *)(uintptr_t)h.v, NULL);
    }
    return -1;
}

struct contend_args { int iters; uint64_t size; long ok, oom, other, free_fail; };
static void *contend_thread(void *p) {
    struct contend_args *a = p;
    for (int i = 0; i < a->iters; i++) {
        CUdeviceptr d;
        CUresult r = cuMemAlloc_v2(&d, a->size);
        if (r == CUDA_SUCCESS) {
            a->ok++;
            sched_yield();
            if (cuMemFree_v2(d) != CUDA_SUCCESS) a->free_fail++;
        } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            a->oom++;
        } else {
            a->other++;
        }
    }
    return NULL;
}

/* Allocate and free forever in mixed sizes (reserve, device counter,
 * refusals, memory info): a target for kill -9 at any instruction. */
static void *churn_thread(void *p) {
    static const uint64_t sizes[] = {1 << 20, 100 << 20, 300 << 20, 700 << 20};
    unsigned seed = (unsigned)(uintptr_t)p;
    CUdeviceptr held[4] = {0};
    for (unsigned i = 0;; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned slot = (seed >> 16) & 3;
        if (held[slot]) {
            cuMemFree_v2(held[slot]);
            held[slot] = 0;
        } else if (cuMemAlloc_v2(&held[slot], sizes[(seed >> 20) & 3]) != CUDA_SUCCESS) {
            held[slot] = 0;
        }
        if ((i & 63) == 0) {
            size_t f, t;
            cuMemGetInfo_v2(&f, &t);
        }
    }
    return NULL;
}

#define NEED(n)                                                        \
    do {                                                               \
        if (i + (n) >= argc) {                                         \
            fprintf(stderr, "%s needs %d argument(s)\n", op, (n));     \
            return 2;                                                  \
        }                                                              \
    } while (0)

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuInit(0);
    nvmlInit_v2();
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        int rc = 0;
        uint64_t v = 0;
        if (!strcmp(op, "dev")) {
            NEED(1);
            CUcontext ctx;
            cuDevicePrimaryCtxRetain(&ctx, (int)num(argv[++i]));
            rc = cuCtxSetCurrent(ctx);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.alloc") || !strcmp(op, "cu.managed") || !strcmp(op, "cu.async") ||
                   !strcmp(op, "cu.async_ptsz") || !strcmp(op, "cu.pool") || !strcmp(op, "cu.pool_ptsz") ||
                   !strcmp(op, "g.alloc") || !strcmp(op, "g.async")) {
            NEED(1);
            uint64_t n = num(argv[++i]);
            CUdeviceptr d = 0;
            CUmemoryPool pool = (CUmemoryPool)(uintptr_t)0x1000;
            enum kind k = K_CU;
            if (!strcmp(op, "cu.alloc")) rc = cuMemAlloc_v2(&d, n);
            else if (!strcmp(op, "cu.managed")) rc = cuMemAllocManaged(&d, n, 1);
            else if (!strcmp(op, "cu.async")) rc = cuMemAllocAsync(&d, n, NULL), k = K_CU_ASYNC;
            else if (!strcmp(op, "cu.async_ptsz")) rc = cuMemAllocAsync_ptsz(&d, n, NULL), k = K_CU_ASYNC_PTSZ;
            else if (!strcmp(op, "cu.pool")) rc = cuMemAllocFromPoolAsync(&d, n, pool, NULL), k = K_CU_ASYNC;
            else if (!strcmp(op, "cu.pool_ptsz")) rc = cuMemAllocFromPoolAsync_ptsz(&d, n, pool, NULL), k = K_CU_ASYNC_PTSZ;
            else if (!strcmp(op, "g.alloc")) rc = g.alloc(&d, n), k = K_G;
            else rc = g.async(&d, n, NULL), k = K_G_ASYNC;
            push(rc, k, d);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.v1.alloc") || !strcmp(op, "g1.alloc")) {
            NEED(1);
            uint64_t n = num(argv[++i]);
            CUdeviceptr_v1 d = 0;
            int g1op = op[0] == 'g';
            rc = g1op ? g1.alloc(&d, (unsigned)n) : cuMemAlloc(&d, (unsigned)n);
            push(rc, g1op ? K_G1 : K_V1, d);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.v1.pitch")) {
            NEED(2);
            unsigned w = (unsigned)num(argv[++i]), h = (unsigned)num(argv[++i]), pitch = 0;
            CUdeviceptr_v1 d = 0;
            rc = cuMemAllocPitch(&d, &pitch, w, h, 4);
            push(rc, K_V1, d);
            printf("%s rc=%d pitch=%u\n", op, rc, pitch);
        } else if (!strcmp(op, "cu.v1.array") || !strcmp(op, "cu.v1.array3d")) {
            int three = !strcmp(op, "cu.v1.array3d");
            NEED(2 + three);
            CUarray a = NULL;
            if (three) {
                CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)num(argv[i + 1]), (unsigned)num(argv[i + 2]),
                                                (unsigned)num(argv[i + 3]), 0x20, 1, 0};
                rc = cuArray3DCreate(&a, &d);
            } else {
                CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)num(argv[i + 1]), (unsigned)num(argv[i + 2]), 0x20, 1};
                rc = cuArrayCreate(&a, &d);
            }
            i += 2 + three;
            push(rc, K_ARRAY, (uintptr_t)a);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.v1.info") || !strcmp(op, "g1.info")) {
            unsigned f = 0, t = 0;
            rc = op[0] == 'g' ? g1.info(&f, &t) : cuMemGetInfo(&f, &t);
            printf("%s rc=%d free=%u total=%u\n", op, rc, f, t);
        } else if (!strcmp(op, "gpa1")) {
            NEED(1);
            int ver = (int)num(argv[++i]);
            rc = cuGetProcAddress("cuMemAlloc", (void **)&g1.alloc, ver, 0);
            if (!rc) rc = cuGetProcAddress("cuMemFree", (void **)&g1.free, ver, 0);
            if (!rc) rc = cuGetProcAddress("cuMemGetInfo", (void **)&g1.info, ver, 0);
            void *wrapper = dlsym(RTLD_DEFAULT, "cuMemAlloc");
            printf("%s rc=%d wrapped=%d\n", op, rc, rc == 0 && (void *)g1.alloc == wrapper);
        } else if (!strcmp(op, "cu.map") || !strcmp(op, "cu.release")) {
            int k = nhandles - 1;
            while (k >= 0 && handles[k].kind != K_VMM) k--;
            if (k < 0) {
                printf("%s rc=-1 no-handle\n", op);
                continue;
            }
            if (!strcmp(op, "cu.release")) {
                rc = cuMemRelease(handles[k].v);
                if (!rc) memmove(&handles[k], &handles[k + 1], sizeof handles[0] * (size_t)(--nhandles - k));
            } else {
                CUdeviceptr va = 0;
                rc = cuMemAddressReserve(&va, handles[k].size, 0, 0, 0);
                if (!rc) rc = cuMemMap(va, handles[k].size, 0, handles[k].v, 0);
                if (!rc && nhandles < 4096) handles[nhandles++] = (struct handle){K_MAP, va, handles[k].size};
            }
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.pool_threshold") || !strcmp(op, "cu.trim")) {
            NEED(1);
            cuuint64_t n = num(argv[++i]);
            CUmemoryPool pool;
            rc = cuDeviceGetMemPool(&pool, stub_get_device());
            if (!rc) rc = op[3] == 'p' ? cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &n)
                                       : cuMemPoolTrimTo(pool, n);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.graph")) {
            NEED(1);
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            p.poolProps.allocType = 1;
            p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            p.poolProps.location.id = stub_get_device();
            p.bytesize = num(argv[++i]);
            CUgraphNode node;
            rc = graph ? 0 : cuGraphCreate(&graph, 0);
            if (!rc) rc = cuGraphAddMemAllocNode(&node, graph, NULL, 0, &p);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.instantiate")) {
            NEED(1);
            const char *mode = argv[++i];
            CUgraphExec e = NULL;
            if (!strcmp(mode, "legacy")) rc = cuGraphInstantiate(&e, graph, NULL, NULL, 0);
            else if (!strcmp(mode, "v2")) rc = cuGraphInstantiate_v2(&e, graph, NULL, NULL, 0);
            else if (!strcmp(mode, "params")) {
                CUDA_GRAPH_INSTANTIATE_PARAMS p;
                memset(&p, 0, sizeof p);
                rc = cuGraphInstantiateWithParams(&e, graph, &p);
            } else if (!strcmp(mode, "gpa")) {
                CUresult (*f)(CUgraphExec *, CUgraph, unsigned long long) = NULL;
                rc = cuGetProcAddress("cuGraphInstantiate", (void **)&f, 12000, 0);
                if (!rc) rc = f(&e, graph, 0);
            } else rc = cuGraphInstantiateWithFlags(&e, graph, 0);
            push(rc, K_GEXEC, (uintptr_t)e);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "hip.managed") || !strcmp(op, "hip.ext") || !strcmp(op, "hip.async") ||
                   !strcmp(op, "hip.poolasync") || !strcmp(op, "acl.cached") || !strcmp(op, "acl.align32") ||
                   !strcmp(op, "acl.cfg") || !strcmp(op, "cnrt.constant") || !strcmp(op, "cnrt.async")) {
            NEED(1);
            uint64_t n = num(argv[++i]);
            void *p = NULL;
            enum kind k = K_HIP;
            if (!strcmp(op, "hip.managed")) rc = hipMallocManaged(&p, n, 1);
            else if (!strcmp(op, "hip.ext")) rc = hipExtMallocWithFlags(&p, n, 0);
            else if (!strcmp(op, "hip.async")) rc = hipMallocAsync(&p, n, NULL), k = K_HIP_ASYNC;
            else if (!strcmp(op, "hip.poolasync")) {
                hipMemPool_t pool;
                hipDeviceGetMemPool(&pool, stub_get_device());
                rc = hipMallocFromPoolAsync(&p, n, pool, NULL), k = K_HIP_ASYNC;
            } else if (!strcmp(op, "acl.cached")) rc = aclrtMallocCached(&p, n, 0), k = K_ACL;
            else if (!strcmp(op, "acl.align32")) rc = aclrtMallocAlign32(&p, n, 0), k = K_ACL;
            else if (!strcmp(op, "acl.cfg")) rc = aclrtMallocWithCfg(&p, n, 0, NULL), k = K_ACL;
            else if (!strcmp(op, "cnrt.constant")) rc = cnrtMallocConstant(&p, n), k = K_CNRT;
            else rc = cnrtMemAllocAsync(&p, n, NULL), k = K_CNRT_ASYNC;
            push(rc, k, (uintptr_t)p);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "hip.pitch") || !strcmp(op, "hip.mempitch") || !strcmp(op, "hip.array")) {
            NEED(2);
            uint64_t w = num(argv[++i]), h = num(argv[++i]);
            size_t pitch = 0;
            void *p = NULL;
            enum kind k = K_HIP;
            if (!strcmp(op, "hip.pitch")) rc = hipMallocPitch(&p, &pitch, w, h);
            else if (!strcmp(op, "hip.mempitch")) rc = hipMemAllocPitch((CUdeviceptr *)&p, &pitch, w, h, 4);
            else {
                hipChannelFormatDesc d = {32, 0, 0, 0, 2};
                rc = hipMallocArray((hipArray_t *)&p, &d, w, h, 0), k = K_HIP_ARRAY;
            }
            push(rc, k, (uintptr_t)p);
            printf("%s rc=%d pitch=%zu\n", op, rc, pitch);
        } else if (!strcmp(op, "hip.vmm") || !strcmp(op, "acl.vmm")) {
            /* create, map, release the handle: the mapping keeps the memory */
            NEED(1);
            uint64_t n = num(argv[++i]);
            void *va = NULL;
            if (op[0] == 'h') {
                hipMemAllocationProp prop;
                memset(&prop, 0, sizeof prop);
                prop.type = 1;
                prop.location.type = hipMemLocationTypeDevice;
                prop.location.id = stub_get_device();
                hipMemGenericAllocationHandle_t h = NULL;
                rc = hipMemCreate(&h, n, &prop, 0);
                if (!rc) rc = hipMemAddressReserve(&va, n, 0, NULL, 0);
                if (!rc) rc = hipMemMap(va, n, 0, h, 0);
                if (!rc) rc = hipMemRelease(h);
                if (!rc && nhandles < 4096) handles[nhandles++] = (struct handle){K_HIP_MAP, (uintptr_t)va, n};
            } else {
                aclrtPhysicalMemProp prop;
                memset(&prop, 0, sizeof prop);
                prop.memAttr = ACL_HBM_MEM_HUGE;
                prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
                prop.location.id = (uint32_t)stub_get_device();
                aclrtDrvMemHandle h = NULL;
                rc = aclrtMallocPhysical(&h, n, &prop, 0);
                if (!rc) rc = aclrtReserveMemAddress(&va, n, 0, NULL, 0);
                if (!rc) rc = aclrtMapMem(va, n, 0, h, 0);
                if (!rc) rc = aclrtFreePhysical(h);
                if (!rc && nhandles < 4096) handles[nhandles++] = (struct handle){K_ACL_MAP, (uintptr_t)va, n};
            }
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "hip.threshold") || !strcmp(op, "hip.trim") || !strcmp(op, "cnrt.threshold") ||
                   !strcmp(op, "cnrt.trim")) {
            NEED(1);
            uint64_t n = num(argv[++i]);
            int thr = strstr(op, "threshold") != NULL;
            if (op[0] == 'h') {
                hipMemPool_t pool;
                rc = hipDeviceGetMemPool(&pool, stub_get_device());
                if (!rc) rc = thr ? hipMemPoolSetAttribute(pool, hipMemPoolAttrReleaseThreshold, &n) : hipMemPoolTrimTo(pool, n);
            } else {
                cnrtMemPool_t pool;
                rc = cnrtDeviceGetMemPool(&pool, stub_get_device());
                if (!rc) rc = thr ? cnrtMemPoolSetAttribute(pool, cnrtMemPoolAttrReleaseThreshold, &n) : cnrtMemPoolTrimTo(pool, n);
            }
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.pitch")) {
            NEED(2);
            uint64_t w = num(argv[++i]), h = num(argv[++i]);
            CUdeviceptr d;
            size_t pitch = 0;
            rc = cuMemAllocPitch_v2(&d, &pitch, w, h, 4);
            push(rc, K_CU, d);
            printf("%s rc=%d pitch=%zu\n", op, rc, pitch);
        } else if (!strcmp(op, "cu.vmm")) {
            NEED(2);
            uint64_t n = num(argv[++i]);
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = (int)num(argv[++i]);
            CUmemGenericAllocationHandle h = 0;
            rc = cuMemCreate(&h, n, &prop, 0);
            push(rc, K_VMM, h);
            if (rc == 0) handles[nhandles - 1].size = n;
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.array")) {
            NEED(2);
            CUDA_ARRAY_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), 0x20, 1};
            i += 2;
            CUarray a = NULL;
            rc = cuArrayCreate_v2(&a, &d);
            push(rc, K_ARRAY, (uintptr_t)a);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "cu.array3d") || !strcmp(op, "cu.mipmap")) {
            int mip = !strcmp(op, "cu.mipmap");
            NEED(3 + mip);
            CUDA_ARRAY3D_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), num(argv[i + 3]), 0x20, 1, 0};
            i += 3;
            if (mip) {
                unsigned levels = (unsigned)num(argv[++i]);
                CUmipmappedArray a = NULL;
                rc = cuMipmappedArrayCreate(&a, &d, levels);
                push(rc, K_MIPMAP, (uintptr_t)a);
            } else {
                CUarray a = NULL;
                rc = cuArray3DCreate_v2(&a, &d);
                push(rc, K_ARRAY, (uintptr_t)a);
            }
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "free") || !strcmp(op, "free_first")) {
            if (!nhandles) {
                printf("%s rc=-1 empty\n", op);
                continue;
            }
            struct handle h;
            if (!strcmp(op, "free")) h = handles[--nhandles];
            else {
                h = handles[0];
                memmove(handles, handles + 1, sizeof handles[0] * (size_t)--nhandles);
            }
            printf("%s rc=%d\n", op, release(h));
        } else if (!strcmp(op, "freeall")) {
            int bad = 0;
            while (nhandles) bad += release(handles[--nhandles]) != 0;
            printf("%s rc=%d\n", op, bad);
        } else if (!strcmp(op, "cu.free_raw")) {
            NEED(1);
            printf("%s rc=%d\n", op, cuMemFree_v2(num(argv[++i])));
        } else if (!strcmp(op, "cu.info") || !strcmp(op, "rt.info") || !strcmp(op, "hip.info") ||
                   !strcmp(op, "cnrt.info") || !strcmp(op, "g.info") || !strcmp(op, "acl.info")) {
            size_t f = 0, t = 0;
            if (!strcmp(op, "cu.info")) rc = cuMemGetInfo_v2(&f, &t);
            else if (!strcmp(op, "rt.info")) rc = cudaMemGetInfo(&f, &t);
            else if (!strcmp(op, "hip.info")) rc = hipMemGetInfo(&f, &t);
            else if (!strcmp(op, "cnrt.info")) rc = cnrtMemGetInfo(&f, &t);
            else if (!strcmp(op, "g.info")) rc = g.info(&f, &t);
            else {
                NEED(1);
                rc = aclrtGetMemInfo((int)num(argv[++i]), &f, &t);
            }
            printf("%s rc=%d free=%zu total=%zu\n", op, rc, f, t);
        } else if (!strcmp(op, "nvml.info") || !strcmp(op, "nvml.info2")) {
            NEED(1);
            nvmlDevice_t d;
            rc = nvmlDeviceGetHandleByIndex_v2((unsigned)num(argv[++i]), &d);
            if (!strcmp(op, "nvml.info")) {
                nvmlMemory_t m = {0, 0, 0};
                if (!rc) rc = nvmlDeviceGetMemoryInfo(d, &m);
                printf("%s rc=%d free=%llu total=%llu used=%llu\n", op, rc, m.free, m.total, m.used);
            } else {
                nvmlMemory_v2_t m = {nvmlMemory_v2, 0, 0, 0, 0};
                if (!rc) rc = nvmlDeviceGetMemoryInfo_v2(d, &m);
                printf("%s rc=%d free=%llu total=%llu used=%llu reserved=%llu\n", op, rc, m.free, m.total, m.used,
                       m.reserved);
            }
        } else if (!strcmp(op, "rt.alloc") || !strcmp(op, "rt.managed") || !strcmp(op, "rt.async") ||
                   !strcmp(op, "acl.alloc") || !strcmp(op, "hip.alloc") || !strcmp(op, "cnrt.alloc")) {
            NEED(1);
            uint64_t n = num(argv[++i]);
            void *p = NULL;
            enum kind k = K_RT;
            if (!strcmp(op, "rt.alloc")) rc = cudaMalloc(&p, n);
            else if (!strcmp(op, "rt.managed")) rc = cudaMallocManaged(&p, n, 1);
            else if (!strcmp(op, "rt.async")) rc = cudaMallocAsync(&p, n, NULL), k = K_RT_ASYNC;
            else if (!strcmp(op, "acl.alloc")) rc = aclrtMalloc(&p, n, 0), k = K_ACL;
            else if (!strcmp(op, "hip.alloc")) rc = hipMalloc(&p, n), k = K_HIP;
            else rc = cnrtMalloc(&p, n), k = K_CNRT;
            push(rc, k, (uintptr_t)p);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "gpa")) {
            NEED(3);
            int use_v2 = !strcmp(argv[++i], "v2");
            int ver = (int)num(argv[++i]);
            cuuint64_t flags = num(argv[++i]);
            const char *names[] = {"cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuMemAllocAsync", "cuMemFreeAsync"};
            void **slots[] = {(void **)&g.alloc, (void **)&g.free, (void **)&g.info, (void **)&g.async,
                              (void **)&g.free_async};
            for (int k = 0; k < 5 && !rc; k++) {
                CUdriverProcAddressQueryResult st = -1;
                rc = use_v2 ? cuGetProcAddress_v2(names[k], slots[k], ver, flags, &st)
                            : cuGetProcAddress(names[k], slots[k], ver, flags);
            }
            /* our export is what dlsym(RTLD_DEFAULT) finds under LD_PRELOAD */
            void *wrapper = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
            printf("%s rc=%d wrapped=%d\n", op, rc, rc == 0 && (void *)g.alloc == wrapper);
        } else if (!strcmp(op, "setdev")) {
            NEED(2);
            const char *api = argv[++i];
            int d = (int)num(argv[++i]);
            if (!strcmp(api, "acl")) rc = aclrtSetDevice(d);
            else if (!strcmp(api, "hip")) rc = hipSetDevice(d);
            else rc = cnrtSetDevice(d);
            printf("%s rc=%d\n", op, rc);
        } else if (!strcmp(op, "stats")) {
            NEED(1);
            unsigned long long used, peak;
            stubGetStats((int)num(argv[++i]), &used, &peak);
            printf("%s rc=0 used=%llu peak=%llu\n", op, used, peak);
        } else if (!strcmp(op, "sleep")) {
            NEED(1);
            usleep((useconds_t)num(argv[++i]) * 1000);
        } else if (!strcmp(op, "hold")) {
            printf("hold rc=0 ready\n");
            fflush(stdout);
            for (;;) pause();
        } else if (!strcmp(op, "churn")) {
            NEED(1);
            int nt = (int)num(argv[++i]);
            pthread_t th;
            for (int t = 0; t < nt && t < 64; t++) pthread_create(&th, NULL, churn_thread, (void *)(uintptr_t)(t + 1));
            printf("churn rc=0 started\n");
            fflush(stdout);
            for (;;) pause();
        } else if (!strcmp(op, "contend")) {
            NEED(3);
            int nt = (int)num(argv[i + 1]), iters = (int)num(argv[i + 2]);
            uint64_t size = num(argv[i + 3]);
            i += 3;
            pthread_t th[64];
            struct contend_args a[64];
            if (nt > 64) nt = 64;
            for (int t = 0; t < nt; t++) {
                a[t] = (struct contend_args){iters, size, 0, 0, 0, 0};
                pthread_create(&th[t], NULL, contend_thread, &a[t]);
            }
            long ok = 0, oom = 0, other = 0, ff = 0;
            for (int t = 0; t < nt; t++) {
                pthread_join(th[t], NULL);
                ok += a[t].ok;
                oom += a[t].oom;
                other += a[t].other;
                ff += a[t].free_fail;
            }
            printf("%s rc=0 ok=%ld oom=%ld other=%ld free_fail=%ld\n", op, ok, oom, other, ff);
        } else {
            fprintf(stderr, "unknown op %s\n", op);
            return 2;
        }
        (void)v;
    }
    return 0;
}
