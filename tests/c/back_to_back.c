/*
 * One short guest process of a whole-set run (tests/tests/back_to_back.rs):
 * attaches, takes a good part of the VM's memory in one allocation, copies,
 * runs a kernel, checks its result and exits at once, freeing nothing
 * itself (the host's teardown of the process must). Builds with plain cc
 * against the stand-in (the driver's ABI declared here, no cuda.h).
 *
 * usage: back_to_back KERNELS.ptx K KIB [MODE [LINGER_US]]
 *   K     the process's number (its data depend on it, so that a result
 *         left by an earlier process cannot pass for its own)
 *   KIB   KiB allocated at once (the kernel's arrays lie in it)
 *   MODE  when it waits for the previous process to be gone, which it
 *         learns from the end of its standard input (the harness gives it
 *         the previous process's standard output): the previous process's
 *         teardown on the host is then under way, or not yet begun.
 *           now    it does not wait (the default);
 *           wait   it attaches (cuInit, context, module), then waits, then
 *                  allocates;
 *           after  it waits, then attaches and allocates.
 *   LINGER_US  after its last CUDA call and its "done" line, it sleeps
 *         this long before its exit (0 by default): the harness, which
 *         starts the next process at "done", spreads when this one exits
 *         against where the next one is by then.
 *
 * Everything it says goes to standard error (standard output is only the
 * token the next process waits on): "back_to_back K: times ..." (ms:
 * waiting for the previous process, cuInit, context and module, the
 * allocation, copies and kernel and check), "back_to_back K: ok", then
 * "back_to_back K: done". On any failure: one line "FAILED: back_to_back
 * K: ..." naming the call and its error, and exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;

CUresult cuInit(unsigned int);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

static int k = -1;

static const char *cu_name(CUresult r) {
    const char *s = "?";
    cuGetErrorName(r, &s);
    return s;
}

/* The call must succeed, else one line naming it and its error (and what
   the host reports free, for a failed allocation), exit 1. */
#define CK(call)                                                                         \
    do {                                                                                 \
        CUresult r_ = (call);                                                            \
        if (r_ != 0) {                                                                   \
            size_t free_ = 0, total_ = 0;                                                \
            CUresult g_ = cuMemGetInfo_v2(&free_, &total_);                              \
            fprintf(stderr,                                                              \
                    "FAILED: back_to_back %d: line %d: %s -> %d (%s); "                  \
                    "then free %zu of %zu (cuMemGetInfo: %s)\n",                         \
                    k, __LINE__, #call, r_, cu_name(r_), free_, total_, cu_name(g_));    \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define FAIL(...)                                         \
    do {                                                  \
        fprintf(stderr, "FAILED: back_to_back %d: ", k);  \
        fprintf(stderr, __VA_ARGS__);                     \
        exit(1);                                          \
    } while (0)

/* Milliseconds since `t0`. */
static double ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) FAIL("open %s: %s\n", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (!b || fread(b, 1, n, f) != (size_t)n) FAIL("read %s\n", path);
    b[n] = 0;
    fclose(f);
    return b;
}

/* Reads standard input to its end: the previous process has exited (its
   channel let go at its exit, its teardown on the host under way or not
   yet begun). */
static void wait_for_previous(void) {
    char buf[256];
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n == 0) return;
        if (n < 0 && errno != EINTR) FAIL("read stdin: %s\n", strerror(errno));
    }
}

int main(int argc, char **argv) {
    const char *mode = argc >= 5 ? argv[4] : "now";
    if (argc < 4 || argc > 6 ||
        (strcmp(mode, "now") && strcmp(mode, "wait") && strcmp(mode, "after"))) {
        fprintf(stderr, "usage: %s KERNELS.ptx K KIB [now|wait|after [LINGER_US]]\n", argv[0]);
        return 2;
    }
    k = atoi(argv[2]);
    size_t bytes = (size_t)atoi(argv[3]) << 10;
    long linger_us = argc == 6 ? atol(argv[5]) : 0;
    char *ptx = read_file(argv[1]);
    double t[5] = {0};
    struct timespec t0;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!strcmp(mode, "after")) wait_for_previous();
    t[0] = ms_since(&t0);

    /* Attach, as the runtime does: the primary context. */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CK(cuInit(0));
    t[1] = ms_since(&t0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, ptx));
    CUfunction add;
    CK(cuModuleGetFunction(&add, mod, "vector_add"));
    t[2] = ms_since(&t0);

    if (!strcmp(mode, "wait")) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        wait_for_previous();
        t[0] = ms_since(&t0);
    }

    /* A good part of the VM's memory in one piece; the kernel's arrays
       a, b and c in its first 3 n floats. */
    const unsigned n = 1u << 14;
    size_t arr = (size_t)n * sizeof(float);
    if (bytes < 3 * arr) bytes = 3 * arr;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CUdeviceptr big;
    CK(cuMemAlloc_v2(&big, bytes));
    t[3] = ms_since(&t0);
    CUdeviceptr da = big, db = big + arr, dc = big + 2 * arr;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    float *h = malloc(2 * arr), *c = malloc(arr);
    if (!h || !c) FAIL("host malloc\n");
    for (unsigned i = 0; i < n; i++) {
        h[i] = (float)i;                /* a */
        h[n + i] = 0.5f * (float)k + 1; /* b */
    }
    CK(cuMemcpyHtoD_v2(da, h, 2 * arr)); /* a and b at once */
    unsigned nn = n;
    void *args[] = {&da, &db, &dc, &nn};
    CK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    memset(c, 0xff, arr);
    CK(cuMemcpyDtoH_v2(c, dc, arr));
    for (unsigned i = 0; i < n; i++) {
        float want = (float)i + 0.5f * (float)k + 1;
        if (c[i] != want) FAIL("c[%u] = %g, not %g\n", i, c[i], want);
    }
    t[4] = ms_since(&t0);

    fprintf(stderr, "back_to_back %d: times %.3f %.3f %.3f %.3f %.3f\n", k, t[0], t[1], t[2], t[3],
            t[4]);
    fprintf(stderr, "back_to_back %d: ok\n", k);
    fprintf(stderr, "back_to_back %d: done\n", k);
    if (linger_us > 0) usleep(linger_us);
    /* Out at once, freeing nothing: the stand-in's atexit handler lets go
       of the channel, and the host frees the rest. */
    exit(0);
}
