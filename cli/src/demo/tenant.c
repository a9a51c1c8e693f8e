/*
 * `fairvgpu demo`'s tenant: an ordinary CUDA driver-API program. It has no
 * CUDA headers (it declares the driver's ABI it uses), builds with plain cc
 * and links against libcuda.so.1: the real driver, or fairvgpu's stand-in.
 *
 * usage: tenant KERNELS.ptx SECONDS [check]
 * Keeps its GPU busy with 2 ms `spin_ns` kernels, eight per
 * cuCtxSynchronize, until SIGTERM or SIGINT, or SECONDS have passed. With
 * `check` it first runs vector_add and saxpy on 1 Mi elements and checks
 * every element. Prints `running` once its first round is done, and how many
 * kernels it ran on the way out. Exit 0 only if every call succeeded.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuGetErrorName(CUresult, const char **);

#define CK(call)                                                                  \
    do {                                                                          \
        CUresult r_ = (call);                                                     \
        if (r_ != 0) {                                                            \
            const char *n_ = "?";                                                 \
            cuGetErrorName(r_, &n_);                                              \
            fprintf(stderr, "tenant: %s failed: %d (%s)\n", #call, r_, n_);      \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* vector_add and saxpy on 1 Mi elements, every element checked. */
static int check(CUmodule mod) {
    unsigned n = 1u << 20;
    size_t size = (size_t)n * sizeof(float);
    float *a = malloc(size), *b = malloc(size), *c = malloc(size);
    if (!a || !b || !c) {
        fprintf(stderr, "tenant: out of memory\n");
        return 1;
    }
    for (unsigned i = 0; i < n; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = (float)(n - i) * 0.25f;
    }
    CUdeviceptr da, db, dc;
    CK(cuMemAlloc_v2(&da, size));
    CK(cuMemAlloc_v2(&db, size));
    CK(cuMemAlloc_v2(&dc, size));
    CK(cuMemcpyHtoD_v2(da, a, size));
    CK(cuMemcpyHtoD_v2(db, b, size));
    CUfunction add, saxpy;
    CK(cuModuleGetFunction(&add, mod, "vector_add"));
    CK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
    void *add_args[] = {&da, &db, &dc, &n};
    CK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, add_args, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH_v2(c, dc, size));
    unsigned wrong = 0;
    for (unsigned i = 0; i < n; i++)
        wrong += c[i] != a[i] + b[i];
    printf("vector_add: %u elements, %u wrong\n", n, wrong);
    float alpha = 3.0f;
    void *saxpy_args[] = {&alpha, &da, &db, &n};
    CK(cuLaunchKernel(saxpy, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, saxpy_args, NULL));
    CK(cuMemcpyDtoH_v2(c, db, size));
    unsigned wrong2 = 0;
    for (unsigned i = 0; i < n; i++) {
        float want = alpha * a[i] + b[i];
        /* The device fuses the multiply-add: allow its last bit. */
        float d = c[i] - want;
        wrong2 += (d < 0 ? -d : d) > 1e-6f * (want < 0 ? -want : want);
    }
    printf("saxpy: %u elements, %u wrong\n", n, wrong2);
    CK(cuMemFree_v2(da));
    CK(cuMemFree_v2(db));
    CK(cuMemFree_v2(dc));
    free(a);
    free(b);
    free(c);
    fflush(stdout);
    return wrong || wrong2;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "check") != 0)) {
        fprintf(stderr, "usage: %s KERNELS.ptx SECONDS [check]\n", argv[0]);
        return 2;
    }
    char *end;
    double seconds = strtod(argv[2], &end);
    if (*end || !(seconds > 0)) {
        fprintf(stderr, "tenant: SECONDS %s: give a positive number\n", argv[2]);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    char name[128];
    size_t total;
    CK(cuDeviceGetName(name, sizeof name, dev));
    CK(cuDeviceTotalMem_v2(&total, dev));
    printf("device %s, %zu MiB\n", name, total >> 20);
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoad(&mod, argv[1]));
    if (argc == 4 && check(mod))
        return 1;
    CK(cuModuleGetFunction(&spin, mod, "spin_ns"));

    unsigned long long ns = 2000000ull, kernels = 0;
    void *args[] = {&ns};
    double start = now();
    int first = 1;
    while (!stop && now() - start < seconds) {
        for (int i = 0; i < 8; i++)
            CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
        CK(cuCtxSynchronize());
        kernels += 8;
        if (first) {
            printf("running\n");
            fflush(stdout);
            first = 0;
        }
    }
    printf("%llu kernels of 2 ms in %.1f s\n", kernels, now() - start);
    CK(cuModuleUnload(mod));
    CK(cuDevicePrimaryCtxRelease_v2(dev));
    return 0;
}
