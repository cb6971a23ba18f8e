/* 300 children allocate and free in a loop and are killed with SIGKILL at
 * arbitrary points; afterwards the whole quota must be available. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "escape.h"
static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    CUdeviceptr held[4] = {0};
    static const uint64_t sizes[] = {MiB, 100 * MiB, 300 * MiB, 700 * MiB};
    for (unsigned i = 0;; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 16) & 3;
        if (held[k]) {
            cuMemFree_v2(held[k]);
            held[k] = 0;
        } else if (cuMemAlloc_v2(&held[k], sizes[(seed >> 20) & 3]) != CUDA_SUCCESS) {
            held[k] = 0;
        }
        if ((i & 31) == 0) {
            size_t f, t;
            cuMemGetInfo_v2(&f, &t); /* takes reserves back from every process */
        }
    }
    return NULL;
}
static pid_t start_child(int k) {
    int ready[2];
    if (pipe(ready)) exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        pthread_t th;
        for (int t = 1; t < 3; t++) pthread_create(&th, NULL, churn, (void *)(uintptr_t)(t + k * 4));
        (void)!write(ready[1], "r", 1);
        churn((void *)(uintptr_t)(k * 4));
    }
    close(ready[1]);
    char c;
    (void)!read(ready[0], &c, 1); /* it runs */
    close(ready[0]);
    return pid;
}

int main(void) {
    setup();
    unsigned seed = 13;
    for (int k = 0; k < 300; k += 4) {
        pid_t pids[4];
        for (int j = 0; j < 4; j++) pids[j] = start_child(k + j);
        for (int j = 0; j < 4; j++) { /* kill each somewhere in its loops */
            seed = seed * 1103515245u + 12345u;
            struct timespec ts = {0, (long)((seed >> 16) % 3000) * 1000};
            nanosleep(&ts, NULL);
            kill(pids[j], SIGKILL);
        }
        for (int j = 0; j < 4; j++) waitpid(pids[j], NULL, 0);
    }
    CUdeviceptr all;
    int rc = cuMemAlloc_v2(&all, 1024 * MiB);
    char extra[32];
    snprintf(extra, sizeof extra, "full=%d", rc);
    result(extra);
    return 0;
}
