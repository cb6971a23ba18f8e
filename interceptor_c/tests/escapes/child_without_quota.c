/* A child started with HCS_VRAM_QUOTA unset (LD_PRELOAD kept). */
#include <sys/wait.h>
#include <unistd.h>

#include "escape.h"
int main(int argc, char **argv) {
    setup();
    CUdeviceptr a;
    if (argc > 1) { /* the child */
        return cuMemAlloc_v2(&a, HALF) == CUDA_SUCCESS ? 0 : 1;
    }
    cuMemAlloc_v2(&a, HALF);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("HCS_VRAM_QUOTA");
        execl("/proc/self/exe", argv[0], "child", (char *)NULL);
        _exit(3);
    }
    int st;
    waitpid(pid, &st, 0);
    char extra[32];
    snprintf(extra, sizeof extra, "child_ok=%d", WIFEXITED(st) && WEXITSTATUS(st) == 0);
    result(extra);
    return 0;
}
