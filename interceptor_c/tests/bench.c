/* Added cost per intercepted cuMemAlloc_v2 + cuMemFree_v2 pair.
 * Same process, same stub driver: the baseline calls the stub directly, the
 * other loop calls the interceptor's wrappers (library dlopen'ed locally, so
 * it interposes nothing else). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/vendor.h"

CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

struct job { alloc_fn a; free_fn f; long iters; long failures; double cpu_ns; pthread_barrier_t *bar; };

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *loop(void *p) {
    struct job *j = p;
    pthread_barrier_wait(j->bar);
    double t0 = cpu_ns();
    for (long i = 0; i < j->iters; i++) {
        CUdeviceptr d;
        if (j->a(&d, 1 << 20) != CUDA_SUCCESS || j->f(d) != CUDA_SUCCESS) j->failures++;
    }
    j->cpu_ns = cpu_ns() - t0;
    return NULL;
}

/* CPU ns per pair: CPU time of all loop threads / pairs. CPU time rather
 * than wall time keeps other load on the machine out of the figure; cache
 * line contention between threads still shows up in it. Best of 5. */
static double run(alloc_fn a, free_fn f, int threads, long iters) {
    double best = 1e300;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        struct job jobs[64];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)threads + 1);
        for (int t = 0; t < threads; t++) {
            jobs[t] = (struct job){a, f, iters, 0, 0, &bar};
            pthread_create(&th[t], NULL, loop, &jobs[t]);
        }
        pthread_barrier_wait(&bar);
        double cpu = 0;
        for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
        for (int t = 0; t < threads; t++) cpu += jobs[t].cpu_ns;
        pthread_barrier_destroy(&bar);
        for (int t = 0; t < threads; t++)
            if (jobs[t].failures) {
                fprintf(stderr, "bench: %ld failed alloc/free pairs\n", jobs[t].failures);
                exit(1);
            }
        double per = cpu / ((double)threads * iters);
        if (per < best) best = per;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/libhcs_interceptor.so [iterations]\n", argv[0]);
        return 2;
    }
    long iters = argc > 2 ? atol(argv[2]) : 1000000;
    char shm[64];
    snprintf(shm, sizeof shm, "/tmp/hcs_bench_%d.shm", (int)getpid());
    setenv("HCS_VRAM_QUOTA", "1Ti", 0);
    setenv("HCS_SHM_PATH", shm, 1);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    alloc_fn wa = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    free_fn wf = (free_fn)dlsym(h, "cuMemFree_v2");
    if (!wa || !wf || wa == cuMemAlloc_v2) {
        fprintf(stderr, "interceptor symbols not found\n");
        return 1;
    }
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    printf("cuMemAlloc_v2(1 MiB)+cuMemFree_v2 pairs on the stub driver; CPU ns per pair, best of 5; %d cores\n",
           cores);
    printf("%-8s %18s %22s %10s\n", "threads", "baseline ns/pair", "interceptor ns/pair", "added ns");
    int counts[] = {1, 8};
    for (int k = 0; k < 2; k++) {
        int t = counts[k];
        long n = t == 1 ? iters : iters / 8;
        run(wa, wf, t, n / 10); /* warm up (table pages, slot) */
        double base = run(cuMemAlloc_v2, cuMemFree_v2, t, n);
        double with = run(wa, wf, t, n);
        printf("%-8d %18.1f %22.1f %10.1f\n", t, base, with, with - base);
    }
    unlink(shm);
    return 0;
}
