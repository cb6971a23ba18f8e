/* Two "containers": each allocating process is pid 1 of its own pid
 * namespace; both share the accounting file and take 768 MiB. The first
 * holds its memory while the second tries. */
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "escape.h"

/* fork a child that enters new pid and mount namespaces and runs `body` as
 * their pid 1 with its own /proc, like a container's entrypoint; returns the
 * intermediate child's pid (its exit status is body's). */
static pid_t container(int (*body)(void *), void *arg) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) _exit(4);
    pid_t init = fork();
    if (init == 0) {
        if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0) mount("proc", "/proc", "proc", 0, NULL);
        _exit(getpid() == 1 ? body(arg) : 2);
    }
    int st;
    waitpid(init, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 5);
}

struct hold { int done[2], go[2]; };

static int take(void) {
    CUdeviceptr d;
    return cuMemAlloc_v2(&d, HALF) == CUDA_SUCCESS;
}
static int holder(void *p) {
    struct hold *h = p;
    char c = take() ? '1' : '0';
    (void)!write(h->done[1], &c, 1);
    (void)!read(h->go[0], &c, 1); /* hold until told */
    return 0;
}
static int taker(void *p) {
    (void)p;
    return take() ? 0 : 1;
}

int main(void) {
    setup();
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
        printf("skip unshare(CLONE_NEWPID|CLONE_NEWNS) not permitted (needs root)\n");
        return 0;
    }
    struct hold h;
    if (pipe(h.done) || pipe(h.go)) return 1;
    pid_t first = container(holder, &h);
    char a = 0;
    (void)!read(h.done[0], &a, 1);
    pid_t second = container(taker, NULL);
    int st_b, st_a;
    waitpid(second, &st_b, 0);
    char extra[64];
    snprintf(extra, sizeof extra, "first_ok=%d second_ok=%d", a == '1', WIFEXITED(st_b) && WEXITSTATUS(st_b) == 0);
    result(extra);
    (void)!write(h.go[1], "x", 1);
    waitpid(first, &st_a, 0);
    return 0;
}
