/*
 * A CUDA driver-API program with no CUDA headers: it declares what it uses,
 * with the driver's ABI, so it builds with plain gcc. Links against
 * libcuda.so.1: the real driver, or fairvgpu's stand-in.
 *
 * usage: driver_api KERNELS.ptx [rate|fork]
 * Runs vector add and saxpy with streams and events, checks every element,
 * exercises error reporting and cuGetProcAddress, lists the module's kernels.
 * Exit 0 only if all is right.
 * `rate` also measures launch rates; `fork` forks a child that exits at once
 * (running the atexit handlers it inherited) in the middle, and goes on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

#ifdef __cplusplus
extern "C" {
#endif
CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuCtxSynchronize(void);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned int, size_t);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunctionCount(unsigned int *, CUmodule);
CUresult cuModuleEnumerateFunctions(CUfunction *, unsigned int, CUmodule);
CUresult cuFuncGetName(const char **, CUfunction);
CUresult cuGetExportTable(const void **, const unsigned char *);
CUresult cuFuncGetAttribute(int *, int, CUfunction);
CUresult cuOccupancyMaxPotentialClusterSize(int *, CUfunction, const CUlaunchConfig *);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, CUfunction, int, size_t);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuLinkCreate_v2(unsigned int, int *, void **, void **);
CUresult cuLinkAddData_v2(void *, int, void *, size_t, const char *, unsigned int, int *, void **);
CUresult cuLinkComplete(void *, void **, size_t *);
CUresult cuLinkDestroy(void *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventElapsedTime(float *, CUevent, CUevent);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuGetErrorString(CUresult, const char **);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
#ifdef __cplusplus
}
#endif

#define CK(call) do { CUresult r_ = (call); if (r_ != 0) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, \
    #call, r_, n_); exit(1); } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", __FILE__, \
    __LINE__, #cond); exit(1); } } while (0)

/* What slot 7 of the tools module table visits: the kernel and its name. */
static struct { int n; CUfunction f[16]; const char *name[16]; } visited;

static void visit(void *data, CUfunction f, const char *name) {
    EXPECT(data == &visited);
    if (visited.n < 16) { visited.f[visited.n] = f; visited.name[visited.n] = name; }
    visited.n++;
}

/* A module's kernels by the public API (CUDA 12.4) and through slot 7 of
   the driver's tools module table (6e163fbe; what cuFFT uses): the same
   handles, in the same order, with cuFuncGetName's names; the kernels
   already looked up keep their handles. */
static void enumerate_kernels(CUmodule mod, CUfunction add, CUfunction saxpy) {
    unsigned count = 0;
    CK(cuModuleGetFunctionCount(&count, mod));
    EXPECT(count == 8 /* the .entry directives of fairvgpu.ptx */);
    CUfunction fs[8];
    CK(cuModuleEnumerateFunctions(fs, count, mod));
    int seen_add = 0, seen_saxpy = 0;
    for (unsigned i = 0; i < count; i++) {
        seen_add += fs[i] == add;
        seen_saxpy += fs[i] == saxpy;
    }
    EXPECT(seen_add == 1 && seen_saxpy == 1);

    static const unsigned char id[16] = {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d,
                                         0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e};
    const unsigned long long *table;
    CK(cuGetExportTable((const void **)&table, id));
    EXPECT(table[0] > 7 * 8);
    typedef unsigned (*each_fn)(CUcontext, CUmodule,
                                void (*)(void *, CUfunction, const char *), void *);
    each_fn each = (each_fn)table[7];
    EXPECT(each(NULL, mod, visit, &visited) == count);
    EXPECT(visited.n == (int)count);
    for (unsigned i = 0; i < count; i++) {
        const char *name;
        CK(cuFuncGetName(&name, fs[i]));
        EXPECT(visited.f[i] == fs[i] && visited.name[i] == name);
    }
    /* No callback: the count still. (A null module crashes the driver.) */
    EXPECT(each(NULL, mod, NULL, NULL) == count);
    printf("kernels: %u enumerated, the same through the tools module table\n", count);
}

/* The driver's cluster table (1734dc26, CU_ETID_ClusterPrototype; what
   cuBLASLt asks for before an fp16 or bf16 product on Hopper): a kernel's
   cluster shape set through it reads back through it and through
   cuFuncGetAttribute; the occupancy slots answer as the public calls do. */
static void cluster_table(CUdevice dev, CUfunction f) {
    static const unsigned char id[16] = {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45,
                                         0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca};
    void *const *t;
    CK(cuGetExportTable((const void **)&t, id));
    EXPECT((size_t)t[0] >= 17 * 8);
    typedef CUresult (*set_dim_fn)(CUfunction, int, int, int);
    typedef CUresult (*get_dim_fn)(CUfunction, int *, int *, int *);
    typedef CUresult (*dev_fn)(CUdevice, int *);
    typedef CUresult (*max_size_fn)(CUfunction, int, size_t, int *);
    typedef CUresult (*active_fn)(CUfunction, int, size_t, int, int *);
    int supported = -1;
    CK(((dev_fn)t[8])(dev, &supported));
    int attr_launch = -2;
    CK(cuDeviceGetAttribute(&attr_launch, 120 /* CLUSTER_LAUNCH */, dev));
    EXPECT(supported == attr_launch);
    CK(((set_dim_fn)t[1])(f, 2, 1, 1));
    int x = 0, y = 0, z = 0, w = 0;
    CK(((get_dim_fn)t[5])(f, &x, &y, &z));
    CK(cuFuncGetAttribute(&w, 11 /* REQUIRED_CLUSTER_WIDTH */, f));
    EXPECT(x == 2 && y == 1 && z == 1 && w == 2);
    CK(((set_dim_fn)t[1])(f, 0, 0, 0));
    CK(((get_dim_fn)t[5])(f, &x, &y, &z));
    EXPECT(x == 0 && y == 0 && z == 0);
    int most = 0, active = 0, pub_most = 0;
    CK(((max_size_fn)t[9])(f, 128, 0, &most));
    CUlaunchConfig cfg = {0};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128; cfg.blockDimY = cfg.blockDimZ = 1;
    CK(cuOccupancyMaxPotentialClusterSize(&pub_most, f, &cfg));
    EXPECT(most == pub_most && most > 0);
    CK(((active_fn)t[10])(f, 128, 0, 2, &active));
    EXPECT(active > 0);
    /* A kernel handle that is none is refused, not followed. */
    EXPECT(((get_dim_fn)t[5])((CUfunction)0x1234, &x, &y, &z) != 0);
    printf("cluster table: shape %dx%dx%d round trip, most %d, active %d\n", 2, 1, 1, most, active);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = (char *)malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) { perror("read"); exit(1); }
    b[n] = 0;
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    if (argc != 2 && !(argc == 3 && (strcmp(argv[2], "rate") == 0 || strcmp(argv[2], "fork") == 0))) {
        fprintf(stderr, "usage: %s KERNELS.ptx [rate|fork]\n", argv[0]);
        return 2;
    }
    int fork_mode = argc == 3 && strcmp(argv[2], "fork") == 0;
    CK(cuInit(0));
    int version = 0, count = 0, sms = 0, ccmaj = 0;
    CK(cuDriverGetVersion(&version));
    CK(cuDeviceGetCount(&count));
    EXPECT(count >= 1);
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    char name[128];
    CK(cuDeviceGetName(name, sizeof name, dev));
    CK(cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, dev));
    CK(cuDeviceGetAttribute(&ccmaj, 75 /* COMPUTE_CAPABILITY_MAJOR */, dev));
    size_t total = 0;
    CK(cuDeviceTotalMem_v2(&total, dev));
    printf("device: %s, cc %d, %d SMs, %zu MiB, driver %d\n", name, ccmaj, sms, total >> 20, version);
    EXPECT(sms > 0 && ccmaj > 0 && total > 0);

    CUcontext ctx, popped;
    CK(cuCtxCreate_v2(&ctx, 0, dev));
    CK(cuCtxPopCurrent_v2(&popped));
    EXPECT(popped == ctx);
    CK(cuCtxPushCurrent_v2(ctx));

    char *ptx = read_file(argv[1]);
    CUmodule mod;
    CK(cuModuleLoadData(&mod, ptx));
    CUfunction add, saxpy;
    CK(cuModuleGetFunction(&add, mod, "vector_add"));
    CK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
    int max_threads = 0;
    CK(cuFuncGetAttribute(&max_threads, 0 /* MAX_THREADS_PER_BLOCK */, add));
    EXPECT(max_threads >= 256);
    CUfunction missing;
    EXPECT(cuModuleGetFunction(&missing, mod, "no_such_kernel") == 500 /* NOT_FOUND */);
    enumerate_kernels(mod, add, saxpy);
    cluster_table(dev, add);

    const unsigned n = 1u << 20;
    size_t bytes = (size_t)n * sizeof(float);
    float *a, *b, *c;
    CK(cuMemAllocHost_v2((void **)&a, bytes));
    b = (float *)malloc(bytes);
    c = (float *)malloc(bytes);
    for (unsigned i = 0; i < n; i++) { a[i] = (float)i * 0.5f; b[i] = (float)(n - i) * 0.25f; }
    CUdeviceptr da, db, dc;
    CK(cuMemAlloc_v2(&da, bytes));
    CK(cuMemAlloc_v2(&db, bytes));
    CK(cuMemAlloc_v2(&dc, bytes));
    CUstream s;
    CUevent e0, e1;
    CK(cuStreamCreate(&s, 0));
    CK(cuEventCreate(&e0, 0));
    CK(cuEventCreate(&e1, 0));
    CK(cuMemcpyHtoDAsync_v2(da, a, bytes, s));
    CK(cuMemcpyHtoD_v2(db, b, bytes));
    CK(cuEventRecord(e0, s));
    void *args[] = { &da, &db, &dc, (void *)&n };
    CK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CK(cuEventRecord(e1, s));
    CK(cuMemcpyDtoHAsync_v2(c, dc, bytes, s));
    CK(cuStreamSynchronize(s));
    CK(cuEventSynchronize(e1));
    float ms = -1;
    CK(cuEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    for (unsigned i = 0; i < n; i++) EXPECT(c[i] == a[i] + b[i]);
    printf("vector_add: %u elements correct (%.3f ms)\n", n, ms);

    float alpha = 2.0f;
    void *sargs[] = { &alpha, &da, &db, (void *)&n };
    CK(cuLaunchKernel(saxpy, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, sargs, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH_v2(c, db, bytes));
    for (unsigned i = 0; i < n; i++) EXPECT(c[i] == fmaf(alpha, a[i], b[i]));
    printf("saxpy: %u elements correct\n", n);

    if (fork_mode) {
        /* A child that makes no CUDA call and exits normally: what it
           inherited (the atexit handlers, the open device) must leave the
           parent's vGPU connection as it was. */
        fflush(stdout);
        pid_t child = fork();
        EXPECT(child >= 0);
        if (child == 0) exit(0);
        int status = -1;
        EXPECT(waitpid(child, &status, 0) == child);
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        printf("fork: child exited, parent goes on\n");
    }

    CK(cuMemsetD32_v2(dc, 0x3f800000u, n));
    CK(cuMemcpyDtoH_v2(c, dc, bytes));
    for (unsigned i = 0; i < n; i++) EXPECT(c[i] == 1.0f);

    /* Module globals, occupancy, pointer attributes. */
    CUdeviceptr counter = 0;
    size_t counter_size = 0;
    CK(cuModuleGetGlobal_v2(&counter, &counter_size, mod, "fvg_counter"));
    EXPECT(counter != 0 && counter_size == 4);
    unsigned zero = 0, got = 0;
    CK(cuMemcpyHtoD_v2(counter, &zero, 4));
    CUfunction counter_fn;
    CK(cuModuleGetFunction(&counter_fn, mod, "atomic_count"));
    void *cargs[] = { &counter };
    CK(cuLaunchKernel(counter_fn, 40, 1, 1, 128, 1, 1, 0, NULL, cargs, NULL));
    CK(cuMemcpyDtoH_v2(&got, counter, 4));
    EXPECT(got == 40 * 128);
    int blocks = 0;
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add, 256, 0));
    EXPECT(blocks > 0);
    CUdeviceptr start = 0;
    size_t range = 0;
    unsigned mtype = 0;
    CK(cuPointerGetAttribute(&start, 11 /* RANGE_START_ADDR */, da + 100));
    CK(cuPointerGetAttribute(&range, 12 /* RANGE_SIZE */, da + 100));
    CK(cuPointerGetAttribute(&mtype, 2 /* MEMORY_TYPE */, da));
    EXPECT(start == da && range == bytes && mtype == 2 /* DEVICE */);
    printf("globals, occupancy (%d blocks/SM), pointer attributes: ok\n", blocks);

    /* Link the PTX, load the linked image, run from it. */
    void *link = NULL, *image = NULL;
    size_t image_size = 0;
    CK(cuLinkCreate_v2(0, NULL, NULL, &link));
    CK(cuLinkAddData_v2(link, 1 /* CU_JIT_INPUT_PTX */, ptx, strlen(ptx) + 1, "kernels", 0, NULL, NULL));
    CK(cuLinkComplete(link, &image, &image_size));
    EXPECT(image != NULL && image_size > 0);
    CUmodule linked;
    CK(cuModuleLoadData(&linked, image));
    CK(cuLinkDestroy(link));
    CUfunction add2;
    CK(cuModuleGetFunction(&add2, linked, "vector_add"));
    CK(cuLaunchKernel(add2, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(cuMemcpyDtoH_v2(c, dc, bytes));
    /* db holds the saxpy result by now. */
    for (unsigned i = 0; i < n; i++) EXPECT(c[i] == a[i] + fmaf(alpha, a[i], b[i]));
    CK(cuModuleUnload(linked));
    printf("linked module: vector_add correct\n");

    size_t free_b = 0, total_b = 0;
    CK(cuMemGetInfo_v2(&free_b, &total_b));
    EXPECT(free_b <= total_b);

    /* Errors are reported, by name. */
    const char *ename = NULL, *estr = NULL;
    CUresult bad = cuMemcpyDtoH_v2(c, (CUdeviceptr)0x10, 16);
    EXPECT(bad != 0);
    CK(cuGetErrorName(bad, &ename));
    CK(cuGetErrorString(bad, &estr));
    printf("bad copy refused: %s (%s)\n", ename, estr);

    /* Copies of zero bytes succeed and do nothing, as natively (Numba
       copies zero-size arrays so), whatever the addresses. */
    CK(cuMemcpyDtoH_v2(c, da, 0));
    CK(cuMemcpyDtoH_v2(NULL, 0, 0));
    CK(cuMemcpyHtoD_v2(da, a, 0));
    CK(cuMemcpyDtoD_v2(db, da, 0));
    CK(cuMemcpyDtoHAsync_v2(c, da, 0, NULL));
    CK(cuMemcpy(db, da, 0));
    printf("zero-byte copies: success\n");

    /* cuGetProcAddress hands out working entry points. */
    void *fp = NULL;
    int st = -1;
    CK(cuGetProcAddress_v2("cuMemGetInfo", &fp, 12000, 0, &st));
    EXPECT(fp != NULL && st == 0);
    CK(((CUresult (*)(size_t *, size_t *))fp)(&free_b, &total_b));

    /* Many asynchronous launches in a row (the worker submits runs of them
       together; on a GPU as one graph launch): y += x and x -= y in turn,
       whose order matters. The values stay small integers, exact in f32. */
    {
        const unsigned m = 4096;
        const int steps = 3000;
        float *hx = malloc(m * 4), *hy = malloc(m * 4), *rx = malloc(m * 4), *ry = malloc(m * 4);
        for (unsigned i = 0; i < m; i++) { hx[i] = (float)(i % 7 + 1); hy[i] = (float)(i * 3 % 5); }
        CUdeviceptr dx, dy;
        CK(cuMemAlloc_v2(&dx, m * 4));
        CK(cuMemAlloc_v2(&dy, m * 4));
        CK(cuMemcpyHtoD_v2(dx, hx, m * 4));
        CK(cuMemcpyHtoD_v2(dy, hy, m * 4));
        for (int k = 0; k < steps; k++) {
            float al = k % 2 ? -1.0f : 1.0f;
            void *oargs[] = { &al, k % 2 ? &dy : &dx, k % 2 ? &dx : &dy, (void *)&m };
            CK(cuLaunchKernel(saxpy, (m + 255) / 256, 1, 1, 256, 1, 1, 0, s, oargs, NULL));
            float *src = k % 2 ? hy : hx, *dst = k % 2 ? hx : hy;
            for (unsigned i = 0; i < m; i++) dst[i] = al * src[i] + dst[i];
        }
        CK(cuStreamSynchronize(s));
        CK(cuMemcpyDtoH_v2(rx, dx, m * 4));
        CK(cuMemcpyDtoH_v2(ry, dy, m * 4));
        EXPECT(memcmp(rx, hx, m * 4) == 0 && memcmp(ry, hy, m * 4) == 0);
        CK(cuMemFree_v2(dx));
        CK(cuMemFree_v2(dy));
        free(hx); free(hy); free(rx); free(ry);
        printf("ordered launches: %d in a row, results exact\n", steps);
    }

    if (argc == 3 && !fork_mode) {
        /* Asynchronous launch rate of an empty kernel (enqueue cost as the program sees it). */
        CUfunction empty;
        CK(cuModuleGetFunction(&empty, mod, "empty"));
        for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CK(cuStreamSynchronize(s));
        const int launches = 200000;
        struct timespec t0, t1, t2;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < launches; i++) CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        CK(cuStreamSynchronize(s));
        clock_gettime(CLOCK_MONOTONIC, &t2);
        double enq = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        double all = (t2.tv_sec - t0.tv_sec) + (t2.tv_nsec - t0.tv_nsec) * 1e-9;
        printf("launches=%d enqueue_per_s=%.0f completed_per_s=%.0f\n", launches, launches / enq, launches / all);
        /* Bursts: 128 launches then a synchronize, as a program that launches a
           step's kernels and waits for them; only the launches are timed (the
           rate the program sees while it issues a burst). */
        const int bursts = 1000, burst = 128;
        double in_bursts = 0;
        for (int r = 0; r < bursts; r++) {
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int i = 0; i < burst; i++) CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            clock_gettime(CLOCK_MONOTONIC, &t1);
            CK(cuStreamSynchronize(s));
            in_bursts += (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        }
        printf("bursts=%dx%d burst_enqueue_per_s=%.0f\n", bursts, burst, bursts * burst / in_bursts);
    }

    CK(cuEventDestroy_v2(e0));
    CK(cuEventDestroy_v2(e1));
    CK(cuStreamDestroy_v2(s));
    CK(cuMemFree_v2(da));
    CK(cuMemFree_v2(db));
    CK(cuMemFree_v2(dc));
    CK(cuModuleUnload(mod));
    CK(cuMemFreeHost(a));
    CK(cuCtxDestroy_v2(ctx));
    free(b); free(c); free(ptx);
    printf("driver_api: all checks passed\n");
    return 0;
}
