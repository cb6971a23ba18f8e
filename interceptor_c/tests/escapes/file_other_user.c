/* Another user (not in the pod) tries to open the accounting file for writing. */
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "escape.h"
int main(void) {
    setup();
    CUdeviceptr a;
    cuMemAlloc_v2(&a, HALF); /* creates the file */
    const char *path = getenv("HCS_SHM_PATH");
    if (getuid() != 0) {
        printf("skip needs root to switch users\n");
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        if (setgid(65534) || setuid(65534)) _exit(3);
        int fd = open(path, O_RDWR);
        _exit(fd >= 0 ? 0 : errno == EACCES ? 1 : 2);
    }
    int st;
    waitpid(pid, &st, 0);
    char extra[32];
    snprintf(extra, sizeof extra, "opened=%d", WIFEXITED(st) && WEXITSTATUS(st) == 0);
    result(extra);
    return 0;
}
