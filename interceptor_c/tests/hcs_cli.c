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

enum kind { K_CU, K_CU_ASYNC, K_CU_ASYNC_PTSZ, K_VMM, K_ARRAY, K_MIPMAP, K_RT, K_RT_ASYNC, K_ACL, K_HIP, K_CNRT, K_G, K_G_ASYNC };
struct handle { enum kind kind; uint64_t v; };
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
    if (rc == 0 && nhandles < 4096) handles[nhandles++] = (struct handle){k, v};
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
