/* Parent and forked child each take 768 MiB. */
#include <sys/wait.h>
#include <unistd.h>

#include "escape.h"
int main(void) {
    setup();
    CUdeviceptr a;
    cuMemAlloc_v2(&a, HALF);
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr b;
        _exit(cuMemAlloc_v2(&b, HALF) == CUDA_SUCCESS ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    char extra[32];
    snprintf(extra, sizeof extra, "child_ok=%d", WIFEXITED(st) && WEXITSTATUS(st) == 0);
    result(extra);
    return 0;
}
