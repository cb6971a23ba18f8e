/* Graph memory nodes, allocated when the graph is instantiated. */
#include "escape.h"
int main(void) {
    setup();
    CUgraph g;
    CUgraphNode n;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = 1;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.bytesize = HALF;
    cuGraphCreate(&g, 0);
    cuGraphAddMemAllocNode(&n, g, NULL, 0, &p);
    CUgraphExec e1, e2;
    cuGraphInstantiateWithFlags(&e1, g, 0);
    cuGraphInstantiate(&e2, g, NULL, NULL, 0); /* the legacy entry point */
    result(NULL);
    return 0;
}
