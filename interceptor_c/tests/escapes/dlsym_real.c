/* Reach the real dlsym (dlvsym) and take the driver's own entry point: no
 * LD_PRELOAD library can stop this; the node-side backstop sees it. */
#include "escape.h"
typedef void *(*dlsym_fn)(void *, const char *);
int main(void) {
    setup();
    dlsym_fn real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real) real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))real(h, "cuMemAlloc_v2");
    CUdeviceptr a, b;
    alloc(&a, HALF);
    alloc(&b, HALF);
    result(NULL);
    return 0;
}
