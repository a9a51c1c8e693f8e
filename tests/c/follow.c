/*
 * A guest process that computes and checks in a loop while its vGPU moves
 * to another daemon (tests/tests/follow.rs): each round adds b (all ones)
 * to a in place on a stream, copies a back into page-locked memory
 * asynchronously, synchronizes and checks a[i] == i + round. A second
 * thread, on a channel of its own, copies a block of its own to the device
 * and back every round and checks it. Prints "round R" after each round
 * (flushed: the test reads them), then "follow ok rounds=R sum=S".
 *
 * usage: follow KERNELS.ptx ROUNDS PAUSE_MS
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include "cu_check.h"

typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);

#define N (64 * 1024)

static CUcontext ctx;
static atomic_int done;
static atomic_long side_rounds;

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* The second thread: its own block, written and read back every round. */
static void *side(void *arg) {
    int pause_ms = *(int *)arg;
    CK(cuCtxSetCurrent(ctx));
    CUdeviceptr d;
    CK(cuMemAlloc_v2(&d, 4096));
    unsigned char out[4096], back[4096];
    for (long r = 1; !atomic_load(&done); r++) {
        memset(out, (int)(r & 0xff), sizeof out);
        CK(cuMemcpyHtoD_v2(d, out, sizeof out));
        CK(cuMemcpyDtoH_v2(back, d, sizeof back));
        if (memcmp(out, back, sizeof out) != 0) {
            CU_FAIL("side thread: round %ld read back other bytes\n", r);
            exit(1);
        }
        atomic_store(&side_rounds, r);
        sleep_ms(pause_ms);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: follow KERNELS.ptx ROUNDS PAUSE_MS\n");
        return 2;
    }
    char *ptx = read_file(argv[1]);
    int rounds = atoi(argv[2]), pause_ms = atoi(argv[3]);
    CUdevice dev;
    CUmodule m;
    CUfunction add;
    CUstream s;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&m, ptx));
    CK(cuModuleGetFunction(&add, m, "vector_add"));
    CK(cuStreamCreate(&s, 0));
    CUdeviceptr a, b;
    CK(cuMemAlloc_v2(&a, N * 4));
    CK(cuMemAlloc_v2(&b, N * 4));
    float *host = malloc(N * 4), *pinned;
    CK(cuMemAllocHost_v2((void **)&pinned, N * 4));
    for (int i = 0; i < N; i++)
        host[i] = (float)i;
    CK(cuMemcpyHtoD_v2(a, host, N * 4));
    for (int i = 0; i < N; i++)
        host[i] = 1.0f;
    CK(cuMemcpyHtoD_v2(b, host, N * 4));
    pthread_t t;
    pthread_create(&t, NULL, side, &pause_ms);
    double sum = 0;
    unsigned n = N;
    for (int r = 1; r <= rounds; r++) {
        void *params[] = {&a, &b, &a, &n};
        CK(cuLaunchKernel(add, N / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
        CK(cuMemcpyDtoHAsync_v2(pinned, a, N * 4, s));
        CK(cuStreamSynchronize(s));
        sum = 0;
        for (int i = 0; i < N; i++) {
            if (pinned[i] != (float)(i + r)) {
                CU_FAIL("round %d: a[%d] = %f, not %d\n", r, i, pinned[i], i + r);
                exit(1);
            }
            sum += pinned[i];
        }
        printf("round %d\n", r);
        fflush(stdout);
        sleep_ms(pause_ms);
    }
    atomic_store(&done, 1);
    pthread_join(t, NULL);
    printf("follow ok rounds=%d sum=%.0f side_rounds=%ld\n", rounds, sum,
           atomic_load(&side_rounds));
    fflush(stdout);
    return 0;
}
