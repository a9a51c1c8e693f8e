/*
 * IPC memory handles between two processes of one VM, driven line by line
 * on stdin by the test (tests/tests/libcuda_ipc.rs):
 *
 *   ipc export     allocates and fills memory, records an interprocess
 *                  event, prints "handle HEX" and "event HEX"; then on
 *                  "check" checks what the importer wrote into the memory
 *                  and frees it and the event; on "exit" leaves.
 *   ipc import HEX EHEX  opens both handles, waits on the event, checks
 *                  the exporter's bytes, writes its own; on "after-free"
 *                  checks that the memory stays while it has it open and
 *                  the event handle opens nothing once the exporter let
 *                  them go, closes and leaves.
 *   ipc stale HEX  checks that a handle whose memory is gone opens nothing.
 *
 * Builds with plain gcc against the driver's ABI, declared below and in
 * cu_check.h, with the checks. Every
 * check prints "ok: ..." or "FAILED: ..."; exit 0 only if all passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_check.h"

typedef struct CUevent_st *CUevent;
typedef struct {
    char reserved[64];
} CUipcMemHandle;
typedef struct {
    char reserved[64];
} CUipcEventHandle;
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventQuery(CUevent);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int);
CUresult cuIpcGetEventHandle(CUipcEventHandle *, CUevent);
CUresult cuIpcOpenEventHandle(CUevent *, CUipcEventHandle);
#define EVENT_DISABLE_TIMING 2
#define EVENT_INTERPROCESS 4
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2
#define LAZY_ENABLE_PEER_ACCESS 1
#define STREAM_NON_BLOCKING 1
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);

#define WORDS (256u * 1024u) /* 1 MiB */
#define HALF (WORDS / 2)

static unsigned host[WORDS];

/* Waits for the test to say `word`. */
static void await(const char *word) {
    char line[64];
    if (!fgets(line, sizeof line, stdin) || strncmp(line, word, strlen(word))) {
        printf("FAILED: expected \"%s\" on stdin\n", word);
        exit(1);
    }
}

static void print_hex(const char *what, const void *h) {
    printf("%s ", what);
    for (int i = 0; i < 64; i++) printf("%02x", ((const unsigned char *)h)[i]);
    printf("\n");
    fflush(stdout);
}

static void parse(const char *hex, void *out) {
    char *h = out;
    if (strlen(hex) != 128) {
        printf("FAILED: a handle is 128 hex digits\n");
        exit(1);
    }
    for (int i = 0; i < 64; i++) {
        unsigned b;
        sscanf(hex + 2 * i, "%2x", &b);
        h[i] = (char)b;
    }
}

static int exporter(void) {
    CUdeviceptr p, other;
    CK(cuMemAlloc_v2(&p, sizeof host));
    CK(cuMemAlloc_v2(&other, 4096));
    for (unsigned i = 0; i < WORDS; i++) host[i] = i * 7u;
    CK(cuMemcpyHtoD_v2(p, host, sizeof host));
    CUipcMemHandle h, again, inner;
    CK(cuIpcGetMemHandle(&h, p));
    CK(cuIpcGetMemHandle(&again, p));
    CK(cuIpcGetMemHandle(&inner, p + 4096));
    CHECK(!memcmp(&h, &again, sizeof h) && !memcmp(&h, &inner, sizeof h),
          "the same allocation has one handle");
    CUdeviceptr q = 0;
    CHECK(cuIpcOpenMemHandle_v2(&q, h, LAZY_ENABLE_PEER_ACCESS) == 201,
          "a process cannot open its own handle (CUDA_ERROR_INVALID_CONTEXT)");
    CHECK(cuIpcGetMemHandle(&again, (CUdeviceptr)(size_t)host) != 0, "no handle for host memory");
    CUevent ev, plain;
    CK(cuEventCreate(&ev, EVENT_DISABLE_TIMING | EVENT_INTERPROCESS));
    CK(cuEventCreate(&plain, EVENT_DISABLE_TIMING));
    CUipcEventHandle eh;
    CHECK(cuIpcGetEventHandle(&eh, plain) != 0, "no handle for an event made without CU_EVENT_INTERPROCESS");
    CK(cuIpcGetEventHandle(&eh, ev));
    CUevent mine_again;
    CHECK(cuIpcOpenEventHandle(&mine_again, eh) != 0, "a process cannot open its own event handle");
    CK(cuMemsetD32_v2(p + 4 * (WORDS - 1), 0xe7e7e7e7u, 1));
    CK(cuEventRecord(ev, 0));
    print_hex("handle", &h);
    print_hex("event", &eh);

    await("check");
    CK(cuMemcpyDtoH_v2(host, p, sizeof host));
    int right = 1;
    for (unsigned i = 0; i < WORDS; i++)
        right &= host[i] == (i < HALF ? 0x5a5a5a5au : i == WORDS - 1 ? 0xe7e7e7e7u : i * 7u);
    CHECK(right, "the exporter sees the importer's writes");
    CK(cuEventDestroy_v2(ev));
    CK(cuEventDestroy_v2(plain));
    CK(cuMemFree_v2(p));
    CK(cuMemFree_v2(other));
    printf("freed\n");
    fflush(stdout);
    await("exit");
    return 0;
}

static int importer(const char *hex, const char *ehex) {
    CUipcMemHandle h;
    CUipcEventHandle eh;
    parse(hex, &h);
    parse(ehex, &eh);
    CUevent ev, ev2;
    CK(cuIpcOpenEventHandle(&ev, eh));
    CK(cuStreamWaitEvent(0, ev, 0));
    CK(cuEventSynchronize(ev));
    CHECK(cuEventQuery(ev) == 0, "an opened event is waited on, synchronized and queried");
    CK(cuIpcOpenEventHandle(&ev2, eh));
    CK(cuEventDestroy_v2(ev2));
    CUdeviceptr p = 0, p2 = 0;
    CK(cuIpcOpenMemHandle_v2(&p, h, LAZY_ENABLE_PEER_ACCESS));
    /* As simpleIPC's children do: on a stream of their own, wait on the
     * opened event, work on the opened memory, record the opened event,
     * wait on it again and copy the memory out asynchronously. */
    CUstream st;
    CK(cuStreamCreate(&st, STREAM_NON_BLOCKING));
    CK(cuStreamWaitEvent(st, ev, 0));
    CK(cuMemsetD32Async(p + 4 * (WORDS - 1), 0xe7e7e7e7u, 1, st));
    CK(cuEventRecord(ev, st));
    CK(cuStreamWaitEvent(st, ev, 0));
    static unsigned tail[16];
    CK(cuMemcpyDtoHAsync_v2(tail, p + 4 * (WORDS - 16), sizeof tail, st));
    CK(cuStreamSynchronize(st));
    CHECK(tail[15] == 0xe7e7e7e7u && tail[0] == (WORDS - 16) * 7u,
          "an opened event recorded on a stream of this process orders its work");
    CK(cuStreamDestroy_v2(st));
    CK(cuEventDestroy_v2(ev));
    CHECK(cuIpcOpenMemHandle_v2(&p2, h, 0) == 1, "an open without the lazy peer access flag refused");
    CK(cuIpcOpenMemHandle_v2(&p2, h, LAZY_ENABLE_PEER_ACCESS));
    CHECK(p2 == p, "a second open gives the same address");
    CK(cuMemcpyDtoH_v2(host, p, sizeof host));
    int right = 1;
    for (unsigned i = 0; i < WORDS - 1; i++) right &= host[i] == i * 7u;
    CHECK(right && host[WORDS - 1] == 0xe7e7e7e7u, "the importer reads the exporter's bytes, after its event");
    unsigned type = 0;
    CK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 64));
    CHECK(type == CU_MEMORYTYPE_DEVICE, "opened memory is device memory to pointer queries");
    CUdeviceptr base = 0;
    size_t size = 0;
    CK(cuMemGetAddressRange_v2(&base, &size, p + 100));
    CHECK(base == p && size == sizeof host, "and has the exporter's range");
    CK(cuMemsetD32_v2(p, 0x5a5a5a5au, HALF));
    CUdeviceptr mine;
    CK(cuMemAlloc_v2(&mine, 4096));
    CK(cuMemcpy(mine, p + 4 * HALF, 4096));
    CK(cuMemcpyDtoH_v2(host, mine, 16));
    CHECK(host[0] == HALF * 7u, "a copy of inferred direction from opened memory");
    CHECK(cuMemFree_v2(p) != 0, "opened memory is not freed by the importer");
    CK(cuCtxSynchronize());
    CK(cuIpcCloseMemHandle(p));
    printf("written\n");
    fflush(stdout);

    await("after-free");
    CHECK(cuMemcpyDtoH_v2(host, p, 64) == 0 && host[0] == 0x5a5a5a5au,
          "memory its exporter freed stays while opened, as the driver keeps it");
    CHECK(cuIpcOpenEventHandle(&ev, eh) != 0, "a handle of a destroyed event opens nothing");
    CHECK(cuIpcCloseMemHandle(p) == 0, "still closed as often as opened");
    CHECK(cuIpcCloseMemHandle(p) != 0, "one close too many refused");
    CK(cuMemFree_v2(mine));
    return 0;
}

static int stale(const char *hex) {
    CUipcMemHandle h;
    parse(hex, &h);
    CUdeviceptr p = 0;
    CHECK(cuIpcOpenMemHandle_v2(&p, h, LAZY_ENABLE_PEER_ACCESS) == 1, "a handle of freed memory opens nothing");
    h.reserved[9] ^= 0x40;
    CHECK(cuIpcOpenMemHandle_v2(&p, h, LAZY_ENABLE_PEER_ACCESS) == 1, "a forged handle opens nothing");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    int r = 1;
    if (argc == 2 && !strcmp(argv[1], "export"))
        r = exporter();
    else if (argc == 4 && !strcmp(argv[1], "import"))
        r = importer(argv[2], argv[3]);
    else if (argc == 3 && !strcmp(argv[1], "stale"))
        r = stale(argv[2]);
    else
        printf("usage: ipc export | ipc import HEX EVENT_HEX | ipc stale HEX\n");
    CK(cuDevicePrimaryCtxRelease_v2(dev));
    if (failed) return 1;
    if (!r) printf("ipc %s: all checks passed\n", argv[1]);
    return r;
}
