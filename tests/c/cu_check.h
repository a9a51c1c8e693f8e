/*
 * What the driver API test programs (arrays.c, collide.c, ipc.c, vmm.c)
 * share: the driver's ABI for the calls most of them make, declared here so
 * that they build with plain cc and no cuda.h (with -DHAVE_CUDA_H, cuda.h's
 * own declarations instead), and their checks. Each program declares the
 * calls of its own family itself.
 *
 * Every check prints a line: "ok: ..." when it holds, "FAILED: ..." when not
 * (on stdout, flushed at once: the tests read it line by line).
 *   CK(call)           the call must succeed, else the program exits 1.
 *   BAD(what, call)    the call must fail (prints its error), else exit 1.
 *   EXPECT(what, cond) cond must hold, else exit 1.
 *   CHECK(cond, what)  cond should hold; if not, `failed` is set and the
 *                      program goes on (its main returns 1 at the end).
 */
#ifndef FAIRVGPU_TESTS_CU_CHECK_H
#define FAIRVGPU_TESTS_CU_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifdef HAVE_CUDA_H
#include <cuda.h>
#else
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
CUresult cuInit(unsigned int);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned int, size_t);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
#endif

/* Whether a CHECK failed. */
static int failed __attribute__((unused));

/* The name of a driver error, as the driver gives it. */
/* The whole file at `path`, NUL-terminated (a PTX image); exits with 2 if
 * it cannot be read. */
static __attribute__((unused)) char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) {
        perror(path);
        exit(2);
    }
    b[n] = 0;
    fclose(f);
    return b;
}

static __attribute__((unused)) const char *cu_name(CUresult r) {
    const char *s = "?";
    cuGetErrorName(r, &s);
    return s;
}

#define CU_FAIL(...)                  \
    do {                              \
        printf("FAILED: " __VA_ARGS__); \
        fflush(stdout);               \
    } while (0)

#define CK(call)                                                                      \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ != 0) {                                                                \
            CU_FAIL("%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cu_name(r_));     \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define BAD(what, call)                                                               \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ == 0) {                                                                \
            CU_FAIL("%s:%d: %s: %s succeeded\n", __FILE__, __LINE__, what, #call);    \
            exit(1);                                                                  \
        }                                                                             \
        printf("ok: %s refused: %s\n", what, cu_name(r_));                            \
        fflush(stdout);                                                               \
    } while (0)

#define EXPECT(what, cond)                                                            \
    do {                                                                              \
        if (!(cond)) {                                                                \
            CU_FAIL("%s:%d: %s: %s\n", __FILE__, __LINE__, what, #cond);              \
            exit(1);                                                                  \
        }                                                                             \
        printf("ok: %s\n", what);                                                     \
        fflush(stdout);                                                               \
    } while (0)

#define CHECK(cond, what)                                                             \
    do {                                                                              \
        if (cond) {                                                                   \
            printf("ok: %s\n", what);                                                 \
        } else {                                                                      \
            printf("FAILED: %s (line %d)\n", what, __LINE__);                         \
            failed = 1;                                                               \
        }                                                                             \
        fflush(stdout);                                                               \
    } while (0)

#endif
