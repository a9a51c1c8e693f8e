/* How many CUDA contexts one GPU takes, natively: (1) one process making
 * contexts until one fails; (2) run as N processes, each making one and
 * holding it (argv[1] = "hold", argv[2] = seconds). Prints the count, the
 * error and the GPU memory in use. Built with nvcc or gcc -lcuda. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0)) { puts("no GPU"); return 2; }
    if (argc > 2 && !strcmp(argv[1], "hold")) {
        CUcontext c;
        CUresult r = cuCtxCreate(&c, NULL, 0, dev);
        const char *n = "?";
        cuGetErrorName(r, &n);
        printf("hold: %s\n", n);
        fflush(stdout);
        if (r == CUDA_SUCCESS) sleep(atoi(argv[2]));
        return r != CUDA_SUCCESS;
    }
    int made = 0;
    CUresult r = CUDA_SUCCESS;
    for (; made < 4096; made++) {
        CUcontext c;
        r = cuCtxCreate(&c, NULL, 0, dev);
        if (r != CUDA_SUCCESS) break;
    }
    size_t freeb = 0, total = 0;
    const char *n = "?";
    cuGetErrorName(r, &n);
    CUcontext c0;
    cuCtxCreate(&c0, NULL, 0, dev);
    cuMemGetInfo(&freeb, &total);
    printf("one process: %d contexts, then %s; GPU memory free %zu of %zu MiB\n", made, n,
           freeb >> 20, total >> 20);
    return 0;
}
