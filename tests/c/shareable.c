/*
 * Shareable handles (POSIX file descriptors) between two processes of one
 * VM, as memMapIPCDrv and streamOrderedAllocationIPC use them
 * (tests/tests/libcuda_shareable.rs):
 *
 *   shareable      the importer: starts the exporter (itself, "export FD"),
 *                  receives its descriptors over a Unix socket (SCM_RIGHTS)
 *                  and the pool pointer's export data; refuses descriptors
 *                  that are not handles; imports and maps the exporter's
 *                  VMM memory, reads its bytes and writes its own; imports
 *                  the pool and the pointer, reads it, frees it; asks the
 *                  exporter to check the writes and to leave; then the
 *                  descriptors import nothing, and what it mapped stays
 *                  until it unmaps it.
 *   shareable export FD  the exporter, on socket FD.
 *
 * Every check prints "ok: ..." or "FAILED: ..."; exit 0 only if all passed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cu_check.h"

typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct {
    int type;
    int id;
} CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
typedef struct {
    unsigned char reserved[64];
} CUmemPoolPtrExportData;
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *,
                                                CUmemGenericAllocationHandle);
CUresult cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle, int,
                                      unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *, int);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolExportToShareableHandle(void *, CUmemoryPool, int, unsigned long long);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *, void *, int, unsigned long long);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *, CUdeviceptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
CUresult cuMemPoolGetAccess(int *, CUmemoryPool, CUmemLocation *);

#define POSIX_FD 1
#define WIN32 2
#define G (2u << 20)
#define POOL_BYTES (1u << 20)
#define FD(x) ((void *)(uintptr_t)(x))

/* What the exporter sends with its two descriptors. */
struct msg {
    CUmemPoolPtrExportData ptr;
    CUdeviceptr pool_ptr;
};

static void send_fds(int sock, int a, int b, const void *data, size_t len) {
    char ctl[CMSG_SPACE(2 * sizeof(int))];
    memset(ctl, 0, sizeof ctl);
    struct iovec iov = {(void *)data, len};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {a, b};
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    if (sendmsg(sock, &m, 0) < 0) {
        perror("sendmsg");
        exit(1);
    }
}

static void recv_fds(int sock, int *a, int *b, void *data, size_t len) {
    char ctl[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {data, len};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(sock, &m, 0) != (ssize_t)len) {
        perror("recvmsg");
        exit(1);
    }
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS) {
        CU_FAIL("no descriptors came\n");
        exit(1);
    }
    int fds[2];
    memcpy(fds, CMSG_DATA(c), sizeof fds);
    *a = fds[0];
    *b = fds[1];
}

static void say(int sock, const char *w) {
    if (send(sock, w, strlen(w), 0) < 0) {
        perror("send");
        exit(1);
    }
}

static void hear(int sock, const char *w) {
    char buf[32] = {0};
    if (recv(sock, buf, sizeof buf - 1, 0) <= 0 || strcmp(buf, w) != 0) {
        CU_FAIL("expected \"%s\", got \"%s\"\n", w, buf);
        exit(1);
    }
}

static CUmemAllocationProp vmm_prop(int types) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = 1; /* pinned */
    p.requestedHandleTypes = types;
    p.location.type = 1; /* device */
    return p;
}

static CUdeviceptr map_rw(CUmemGenericAllocationHandle h) {
    CUdeviceptr d;
    CK(cuMemAddressReserve(&d, 2 * G, 0, 0, 0));
    CK(cuMemMap(d, G, 0, h, 0));
    CUmemAccessDesc acc = {{1, 0}, 3};
    CK(cuMemSetAccess(d, G, &acc, 1));
    return d;
}

static unsigned word_at(CUdeviceptr p) {
    unsigned w = 0;
    CK(cuMemcpyDtoH_v2(&w, p, sizeof w));
    return w;
}

static int exporter(int sock) {
    CUmemAllocationProp prop = vmm_prop(POSIX_FD);
    CUmemGenericAllocationHandle h, plain;
    CK(cuMemCreate(&h, G, &prop, 0));
    CUdeviceptr d = map_rw(h);
    CK(cuMemsetD32_v2(d, 0x11111111, G / 4));
    int fd = -1;
    BAD("a Windows handle", cuMemExportToShareableHandle(&fd, h, WIN32, 0));
    CUmemAllocationProp no_types = vmm_prop(0);
    CK(cuMemCreate(&plain, G, &no_types, 0));
    BAD("export of memory made without the descriptor type",
        cuMemExportToShareableHandle(&fd, plain, POSIX_FD, 0));
    CK(cuMemRelease(plain));
    CK(cuMemExportToShareableHandle(&fd, h, POSIX_FD, 0));
    EXPECT("the exported handle is a descriptor", fcntl(fd, F_GETFD) >= 0);

    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = 1;
    pp.handleTypes = POSIX_FD;
    pp.location.type = 1;
    CUmemoryPool pool;
    CK(cuMemPoolCreate(&pool, &pp));
    struct msg m;
    CK(cuMemAllocFromPoolAsync(&m.pool_ptr, POOL_BYTES, pool, 0));
    CK(cuMemsetD32_v2(m.pool_ptr, 0x22222222, POOL_BYTES / 4));
    int pfd = -1;
    CK(cuMemPoolExportToShareableHandle(&pfd, pool, POSIX_FD, 0));
    CK(cuMemPoolExportPointer(&m.ptr, m.pool_ptr));

    send_fds(sock, fd, pfd, &m, sizeof m);
    /* Sent: the importer's copies are its own. */
    close(fd);
    close(pfd);
    hear(sock, "check");
    say(sock, word_at(d + G / 2) == 0x33333333 ? "checked" : "bad");
    hear(sock, "exit");
    /* Lets go of its own handle and mapping; the importer's stays. */
    CK(cuMemUnmap(d, G));
    CK(cuMemAddressFree(d, 2 * G));
    CK(cuMemRelease(h));
    return 0;
}

static int importer(char *self) {
    int v = 0;
    CK(cuDeviceGetAttribute(&v, 103, 0));
    EXPECT("the device serves descriptors", v == 1);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        char arg[16];
        snprintf(arg, sizeof arg, "%d", sv[1]);
        execl("/proc/self/exe", self, "export", arg, (char *)NULL);
        perror("exec");
        _exit(1);
    }
    close(sv[1]);
    int sock = sv[0], fd, pfd;
    struct msg m;
    recv_fds(sock, &fd, &pfd, &m, sizeof m);

    /* Descriptors that are not handles. */
    CUmemGenericAllocationHandle ih;
    int p[2];
    if (pipe(p) != 0) {
        perror("pipe");
        return 1;
    }
    BAD("a closed descriptor", cuMemImportFromShareableHandle(&ih, FD(1000), POSIX_FD));
    BAD("a pipe", cuMemImportFromShareableHandle(&ih, FD(p[0]), POSIX_FD));
    BAD("a pool's descriptor as memory", cuMemImportFromShareableHandle(&ih, FD(pfd), POSIX_FD));
    BAD("a Windows handle", cuMemImportFromShareableHandle(&ih, FD(fd), WIN32));
    int forged = memfd_create("forged", MFD_ALLOW_SEALING);
    unsigned char bytes[64] = "fvgshr01";
    bytes[8] = 1;  /* memory */
    bytes[16] = 7; /* a made-up token */
    if (write(forged, bytes, sizeof bytes) != sizeof bytes ||
        fcntl(forged, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0) {
        perror("forging");
        return 1;
    }
    BAD("a forged descriptor", cuMemImportFromShareableHandle(&ih, FD(forged), POSIX_FD));
    close(forged);
    close(p[0]);
    close(p[1]);

    /* The exporter's VMM memory, mapped here. */
    int dup_fd = dup(fd);
    CK(cuMemImportFromShareableHandle(&ih, FD(dup_fd), POSIX_FD));
    CUmemAllocationProp got;
    CK(cuMemGetAllocationPropertiesFromHandle(&got, ih));
    EXPECT("an imported handle's properties",
           got.type == 1 && got.requestedHandleTypes == POSIX_FD && got.location.type == 1 &&
               got.location.id == 0);
    CUdeviceptr d = map_rw(ih);
    /* Held by its mapping, as memMapIPCDrv does. */
    CK(cuMemRelease(ih));
    EXPECT("the exporter's bytes", word_at(d) == 0x11111111 && word_at(d + G - 4) == 0x11111111);
    CK(cuMemsetD32_v2(d + G / 2, 0x33333333, G / 8));

    /* The pool and its allocation. */
    CUmemoryPool ipool, mine;
    BAD("memory as a pool", cuMemPoolImportFromShareableHandle(&ipool, FD(fd), POSIX_FD, 0));
    CK(cuMemPoolImportFromShareableHandle(&ipool, FD(pfd), POSIX_FD, 0));
    CUmemLocation loc = {1, 0};
    CK(cuMemPoolGetAccess(&v, ipool, &loc));
    EXPECT("read-write access to the imported pool", v == 3);
    CUdeviceptr ip = 0;
    BAD("an allocation from an imported pool", cuMemAllocFromPoolAsync(&ip, 4096, ipool, 0));
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = 1;
    pp.handleTypes = POSIX_FD;
    pp.location.type = 1;
    CK(cuMemPoolCreate(&mine, &pp));
    BAD("a pointer through another pool", cuMemPoolImportPointer(&ip, mine, &m.ptr));
    CUmemPoolPtrExportData zero;
    memset(&zero, 0, sizeof zero);
    BAD("zeroed export data", cuMemPoolImportPointer(&ip, ipool, &zero));
    CK(cuMemPoolImportPointer(&ip, ipool, &m.ptr));
    EXPECT("the pointer at the exporter's address", ip == m.pool_ptr);
    EXPECT("the pool allocation's bytes",
           word_at(ip) == 0x22222222 && word_at(ip + POOL_BYTES - 4) == 0x22222222);
    CK(cuMemFreeAsync(ip, 0));
    BAD("an imported pointer freed twice", cuMemFreeAsync(ip, 0));
    CK(cuMemPoolDestroy(mine));

    say(sock, "check");
    hear(sock, "checked");
    printf("ok: the exporter sees the importer's writes\n");
    say(sock, "exit");
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT("the exporter ended well", WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* Its tokens are revoked once the host has seen it go: with a worker
     * per process, the memory's and the pool's each as the worker that
     * holds its import learns it. */
    CUresult r = 0, rp = 0;
    for (int i = 0; i < 200 && (r == 0 || rp == 0); i++) {
        if (r == 0) {
            CUmemGenericAllocationHandle again;
            r = cuMemImportFromShareableHandle(&again, FD(fd), POSIX_FD);
            if (r == 0) {
                CK(cuMemRelease(again));
            }
        }
        if (rp == 0) {
            CUmemoryPool late;
            rp = cuMemPoolImportFromShareableHandle(&late, FD(pfd), POSIX_FD, 0);
            if (rp == 0) {
                CK(cuMemPoolDestroy(late));
            }
        }
        usleep(10000);
    }
    EXPECT("an ended exporter's descriptor imports nothing", r == 1);
    EXPECT("an ended exporter's pool imports nothing", rp == 1);
    EXPECT("what the importer mapped stays until it unmaps it",
           word_at(d + G / 2) == 0x33333333 && word_at(d) == 0x11111111);
    CK(cuMemUnmap(d, G));
    CK(cuMemAddressFree(d, 2 * G));
    close(fd);
    close(dup_fd);
    close(pfd);
    close(sock);
    printf("shareable: all checks passed\n");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "export") == 0) {
        return exporter(atoi(argv[2]));
    }
    return importer(argv[0]);
}
