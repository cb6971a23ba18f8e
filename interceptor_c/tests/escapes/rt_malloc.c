/* The CUDA runtime (which calls the driver through cuGetProcAddress). */
#include "escape.h"
int main(void) {
    setup();
    void *a, *b, *c;
    cudaMalloc(&a, HALF);
    cudaMallocManaged(&b, HALF, 1);
    cudaMallocAsync(&c, HALF, NULL);
    result(NULL);
    return 0;
}
