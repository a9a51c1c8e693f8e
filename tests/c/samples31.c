/*
 * What upstream programs (cuda-samples, Numba's driver tests) ask of the
 * driver where the stand-in once answered otherwise than the driver does,
 * each as the program asks it:
 *   - peer copies and peer access on a machine of one GPU
 *     (p2pBandwidthLatencyTest);
 *   - graph memory freed outside its graph after each launch
 *     (graphMemoryNodes: cuMemFree, launch again, cuMemFreeAsync);
 *   - a launch of more threads than the kernel or device allows refused by
 *     cuLaunchKernel itself (Numba's test_max_threads_exceeded);
 *   - mapped page-locked and managed memory: their address ranges
 *     (Numba's test_host_alloc_mapped sizes a memset of a mapped array
 *     so);
 *   - the attributes of features a vGPU lacks (systemWideAtomics,
 *     cudaCompressibleMemory) and of the shareable handles it serves
 *     (streamOrderedAllocationIPC, memMapIPCDrv: file descriptors only;
 *     their use is tests/c/shareable.c's).
 *
 * usage: samples31 KERNELS.ptx   (worker/kernels/fairvgpu.ptx)
 * Prints "ok: ..." per check (cu_check.h); the last line says all passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_check.h"

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef unsigned long long CUgraph;
typedef unsigned long long CUgraphExec;
typedef unsigned long long CUgraphNode;

CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDeviceCanAccessPeer(int *, CUdevice, CUdevice);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxEnablePeerAccess(CUcontext, unsigned);
CUresult cuCtxDisablePeerAccess(CUcontext);
CUresult cuMemcpyPeer(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
CUresult cuMemcpyPeerAsync(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, void *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemHostAlloc(void **, size_t, unsigned);
CUresult cuMemFreeHost(void *);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned);
CUresult cuMemHostUnregister(void *);
CUresult cuMemHostGetFlags(unsigned *, void *);

/* CUDA_MEM_ALLOC_NODE_PARAMS: pool properties (88 bytes), access
 * descriptors, the size, the address the driver writes back. */
struct alloc_params {
    int pool[22];
    void *access;
    size_t access_count;
    size_t bytes;
    CUdeviceptr dptr;
};

static void peer(CUcontext ctx) {
    int can = -1;
    CK(cuDeviceCanAccessPeer(&can, 0, 0));
    EXPECT("a device is no peer of itself", can == 0);
    BAD("peer access to a context of the same device", cuCtxEnablePeerAccess(ctx, 0));
    BAD("disabling peer access never enabled", cuCtxDisablePeerAccess(ctx));
    enum { N = 1 << 16 };
    unsigned char *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr a, b;
    CK(cuMemAlloc_v2(&a, N));
    CK(cuMemAlloc_v2(&b, N));
    CK(cuMemcpyHtoD_v2(a, h, N));
    CK(cuMemcpyPeer(b, ctx, a, ctx, N));
    CK(cuMemcpyDtoH_v2(back, b, N));
    EXPECT("cuMemcpyPeer within the one device", memcmp(h, back, N) == 0);
    CUstream s;
    CK(cuStreamCreate(&s, 0));
    CK(cuMemsetD32_v2(b, 0, N / 4));
    CK(cuMemcpyPeerAsync(b + 4096, ctx, a, ctx, N - 4096, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH_v2(back, b, N));
    EXPECT("cuMemcpyPeerAsync within the one device",
           memcmp(h, back + 4096, N - 4096) == 0 && back[0] == 0 && back[4095] == 0);
    BAD("a peer copy naming no context", cuMemcpyPeer(b, NULL, a, ctx, N));
    CK(cuStreamDestroy_v2(s));
    CK(cuMemFree_v2(a));
    CK(cuMemFree_v2(b));
    free(h);
    free(back);
}

/* graphMemoryNodes' last steps: a graph that allocates and does not free;
 * its memory freed outside it after each launch, with cuMemFree and with
 * cuMemFreeAsync. */
static void graph_memory(void) {
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    struct alloc_params p;
    memset(&p, 0, sizeof p);
    p.pool[0] = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
    p.pool[2] = 1; /* CU_MEM_LOCATION_TYPE_DEVICE, id 0 */
    p.bytes = 1 << 20;
    CUgraphNode n;
    CK(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
    CUdeviceptr d = p.dptr;
    CUgraphExec x;
    CK(cuGraphInstantiateWithFlags(&x, g, 0));
    CK(cuGraphDestroy(g));
    CUstream s;
    CK(cuStreamCreate(&s, 0));
    CK(cuGraphLaunch(x, s));
    CK(cuMemsetD32_v2(d, 7, p.bytes / 4));
    CK(cuStreamSynchronize(s));
    CK(cuMemFree_v2(d));
    printf("ok: graph memory freed outside its graph (cuMemFree)\n");
    CK(cuGraphLaunch(x, s));
    CK(cuMemFreeAsync(d, s));
    CK(cuStreamSynchronize(s));
    printf("ok: graph memory freed outside its graph again after a launch (cuMemFreeAsync)\n");
    BAD("a second free before the graph runs again", cuMemFreeAsync(d, s));
    CK(cuGraphLaunch(x, s));
    CK(cuMemFree_v2(d));
    CK(cuStreamSynchronize(s));
    CK(cuGraphExecDestroy(x));
    CK(cuStreamDestroy_v2(s));
    printf("ok: graph memory given back with its executable\n");
}

static void max_threads(const char *ptx) {
    CUmodule m;
    CUfunction f;
    CK(cuModuleLoadData(&m, ptx));
    CK(cuModuleGetFunction(&f, m, "empty"));
    BAD("a block of 1025 threads", cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, 0, NULL, NULL));
    BAD("a block of 64x32 threads", cuLaunchKernel(f, 1, 1, 1, 64, 32, 1, 0, 0, NULL, NULL));
    BAD("a block 65 deep", cuLaunchKernel(f, 1, 1, 1, 1, 1, 65, 0, 0, NULL, NULL));
    BAD("an empty block", cuLaunchKernel(f, 1, 1, 1, 0, 1, 1, 0, 0, NULL, NULL));
    CK(cuLaunchKernel(f, 1, 1, 1, 1024, 1, 1, 0, 0, NULL, NULL));
    CK(cuLaunchKernel(f, 2, 1, 1, 16, 16, 4, 0, 0, NULL, NULL));
    CK(cuCtxSynchronize());
    printf("ok: blocks within the limits launch, and nothing refused was left behind\n");
    CK(cuModuleUnload(m));
}

static void mapped_memory(void) {
    unsigned *h = NULL;
    CK(cuMemHostAlloc((void **)&h, 10 * sizeof *h, 0x2 /* DEVICEMAP */));
    CUdeviceptr d;
    CK(cuMemHostGetDevicePointer_v2(&d, h, 0));
    CUdeviceptr base = 0;
    size_t size = 0;
    CK(cuMemGetAddressRange_v2(&base, &size, d + 8));
    EXPECT("a mapped allocation's address range", base == d && size >= 10 * sizeof *h);
    /* (Numba then memsets that range: the sim's kernels and memsets do not
     * reach host memory, a GPU's do.) */
    CK(cuMemFreeHost(h));
    CUdeviceptr m;
    CK(cuMemAllocManaged(&m, 4096, 1));
    CK(cuMemGetAddressRange_v2(&base, &size, m + 100));
    EXPECT("a managed allocation's address range", base == m && size >= 4096);
    CK(cuMemFree_v2(m));
    /* cuSPARSE's cusparseDestroyCsrilu02Info (conjugateGradientPrecond)
     * frees with cudaFreeAsync what may be unset or managed. */
    EXPECT("cuMemFreeAsync of a null pointer", cuMemFreeAsync(0, 0) == 0);
    CK(cuMemAllocManaged(&m, 4096, 1));
    EXPECT("cuMemFreeAsync of managed memory", cuMemFreeAsync(m, 0) == 0);
    EXPECT("managed memory freed once", cuMemFreeAsync(m, 0) != 0);
}

static void attributes(void) {
    int v = -1;
    CK(cuDeviceGetAttribute(&v, 83, 0)); /* MANAGED_MEMORY */
    EXPECT("managed memory", v == 1);
    CK(cuDeviceGetAttribute(&v, 89, 0)); /* CONCURRENT_MANAGED_ACCESS */
    EXPECT("concurrent managed access", v == 1);
    CK(cuDeviceGetAttribute(&v, 86, 0)); /* HOST_NATIVE_ATOMIC_SUPPORTED */
    EXPECT("no host-native atomics", v == 0);
    CK(cuDeviceGetAttribute(&v, 107, 0)); /* GENERIC_COMPRESSION_SUPPORTED */
    EXPECT("generic compression as the host's GPU has it", v == 1);
    CK(cuDeviceGetAttribute(&v, 103, 0)); /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    EXPECT("VMM handles as file descriptors", v == 1);
    CK(cuDeviceGetAttribute(&v, 119, 0)); /* MEMPOOL_SUPPORTED_HANDLE_TYPES */
    EXPECT("memory pools shareable as file descriptors only", v == 1);
    CK(cuDeviceGetAttribute(&v, 128, 0)); /* HANDLE_TYPE_FABRIC_SUPPORTED */
    EXPECT("no fabric handles", v == 0);
}

/* NPP's watershedSegmentationNPP registers a buffer on its own stack: the
 * stand-in once mapped pool pages over the very frames of the call. */
static __attribute__((noinline)) void stack_registration(void) {
    unsigned char buf[300];
    for (int i = 0; i < 300; i++) buf[i] = (unsigned char)i;
    CK(cuMemHostRegister_v2(buf, sizeof buf, 0));
    unsigned f = 99;
    CK(cuMemHostGetFlags(&f, buf + 10));
    CUdeviceptr d;
    CK(cuMemAlloc_v2(&d, sizeof buf));
    CK(cuMemcpyHtoD_v2(d, buf, sizeof buf));
    unsigned char back[300] = {0};
    CK(cuMemcpyDtoH_v2(back, d, sizeof back));
    EXPECT("memory on the registering thread's stack registered, copied and intact",
           f == 0 && memcmp(buf, back, sizeof buf) == 0);
    EXPECT("registered twice refused", cuMemHostRegister_v2(buf, 16, 0) != 0);
    CK(cuMemHostUnregister(buf));
    CK(cuMemFree_v2(d));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s KERNELS.ptx\n", argv[0]);
        return 2;
    }
    char *ptx = read_file(argv[1]);
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    peer(ctx);
    graph_memory();
    max_threads(ptx);
    mapped_memory();
    attributes();
    stack_registration();
    printf("ok: the stack registration returned\n");
    CK(cuDevicePrimaryCtxRelease_v2(dev));
    free(ptx);
    printf("samples31: all checks passed\n");
    return failed;
}
