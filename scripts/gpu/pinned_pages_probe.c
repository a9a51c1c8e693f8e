// Does the kind of host memory behind a pinned copy change its rate? The
// VM's pinned pool lives in a shared memfd the worker registers with the
// driver; a native program's pinned memory comes from cuMemHostAlloc. Each
// kind: 64 MiB, 30 synchronous host-to-device and device-to-host copies,
// the median time. Kinds: cuMemHostAlloc; a memfd mapping registered
// (4 KiB pages); the same with madvise(MADV_HUGEPAGE) (shared-memory
// transparent huge pages, where the host's shmem_enabled allows them); a
// memfd of MFD_HUGETLB pages (where the host has them reserved). Built and
// run by scripts/gpu/pinned-pages.sh.
#define _GNU_SOURCE
#include "probe.h"
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEN (64ul << 20)
#define REPS 30

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void measure(const char *kind, void *host, CUdeviceptr dev) {
  double h2d[REPS], d2h[REPS];
  for (int i = 0; i < REPS; i++) {
    double t = now();
    CK(cuMemcpyHtoD(dev, host, LEN));
    h2d[i] = now() - t;
    t = now();
    CK(cuMemcpyDtoH(host, dev, LEN));
    d2h[i] = now() - t;
  }
  qsort(h2d, REPS, sizeof(double), cmp);
  qsort(d2h, REPS, sizeof(double), cmp);
  printf("%-28s htod %.3f ms  dtoh %.3f ms\n", kind, h2d[REPS / 2] * 1e3, d2h[REPS / 2] * 1e3);
}

// A memfd of LEN bytes mapped shared (flags: memfd_create's), or NULL.
static void *memfd_map(unsigned flags, int huge_advice) {
  int fd = memfd_create("probe", flags);
  if (fd < 0 || ftruncate(fd, LEN) != 0) return NULL;
  void *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return NULL;
  if (huge_advice && madvise(p, LEN, MADV_HUGEPAGE) != 0) perror("madvise");
  memset(p, 1, LEN);
  return p;
}

static void registered(const char *kind, void *p, CUdeviceptr dev) {
  if (!p) {
    printf("%-28s not available here\n", kind);
    return;
  }
  CK(cuMemHostRegister(p, LEN, CU_MEMHOSTREGISTER_PORTABLE));
  measure(kind, p, dev);
  CK(cuMemHostUnregister(p));
}

int main(void) {
  CUdevice d;
  CUcontext c;
  CUdeviceptr dev;
  void *h;
  CK(cuInit(0));
  CK(cuDeviceGet(&d, 0));
  CK(cuCtxCreate(&c, NULL, 0, d));
  CK(cuMemAlloc(&dev, LEN));
  for (int round = 0; round < 2; round++) {
    printf("round %d\n", round + 1);
    CK(cuMemHostAlloc(&h, LEN, 0));
    memset(h, 1, LEN);
    measure("cuMemHostAlloc", h, dev);
    CK(cuMemFreeHost(h));
    registered("memfd, 4 KiB pages", memfd_map(0, 0), dev);
    registered("memfd, MADV_HUGEPAGE", memfd_map(0, 1), dev);
    registered("memfd, MFD_HUGETLB", memfd_map(MFD_HUGETLB, 0), dev);
  }
  return 0;
}
