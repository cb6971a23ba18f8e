/* CUDA arrays and mipmapped arrays. */
#include "escape.h"
int main(void) {
    setup();
    CUDA_ARRAY3D_DESCRIPTOR d = {512, 512, 768, 0x20, 1, 0}; /* 768 MiB of floats */
    CUarray a, b;
    cuArray3DCreate_v2(&a, &d);
    cuArray3DCreate_v2(&b, &d);
    CUDA_ARRAY3D_DESCRIPTOR m = {8192, 8192, 0, 0x20, 1, 0}; /* 256 MiB level 0 */
    CUmipmappedArray mm;
    cuMipmappedArrayCreate(&mm, &m, 4);
    result(NULL);
    return 0;
}
