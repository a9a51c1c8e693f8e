/*
 * Device memory whose addresses the host's driver picks where this process
 * already has memory of its own (a large library mapped there, say): the
 * stand-in must hand out device memory elsewhere, and it must behave as any
 * other. The program frees one allocation and maps 256 MiB of its own from
 * that address on, where the host's next allocations would land, then
 * allocates (plain and stream-ordered), copies, sets and frees.
 * Builds with plain gcc against the driver's ABI, declared below and in
 * cu_check.h, with the checks.
 *
 * usage: collide. Exit 0 only if all is right.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cu_check.h"

CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2

/* Where the host's next allocations go (the sim hands out addresses upwards
 * from the freed one, 6 MiB apart for these): small enough that it seldom
 * meets the process's own mappings, which would fail the test at once. */
#define BLOCKED (256ull << 20)
#define N (3u << 20) /* bytes per allocation */
#define ALLOCS 3

/* A device allocation of N bytes at `p` used as any other: pattern in and
 * out, a memset, a copy of inferred direction from `from`, and what the
 * pointer is. */
static void use(CUdeviceptr p, CUdeviceptr from, unsigned seed) {
    static unsigned host[N / 4], back[N / 4];
    for (unsigned i = 0; i < N / 4; i++) host[i] = seed * 2654435761u + i;
    CK(cuMemcpyHtoD_v2(p, host, N));
    CK(cuMemcpyDtoH_v2(back, p, N));
    CHECK(!memcmp(host, back, N), "bytes round trip");
    CK(cuMemsetD32_v2(p + 4096, 0xabcdef01u, 16));
    CK(cuMemcpyDtoH_v2(back, p + 4096, 64));
    CHECK(back[0] == 0xabcdef01u && back[15] == 0xabcdef01u, "memset");
    if (from) {
        CK(cuMemcpy(p, from, 4096));
        CK(cuMemcpyDtoH_v2(back, p, 16));
        CHECK(back[0] != host[0], "device to device copy of inferred direction");
    }
    unsigned type = 0;
    CK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 100));
    CHECK(type == CU_MEMORYTYPE_DEVICE, "device memory to pointer queries");
    CUdeviceptr base = 0;
    size_t size = 0;
    CK(cuMemGetAddressRange_v2(&base, &size, p + N - 1));
    CHECK(base == p && size == N, "its address range");
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));

    CUdeviceptr first;
    CK(cuMemAlloc_v2(&first, 2u << 20));
    CK(cuMemFree_v2(first));
    size_t free0, free1, total;
    CK(cuMemGetInfo_v2(&free0, &total));
    void *mine = mmap((void *)first, BLOCKED, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (mine != (void *)first) {
        printf("FAILED: could not map the process's own memory at %#llx\n", first);
        return 1;
    }
    CUdeviceptr p[ALLOCS + 1];
    for (int i = 0; i < ALLOCS; i++) {
        CK(cuMemAlloc_v2(&p[i], N));
        CHECK(p[i] + N <= first || p[i] >= first + BLOCKED, "allocated clear of the process's memory");
        use(p[i], i ? p[i - 1] : 0, i + 1);
    }
    CK(cuMemAllocAsync(&p[ALLOCS], N, 0));
    CHECK(p[ALLOCS] + N <= first || p[ALLOCS] >= first + BLOCKED, "stream-ordered allocation clear too");
    use(p[ALLOCS], p[0], 9);
    CK(cuMemFreeAsync(p[ALLOCS], 0));
    CK(cuStreamSynchronize(0));
    for (int i = 0; i < ALLOCS; i++) CK(cuMemFree_v2(p[i]));
    CHECK(cuMemFree_v2(p[0]) != 0, "a second free refused");
    CK(cuMemGetInfo_v2(&free1, &total));
    CHECK(free1 == free0, "all the memory back");
    CK(cuDevicePrimaryCtxRelease_v2(dev));
    munmap(mine, BLOCKED);
    if (failed) return 1;
    printf("collide: all checks passed\n");
    return 0;
}
