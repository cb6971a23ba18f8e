/* Added cost per intercepted cuMemAlloc_v2 + cuMemFree_v2 pair.
 * Same process, same stub driver: the baseline calls the stub directly, the
 * other loop calls the interceptor's wrappers (library dlopen'ed locally, so
 * it interposes nothing else). Baseline and interceptor runs alternate, so
 * drift on the machine hits both alike. */
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

#define REPS 7

struct job {
    alloc_fn a;
    free_fn f;
    long iters, failures;
    double cpu_ns, wall_start, wall_end;
    pthread_barrier_t *bar;
};
struct sample { double cpu_per_pair; double pairs_per_s; };

static double clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *loop(void *p) {
    struct job *j = p;
    pthread_barrier_wait(j->bar);
    j->wall_start = clock_ns(CLOCK_MONOTONIC);
    double t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < j->iters; i++) {
        CUdeviceptr d;
        if (j->a(&d, 1 << 20) != CUDA_SUCCESS || j->f(d) != CUDA_SUCCESS) j->failures++;
    }
    j->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
    j->wall_end = clock_ns(CLOCK_MONOTONIC);
    return NULL;
}

/* One run: `threads` threads, `iters` pairs each.
 * cpu_per_pair: CPU time of all loop threads / pairs. It keeps other load on
 * the machine out of the figure, while cache-line contention between threads
 * still shows up in it. With more threads than cores it also contains the
 * cache refills after context switches, so it is read next to
 * pairs_per_s: all pairs / wall time from the first thread's start to the
 * last thread's end, which is what an application sees (and which other
 * load on the machine does disturb). */
static struct sample run(alloc_fn a, free_fn f, int threads, long iters) {
    pthread_t th[64];
    struct job jobs[64];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        jobs[t] = (struct job){.a = a, .f = f, .iters = iters, .bar = &bar};
        pthread_create(&th[t], NULL, loop, &jobs[t]);
    }
    pthread_barrier_wait(&bar);
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    double cpu = 0, w0 = jobs[0].wall_start, w1 = jobs[0].wall_end;
    for (int t = 0; t < threads; t++) {
        cpu += jobs[t].cpu_ns;
        w0 = jobs[t].wall_start < w0 ? jobs[t].wall_start : w0;
        w1 = jobs[t].wall_end > w1 ? jobs[t].wall_end : w1;
        if (jobs[t].failures) {
            fprintf(stderr, "bench: %ld failed alloc/free pairs\n", jobs[t].failures);
            exit(1);
        }
    }
    double pairs = (double)threads * (double)iters;
    return (struct sample){cpu / pairs, pairs / ((w1 - w0) / 1e9)};
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
static double best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
    return b;
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
    printf("cuMemAlloc_v2(1 MiB)+cuMemFree_v2 pairs on the stub driver, %d runs each, %d cores\n", REPS, cores);
    printf("CPU ns per pair as best and median of the runs; throughput in million pairs/s of wall time, median\n");
    printf("%-7s  %-17s  %-17s  %-17s  %s\n", "", "baseline ns/pair", "interceptor ns/pair", "added ns/pair",
           "Mpairs/s (median)");
    printf("%-7s  %8s %8s  %8s %8s  %8s %8s  %8s %11s %6s\n", "threads", "best", "median", "best", "median", "best",
           "median", "baseline", "interceptor", "ratio");
    int counts[] = {1, 8};
    for (int k = 0; k < 2; k++) {
        int t = counts[k];
        long n = t == 1 ? iters : iters / 8;
        if (n < 1) n = 1;
        run(wa, wf, t, n / 10 + 1); /* warm up (table pages, slot) */
        run(cuMemAlloc_v2, cuMemFree_v2, t, n / 10 + 1);
        double bc[REPS], wc[REPS], bt[REPS], wt[REPS];
        for (int r = 0; r < REPS; r++) {
            struct sample b = run(cuMemAlloc_v2, cuMemFree_v2, t, n), w = run(wa, wf, t, n);
            bc[r] = b.cpu_per_pair, bt[r] = b.pairs_per_s / 1e6;
            wc[r] = w.cpu_per_pair, wt[r] = w.pairs_per_s / 1e6;
        }
        double bb = best(bc, REPS), wb = best(wc, REPS);
        double bm = median(bc, REPS), wm = median(wc, REPS), btm = median(bt, REPS), wtm = median(wt, REPS);
        printf("%-7d  %8.1f %8.1f  %8.1f %8.1f  %8.1f %8.1f  %8.2f %11.2f %6.2f\n", t, bb, bm, wb, wm, wb - bb,
               wm - bm, btm, wtm, wtm / btm);
    }
    unlink(shm);
    return 0;
}
