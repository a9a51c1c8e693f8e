/*
 * A CUDA runtime-API program (NVIDIA's libcudart.so), built with plain gcc
 * against the runtime's headers; it runs on a real GPU or through
 * fairvgpu's libcuda.so.1 stand-in.
 *
 * usage: runtime_api KERNELS.ptx
 * KERNELS.ptx: worker/kernels/fairvgpu.ptx (vector_add, spin_ns, ...),
 * loaded with cudaLibraryLoadData and launched with cudaLaunchKernel.
 * Checks device properties, allocations, copies both ways, memsets, a
 * launch, events, stream callbacks and host functions (their order in the
 * stream), stream-ordered allocation, page-locked (cudaMallocHost,
 * cudaHostAlloc mapped), registered and managed memory with pointer
 * attributes, two threads at once (one waiting on a long kernel while
 * the other keeps calling), and a thread-exit destructor that frees the
 * thread's memory after the thread's own state is gone (as cudart's and
 * the frameworks' destructors do). Exit 0 only if all is
 * right; the last line says so.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)e_, \
    cudaGetErrorString(e_)); exit(1); } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", \
    __FILE__, __LINE__, #cond); exit(1); } } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) { perror("read"); exit(1); }
    b[n] = 0;
    fclose(f);
    return b;
}

static cudaKernel_t vector_add, spin_ns;

/* What the callbacks saw, in the order they ran. */
static atomic_int order[4];
static atomic_int ran;

static void CUDART_CB host_fn(void *data) {
    order[atomic_fetch_add(&ran, 1)] = (int)(long)data;
}

static void CUDART_CB stream_cb(cudaStream_t s, cudaError_t status, void *data) {
    (void)s;
    if (status == cudaSuccess)
        order[atomic_fetch_add(&ran, 1)] = (int)(long)data;
}

/* Thread A: a long kernel (2 s on the sim) and a wait for it. */
static double a_wait_ms;
static atomic_int a_done, a_launched;
static void *waiter(void *arg) {
    (void)arg;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long ns = 2000ull * 1000 * 1000;
    void *args[] = {&ns};
    dim3 one = {1, 1, 1};
    double t0 = now_ms();
    CK(cudaLaunchKernel((const void *)spin_ns, one, one, args, 0, s));
    atomic_store(&a_launched, 1);
    CK(cudaStreamSynchronize(s));
    a_wait_ms = now_ms() - t0;
    atomic_store(&a_done, 1);
    CK(cudaStreamDestroy(s));
    return NULL;
}

/* Thread B: calls that wait for no device work (allocations, events,
   queries) go on while thread A waits: all of them return before A's wait
   does. */
static double b_ms;
static int b_before_a;
static void *caller(void *arg) {
    (void)arg;
    void *p[100];
    double t0 = now_ms();
    for (int i = 0; i < 100; i++) {
        CK(cudaMalloc(&p[i], 4096));
        cudaEvent_t e;
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CK(cudaEventDestroy(e));
        int v;
        CK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    }
    b_ms = now_ms() - t0;
    b_before_a = !atomic_load(&a_done);
    for (int i = 0; i < 100; i++)
        CK(cudaFree(p[i]));
    return NULL;
}

/* A thread's memory freed by its pthread key destructor, which runs after
 * the thread's C++ and Rust thread-locals are destroyed. */
static pthread_key_t exit_key;
static atomic_int exit_rc = -1;
static void at_thread_exit(void *p) { atomic_store(&exit_rc, (int)cudaFree(p)); }
static void *exiter(void *arg) {
    (void)arg;
    void *p;
    if (cudaMalloc(&p, 4096) == cudaSuccess) pthread_setspecific(exit_key, p);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s KERNELS.ptx\n", argv[0]); return 2; }

    int n = 0, drv = 0, rt = 0;
    CK(cudaGetDeviceCount(&n));
    EXPECT(n >= 1);
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    EXPECT(p.major >= 7 && p.multiProcessorCount > 0 && p.totalGlobalMem > 0);
    EXPECT(p.maxThreadsPerBlock == 1024 && p.warpSize == 32);
    printf("device: %s, sm %d.%d, %d SMs, %zu MiB, driver %d, runtime %d\n", p.name, p.major,
           p.minor, p.multiProcessorCount, p.totalGlobalMem >> 20, drv, rt);

    char *ptx = read_file(argv[1]);
    cudaLibrary_t lib;
    CK(cudaLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CK(cudaLibraryGetKernel(&vector_add, lib, "vector_add"));
    CK(cudaLibraryGetKernel(&spin_ns, lib, "spin_ns"));

    /* Allocations, copies both ways, a memset, a launch. */
    const unsigned N = 1 << 20;
    size_t bytes = N * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
    for (unsigned i = 0; i < N; i++) { ha[i] = (float)i; hb[i] = 0.5f * (float)i; }
    float *a, *b, *c;
    CK(cudaMalloc((void **)&a, bytes));
    CK(cudaMalloc((void **)&b, bytes));
    CK(cudaMalloc((void **)&c, bytes));
    CK(cudaMemcpy(a, ha, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb, bytes, cudaMemcpyDefault));
    CK(cudaMemset(c, 0xff, bytes));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, s));
    void *args[] = {&a, &b, &c, (void *)&N};
    dim3 grid = {(N + 255) / 256, 1, 1}, block = {256, 1, 1};
    CK(cudaLaunchKernel((const void *)vector_add, grid, block, args, 0, s));
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1, s));
    CK(cudaMemcpyAsync(hc, c, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (unsigned i = 0; i < N; i++)
        if (hc[i] != 1.5f * (float)i) { fprintf(stderr, "c[%u] = %f\n", i, hc[i]); return 1; }
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    printf("vector_add: %u elements correct (%.3f ms)\n", N, ms);

    /* Host functions and callbacks run in stream order: after the work
       before them, before the work after them. */
    unsigned long long ns = 20ull * 1000 * 1000;
    void *spin_args[] = {&ns};
    dim3 one = {1, 1, 1};
    CK(cudaLaunchKernel((const void *)spin_ns, one, one, spin_args, 0, s));
    CK(cudaLaunchHostFunc(s, host_fn, (void *)1));
    CK(cudaStreamAddCallback(s, stream_cb, (void *)2, 0));
    CK(cudaLaunchHostFunc(s, host_fn, (void *)3));
    cudaEvent_t after;
    CK(cudaEventCreate(&after));
    CK(cudaEventRecord(after, s));
    CK(cudaEventSynchronize(after));
    EXPECT(atomic_load(&ran) == 3);
    EXPECT(order[0] == 1 && order[1] == 2 && order[2] == 3);
    printf("callbacks: 3 ran in stream order\n");

    /* Stream-ordered allocation. */
    float *t;
    CK(cudaMallocAsync((void **)&t, bytes, s));
    CK(cudaMemcpyAsync(t, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync(hc, t, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaFreeAsync(t, s));
    CK(cudaStreamSynchronize(s));
    EXPECT(memcmp(hc, ha, bytes) == 0);
    printf("stream-ordered allocation: copy through it correct\n");

    /* Page-locked memory: asynchronous copies both ways through it, its
       device address, what the runtime says it is. */
    float *pin;
    CK(cudaMallocHost((void **)&pin, bytes));
    memcpy(pin, ha, bytes);
    CK(cudaMemcpyAsync(c, pin, bytes, cudaMemcpyHostToDevice, s));
    memset(hc, 0, bytes);
    float *pin2;
    CK(cudaHostAlloc((void **)&pin2, bytes, cudaHostAllocMapped));
    CK(cudaMemcpyAsync(pin2, c, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    EXPECT(memcmp(pin2, ha, bytes) == 0);
    void *dev_view = NULL;
    CK(cudaHostGetDevicePointer(&dev_view, pin2, 0));
    EXPECT(dev_view != NULL);
    struct cudaPointerAttributes at;
    CK(cudaPointerGetAttributes(&at, pin2));
    EXPECT(at.type == cudaMemoryTypeHost && at.devicePointer == dev_view);
    CK(cudaPointerGetAttributes(&at, c));
    EXPECT(at.type == cudaMemoryTypeDevice);
    CK(cudaPointerGetAttributes(&at, ha));
    EXPECT(at.type == cudaMemoryTypeUnregistered);
    CK(cudaFreeHost(pin));
    CK(cudaFreeHost(pin2));
    printf("pinned: copies both ways through page-locked memory correct\n");

    /* Registered memory: the program's own buffer, copied through both ways,
       keeps its contents after it is unregistered. */
    float *reg = malloc(bytes + 100);
    float *r = (float *)((char *)reg + 4); /* not page-aligned */
    for (unsigned i = 0; i < N; i++) r[i] = 2.0f * (float)i;
    CK(cudaHostRegister(r, bytes, cudaHostRegisterDefault));
    CK(cudaMemcpyAsync(c, r, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(a, 0, bytes, s));
    CK(cudaMemcpyAsync(r, a, bytes / 2, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaHostUnregister(r));
    for (unsigned i = 0; i < N; i++) {
        float want = i < N / 2 ? 0.0f : 2.0f * (float)i;
        if (r[i] != want) { fprintf(stderr, "registered r[%u] = %f\n", i, r[i]); return 1; }
    }
    CK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < N; i++)
        if (hc[i] != 2.0f * (float)i) { fprintf(stderr, "c[%u] = %f\n", i, hc[i]); return 1; }
    free(reg);
    printf("registered: copies both ways correct, contents kept after unregistering\n");

    /* Managed memory: the same bytes on both sides. */
    float *m;
    CK(cudaMallocManaged((void **)&m, bytes, cudaMemAttachGlobal));
    for (unsigned i = 0; i < N; i++) m[i] = (float)i + 0.25f;
    CK(cudaMemcpy(c, m, bytes, cudaMemcpyDefault));
    CK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
    EXPECT(memcmp(hc, m, bytes) == 0);
    CK(cudaPointerGetAttributes(&at, m));
    EXPECT(at.type == cudaMemoryTypeManaged);
    CK(cudaFree(m));
    printf("managed: host writes seen by the device\n");

    /* Two threads at once: B's calls are not held up by A's wait. */
    pthread_t ta, tb;
    pthread_create(&ta, NULL, waiter, NULL);
    /* B starts once A is in its wait. */
    while (!atomic_load(&a_launched)) ;
    struct timespec settle = {0, 50 * 1000 * 1000};
    nanosleep(&settle, NULL);
    pthread_create(&tb, NULL, caller, NULL);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    EXPECT(b_before_a);
    printf("threads: B made 400 calls in %.1f ms while A waited %.1f ms for its kernel\n", b_ms,
           a_wait_ms);

    pthread_t te;
    EXPECT(pthread_key_create(&exit_key, at_thread_exit) == 0);
    pthread_create(&te, NULL, exiter, NULL);
    pthread_join(te, NULL);
    EXPECT(atomic_load(&exit_rc) == 0);
    printf("thread exit: a destructor freed the thread's memory\n");

    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaStreamDestroy(s));
    CK(cudaLibraryUnload(lib));
    printf("runtime_api: all checks passed\n");
    return 0;
}
