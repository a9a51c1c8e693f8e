/*
 * What a tenant's buggy or chatty kernel does to its own process, run
 * through the stand-in: the kernels of worker/kernels/faults.ptx.
 *
 * usage: faults FAULTS.ptx printf|assert|trap|compute
 *   printf   puts a line in C stdio's buffer, launches fvg_printf (tag 3,
 *            4 threads), synchronizes, then writes "after sync": natively
 *            the driver writes the kernel's lines through the process's
 *            stdout at the synchronize, flushing the buffered line first.
 *   assert   fvg_assert with a non-null pointer: the synchronize answers
 *            CUDA_ERROR_ASSERT, the driver's message on stderr.
 *   trap     fvg_trap: CUDA_ERROR_LAUNCH_FAILED.
 *   compute  a kernel that passes its assert, and a synchronize: the vGPU
 *            computes (the next process after a fault).
 *   loop SECONDS          the checked neighbour: the compute step over and
 *                         over for SECONDS, counting the rounds that failed.
 *   hold SECONDS          allocates 1 MiB filled with 1234.5f, prints its
 *                         device address, keeps it for SECONDS.
 *   peek ADDR KERNELS.ptx a kernel of this process (vector_add of
 *                         fairvgpu.ptx) reads 4 floats at ADDR, another
 *                         process's memory: prints what it read, or the
 *                         error (natively: an illegal address).
 *   keep SECONDS         process B: memory filled with a pattern, a stream and
 *                         the module; after SECONDS it launches on its stream
 *                         and reads its memory back: "keep: OK" if all held.
 *   reset                process A: allocates, cuDevicePrimaryCtxReset, then
 *                         retains the primary context again and computes:
 *                         "reset: OK" (natively a reset is this process's only).
 *   pinned MIB SECONDS   cuMemAllocHost of MIB MiB: "pinned: out of memory" if
 *                         refused; else fills it, copies it to the device and
 *                         back into its second half, says "pinned: OK at ADDR"
 *                         if the bytes came back, and keeps it for SECONDS.
 * Every line goes out at once through write(2), so that its order against
 * the kernel output in the same descriptor is the order it happened in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cu_check.h"

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
CUresult cuMemFreeHost(void *);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned);
CUresult cuMemHostUnregister(void *);

static void say(const char *s) {
    char b[256];
    int n = snprintf(b, sizeof b, "%s\n", s);
    if (write(1, b, n) != n) exit(3);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s FAULTS.ptx printf|assert|trap|compute\n", argv[0]); return 2; }
    CUdevice dev;
    CUcontext ctx;
    CUmodule m;
    CUfunction f;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&m, read_file(argv[1])));
    const char *mode = argv[2];
    char line[128];
    if (!strcmp(mode, "printf")) {
        int tag = 3;
        void *args[] = {&tag};
        CK(cuModuleGetFunction(&f, m, "fvg_printf"));
        /* Buffered in C stdio (stdout is a pipe or file here): natively the
           driver writes the kernel's lines through the same stdout, so this
           line comes out with them, before them. */
        printf("stdio line\n");
        CK(cuLaunchKernel(f, 1, 1, 1, 4, 1, 1, 0, 0, args, 0));
        say("launched");
        CK(cuCtxSynchronize());
        say("after sync");
    } else if (!strcmp(mode, "assert") || !strcmp(mode, "compute")) {
        CUdeviceptr p = 0;
        if (!strcmp(mode, "assert")) CK(cuMemAlloc_v2(&p, 4));
        void *args[] = {&p};
        CK(cuModuleGetFunction(&f, m, "fvg_assert"));
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, 0));
        snprintf(line, sizeof line, "%s sync: %s", mode, cu_name(cuCtxSynchronize()));
        say(line);
    } else if (!strcmp(mode, "trap")) {
        CK(cuModuleGetFunction(&f, m, "fvg_trap"));
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        if (r == 0) r = cuCtxSynchronize();
        snprintf(line, sizeof line, "trap sync: %s", cu_name(r));
        say(line);
    } else if (!strcmp(mode, "loop") && argc == 4) {
        CUdeviceptr p = 0;
        void *args[] = {&p};
        CK(cuModuleGetFunction(&f, m, "fvg_assert"));
        time_t end = time(NULL) + atoi(argv[3]);
        long rounds = 0, errors = 0;
        CUresult first = 0;
        while (time(NULL) < end) {
            CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, 0);
            if (r == 0) r = cuCtxSynchronize();
            rounds++;
            if (r != 0) {
                if (!errors) first = r;
                errors++;
                usleep(10000);
            }
        }
        snprintf(line, sizeof line, "loop: %ld rounds, %ld errors (first: %s)", rounds, errors,
                 errors ? cu_name(first) : "none");
        say(line);
    } else if (!strcmp(mode, "hold") && argc == 4) {
        CUdeviceptr p;
        CK(cuMemAlloc_v2(&p, 1 << 20));
        CK(cuMemsetD32_v2(p, 0x449A5000u /* 1234.5f */, (1 << 20) / 4));
        CK(cuCtxSynchronize());
        snprintf(line, sizeof line, "holding 0x%llx", (unsigned long long)p);
        say(line);
        sleep(atoi(argv[3]));
    } else if (!strcmp(mode, "peek") && argc == 5) {
        CUdeviceptr other = strtoull(argv[3], NULL, 0), zero, out;
        CUmodule km;
        CK(cuModuleLoadData(&km, read_file(argv[4])));
        CK(cuModuleGetFunction(&f, km, "vector_add"));
        CK(cuMemAlloc_v2(&zero, 16));
        CK(cuMemAlloc_v2(&out, 16));
        CK(cuMemsetD32_v2(zero, 0, 4));
        CK(cuMemsetD32_v2(out, 0, 4));
        unsigned n = 4;
        void *args[] = {&other, &zero, &out, &n};
        CUresult r = cuLaunchKernel(f, 1, 1, 1, 4, 1, 1, 0, 0, args, 0);
        if (r == 0) r = cuCtxSynchronize();
        float got[4] = {0};
        if (r == 0) r = cuMemcpyDtoH_v2(got, out, sizeof got);
        snprintf(line, sizeof line, "peek: %s, read %g %g %g %g", cu_name(r), got[0], got[1], got[2], got[3]);
        say(line);
    } else if (!strcmp(mode, "keep") && argc == 4) {
        enum { N = 1 << 18 };
        CUdeviceptr p = 0;
        CUstream s;
        CK(cuMemAlloc_v2(&p, N * 4));
        CK(cuMemsetD32_v2(p, 0x5eed0000u, N));
        CK(cuStreamCreate(&s, 0));
        CK(cuModuleGetFunction(&f, m, "fvg_assert"));
        CK(cuCtxSynchronize());
        say("keep: ready");
        sleep(atoi(argv[3]));
        CUdeviceptr zero = 0;
        void *args[] = {&zero};
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, 0));
        CK(cuStreamSynchronize(s));
        static unsigned got[N];
        CK(cuMemcpyDtoH_v2(got, p, sizeof got));
        for (int i = 0; i < N; i++)
            if (got[i] != 0x5eed0000u) { say("keep: memory changed"); return 1; }
        say("keep: OK");
    } else if (!strcmp(mode, "reset")) {
        CUdeviceptr p = 0, zero = 0;
        CK(cuMemAlloc_v2(&p, 4096));
        CK(cuDevicePrimaryCtxReset_v2(dev));
        CK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CK(cuCtxSetCurrent(ctx));
        CK(cuModuleLoadData(&m, read_file(argv[1])));
        CK(cuModuleGetFunction(&f, m, "fvg_assert"));
        void *args[] = {&zero};
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, 0));
        CK(cuCtxSynchronize());
        unsigned v = 0;
        CK(cuMemAlloc_v2(&p, 4));
        CK(cuMemsetD32_v2(p, 77, 1));
        CK(cuMemcpyDtoH_v2(&v, p, 4));
        say(v == 77 ? "reset: OK" : "reset: wrong value");
    } else if (!strcmp(mode, "pinned") && argc == 5) {
        size_t bytes = (size_t)atoi(argv[3]) << 20, half = bytes / 2;
        unsigned char *h = NULL;
        CUresult r = cuMemAllocHost_v2((void **)&h, bytes);
        if (r == 2 /* CUDA_ERROR_OUT_OF_MEMORY */) { say("pinned: out of memory"); return 0; }
        CK(r);
        CUdeviceptr p;
        CK(cuMemAlloc_v2(&p, half));
        for (size_t i = 0; i < half; i++) h[i] = (unsigned char)(i * 7 + 1);
        memset(h + half, 0, half);
        CK(cuMemcpyHtoD_v2(p, h, half));
        CK(cuMemcpyDtoH_v2(h + half, p, half));
        if (memcmp(h, h + half, half)) { say("pinned: wrong bytes"); return 1; }
        /* Beyond the vGPU's pinned pool it is the process's own memory,
           which the device does not map. */
        CUdeviceptr dp = 0;
        int mapped = cuMemHostGetDevicePointer_v2(&dp, h, 0) == 0 /* CUDA_SUCCESS */;
        snprintf(line, sizeof line, "pinned: OK at 0x%llx%s", (unsigned long long)(size_t)h,
                 mapped ? "" : " (not device-mapped)");
        say(line);
        sleep(atoi(argv[4]));
        CK(cuMemFree_v2(p));
        CK(cuMemFreeHost(h));
        if (cuMemFreeHost(h) == 0) { say("pinned: freed twice"); return 1; }
    } else if (!strcmp(mode, "register") && argc == 4) {
        /* The program's own buffer registered, copied through, given back. */
        size_t bytes = (size_t)atoi(argv[3]) << 20, half = bytes / 2;
        unsigned char *h = aligned_alloc(4096, bytes);
        if (!h) return 2;
        for (size_t i = 0; i < half; i++) h[i] = (unsigned char)(i * 5 + 3);
        memset(h + half, 0, half);
        CK(cuMemHostRegister_v2(h, bytes, 0));
        CUdeviceptr p, dp = 0;
        CK(cuMemAlloc_v2(&p, half));
        CK(cuMemcpyHtoD_v2(p, h, half));
        CK(cuMemcpyDtoH_v2(h + half, p, half));
        int mapped = cuMemHostGetDevicePointer_v2(&dp, h, 0) == 0 /* CUDA_SUCCESS */;
        CK(cuMemHostUnregister(h));
        if (memcmp(h, h + half, half)) { say("register: wrong bytes"); return 1; }
        say(mapped ? "register: OK" : "register: OK (not device-mapped)");
    } else {
        return 2;
    }
    return 0;
}
