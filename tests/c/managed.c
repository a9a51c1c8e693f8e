/*
 * Managed memory through the stand-in, as programs use it (Numba's
 * managed-allocation tests, cuda-samples' systemWideAtomics and
 * UnifiedMemoryPerf): on the device, migrating to the process on touch.
 *   - an array larger than the vGPU's pinned pool, filled on the CPU, a
 *     kernel over it, checked on the CPU, counted against the vGPU's memory;
 *   - CPU writes after a kernel are seen by the next kernel;
 *   - a CPU access while kernels are queued sees their result;
 *   - the CPU's and a kernel's atomics on one counter both count;
 *   - a device memset of host-attached memory read on the CPU (Numba);
 *   - copies naming managed memory as host memory, prefetch both ways,
 *     advice and range attributes, pointer attributes, free;
 *   - the program's own SIGSEGV handler still gets its own faults.
 *
 * usage: managed KERNELS.ptx [pool]
 *   (worker/kernels/fairvgpu.ptx; "pool": run with
 *   FAIRVGPU_MANAGED=pool, managed memory from the pinned pool)
 * Prints "ok: ..." per check (cu_check.h); the last line says all passed.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cu_check.h"

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemPrefetchAsync(CUdeviceptr, size_t, CUdevice, CUstream);
CUresult cuMemAdvise(CUdeviceptr, size_t, int, CUdevice);
CUresult cuMemRangeGetAttribute(void *, size_t, int, CUdeviceptr, size_t);
CUresult cuStreamAttachMemAsync(CUstream, CUdeviceptr, size_t, unsigned);

static CUfunction saxpy_k, spin_k, count_k;

/* y = a * x + y over n floats, on the null stream, not waited for. */
static void saxpy(float a, CUdeviceptr x, CUdeviceptr y, unsigned n) {
    void *args[] = {&a, &x, &y, &n};
    CK(cuLaunchKernel(saxpy_k, (n + 255) / 256, 1, 1, 256, 1, 1, 0, 0, args, 0));
}

static void spin(unsigned long long ns) {
    void *args[] = {&ns};
    CK(cuLaunchKernel(spin_k, 1, 1, 1, 1, 1, 1, 0, 0, args, 0));
}

static size_t free_mem(void) {
    size_t f, t;
    CK(cuMemGetInfo_v2(&f, &t));
    return f;
}

/* The program's own handler: a fault on its own inaccessible page. */
static sigjmp_buf jump;
static volatile sig_atomic_t own_faults;
static void own_handler(int sig, siginfo_t *info, void *ctx) {
    (void)sig, (void)info, (void)ctx;
    own_faults++;
    siglongjmp(jump, 1);
}

static void attributes(void) {
    int v = -1;
    CK(cuDeviceGetAttribute(&v, 83, 0));
    EXPECT("managed memory", v == 1);
    CK(cuDeviceGetAttribute(&v, 89, 0));
    EXPECT("concurrent managed access", v == 1);
    CK(cuDeviceGetAttribute(&v, 88, 0));
    EXPECT("no pageable memory access", v == 0);
    CK(cuDeviceGetAttribute(&v, 86, 0));
    EXPECT("no host-native atomics", v == 0);
}

/* Larger than the tests' 32 MiB pool. */
#define BIG (16u << 20) /* floats: 64 MiB */

static void big_arrays(void) {
    size_t before = free_mem();
    CUdeviceptr dx, dy;
    CK(cuMemAllocManaged(&dx, BIG * sizeof(float), 1));
    CK(cuMemAllocManaged(&dy, BIG * sizeof(float), 1));
    EXPECT("managed memory counts against the vGPU's memory",
           before - free_mem() >= 2 * (size_t)BIG * sizeof(float));
    int managed = 0;
    CK(cuPointerGetAttribute(&managed, 8, dx + 12345)); /* IS_MANAGED */
    EXPECT("a managed pointer is managed", managed == 1);
    void *host = 0;
    CK(cuPointerGetAttribute(&host, 4, dx)); /* HOST_POINTER */
    EXPECT("its host pointer is itself", host == (void *)(uintptr_t)dx);
    float *x = (float *)(uintptr_t)dx, *y = (float *)(uintptr_t)dy;
    EXPECT("a new allocation reads as zeros", x[0] == 0 && y[BIG - 1] == 0);
    for (unsigned i = 0; i < BIG; i++) {
        x[i] = (float)(i % 1000);
        y[i] = 1.0f;
    }
    saxpy(2.0f, dx, dy, BIG);
    CK(cuCtxSynchronize());
    unsigned bad = 0;
    for (unsigned i = 0; i < BIG; i++)
        bad += y[i] != 2.0f * (float)(i % 1000) + 1.0f;
    EXPECT("64 MiB arrays filled on the CPU, a kernel over them, checked on the CPU", bad == 0);

    for (unsigned i = 0; i < BIG; i++) {
        x[i] = 3.0f;
        y[i] = (float)(i & 7);
    }
    saxpy(1.0f, dx, dy, BIG);
    CK(cuCtxSynchronize());
    bad = 0;
    for (unsigned i = 0; i < BIG; i++)
        bad += y[i] != 3.0f + (float)(i & 7);
    EXPECT("CPU writes after a kernel are seen by the next kernel", bad == 0);

    /* No synchronize: the access waits for the queued kernels. */
    y[5] = 10.0f;
    spin(20 * 1000 * 1000);
    saxpy(2.0f, dx, dy, BIG);
    EXPECT("a CPU access while kernels are queued sees their result",
           y[5] == 16.0f && y[BIG - 1] == 16.0f && y[BIG - 2] == 15.0f);

    CK(cuMemFree_v2(dx));
    CK(cuMemFree_v2(dy));
    EXPECT("freed managed memory is the vGPU's again", free_mem() == before);
}

static void atomics(void) {
    CUdeviceptr dc;
    CK(cuMemAllocManaged(&dc, sizeof(unsigned), 1));
    unsigned *c = (unsigned *)(uintptr_t)dc;
    *c = 0;
    void *args[] = {&dc};
    CK(cuLaunchKernel(count_k, 64, 1, 1, 256, 1, 1, 0, 0, args, 0));
    for (int i = 0; i < 1000; i++)
        __atomic_fetch_add(c, 1, __ATOMIC_SEQ_CST);
    CK(cuCtxSynchronize());
    EXPECT("a kernel's and the CPU's atomics on one counter all count", *c == 64 * 256 + 1000);
    CK(cuMemFree_v2(dc));
}

static void host_attached(void) {
    size_t n = 3 << 20;
    CUdeviceptr m;
    CK(cuMemAllocManaged(&m, n, 2)); /* CU_MEM_ATTACH_HOST */
    CK(cuMemsetD8_v2(m, 0xab, n));
    CK(cuCtxSynchronize());
    unsigned char *p = (unsigned char *)(uintptr_t)m;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != 0xab;
    EXPECT("host-attached memory set on the device reads so on the CPU", bad == 0);
    CK(cuStreamAttachMemAsync(0, m, 0, 1));

    /* Copies naming it as host memory copy the device's bytes. */
    unsigned char buf[64];
    CK(cuMemcpyDtoH_v2(buf, m + 10, sizeof buf));
    EXPECT("a copy out of managed memory", buf[0] == 0xab && buf[63] == 0xab);
    CUdeviceptr d;
    CK(cuMemAlloc_v2(&d, 4096));
    CK(cuMemsetD32_v2(d, 0x01020304, 1024));
    CK(cuMemcpyDtoH_v2(p + 100, d, 8));
    EXPECT("a device-to-host copy into managed memory", p[100] == 4 && p[103] == 1 && p[99] == 0xab);
    p[200] = 7;
    CK(cuMemcpyHtoD_v2(d, p + 200, 1));
    unsigned word = 0;
    CK(cuMemcpyDtoH_v2(&word, d, 4));
    EXPECT("a host-to-device copy out of managed memory", (word & 0xff) == 7);
    CK(cuMemFree_v2(d));

    /* Prefetch both ways, and what the range says. */
    int loc = 5;
    CK(cuMemPrefetchAsync(m, n, 0, 0));
    CK(cuMemRangeGetAttribute(&loc, 4, 4, m, n)); /* LAST_PREFETCH_LOCATION */
    EXPECT("prefetched to the device", loc == 0);
    CK(cuMemPrefetchAsync(m, n, -1, 0));
    CK(cuMemRangeGetAttribute(&loc, 4, 4, m, n));
    EXPECT("prefetched to the CPU", loc == -1 && p[200] == 7 && p[n - 1] == 0xab);
    CK(cuMemAdvise(m, n, 3, -1)); /* SET_PREFERRED_LOCATION: CPU */
    CK(cuMemRangeGetAttribute(&loc, 4, 2, m, n));
    EXPECT("advice kept", loc == -1);
    CK(cuMemAdvise(m, n, 1, 0)); /* SET_READ_MOSTLY */
    CK(cuMemRangeGetAttribute(&loc, 4, 1, m, n));
    EXPECT("read-mostly kept", loc == 1);
    CUdeviceptr plain;
    CK(cuMemAlloc_v2(&plain, 4096));
    BAD("prefetch of memory that is not managed", cuMemPrefetchAsync(plain, 4096, 0, 0));
    BAD("prefetch to a device that is not there", cuMemPrefetchAsync(m, n, 3, 0));
    CK(cuMemFree_v2(plain));
    CK(cuMemFree_v2(m));
}

/* The program's faults on its own memory reach its own handler. */
static void own_faults_reach_own_handler(void) {
    char *page = mmap(0, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sigsetjmp(jump, 1) == 0) {
        page[0] = 1;
        printf("FAILED: the write did not fault\n");
        exit(1);
    }
    EXPECT("the program's own SIGSEGV handler still gets its faults", own_faults == 1);
    munmap(page, 4096);
}

/* From the pinned pool (FAIRVGPU_MANAGED=pool): no more than it holds. */
static void pool(void) {
    CUdeviceptr big, m;
    BAD("a managed array larger than the pool", cuMemAllocManaged(&big, BIG * sizeof(float), 1));
    size_t before = free_mem();
    CK(cuMemAllocManaged(&m, 2 * 1024 * sizeof(float), 1));
    EXPECT("pool memory is no device memory", free_mem() == before);
    /* (The sim's kernels do not reach the pool: copies instead.) */
    float *x = (float *)(uintptr_t)m, *y = x + 1024;
    for (int i = 0; i < 1024; i++)
        x[i] = (float)i, y[i] = 0;
    CUdeviceptr d;
    CK(cuMemAlloc_v2(&d, 1024 * sizeof(float)));
    CK(cuMemcpyHtoD_v2(d, x, 1024 * sizeof(float)));
    CK(cuMemcpyDtoH_v2(y, d, 1024 * sizeof(float)));
    EXPECT("pool managed memory copied to the device and back", y[1] == 1 && y[1023] == 1023);
    CK(cuMemFree_v2(d));
    CK(cuMemFree_v2(m));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KERNELS.ptx [pool]\n", argv[0]);
        return 2;
    }
    /* Before the stand-in installs its own: it must chain to this one. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);

    char *ptx = read_file(argv[1]);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&saxpy_k, mod, "saxpy"));
    CK(cuModuleGetFunction(&spin_k, mod, "spin_ns"));
    CK(cuModuleGetFunction(&count_k, mod, "atomic_count"));
    if (argc > 2 && strcmp(argv[2], "pool") == 0) {
        pool();
    } else {
        attributes();
        big_arrays();
        atomics();
        host_attached();
        own_faults_reach_own_handler();
    }
    CK(cuDevicePrimaryCtxRelease_v2(dev));
    free(ptx);
    printf("managed: all checks passed\n");
    return 0;
}
