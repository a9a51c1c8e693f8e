// How much GPU memory does a context that only registers host memory (the
// worker's retained primary context) take, and how much of it do smaller
// limits give back? Device-wide free memory (cuMemGetInfo) before and after
// each step. Built and run by scripts/gpu/context-memory.sh.
#include "probe.h"
#include <stdint.h>

static size_t free_mem(void) {
  size_t f, t;
  CK(cuMemGetInfo(&f, &t));
  return f;
}

static double mib(size_t a, size_t b) { return ((double)a - (double)b) / (1 << 20); }

static void limits(const char *what, CUcontext c, CUcontext observer, size_t stack,
                   size_t fifo, size_t heap) {
  CK(cuCtxSetCurrent(c));
  size_t before;
  CK(cuCtxSetCurrent(observer));
  before = free_mem();
  CK(cuCtxSetCurrent(c));
  CUresult r1 = cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack);
  CUresult r2 = cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, fifo);
  CUresult r3 = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, heap);
  size_t s = 0, f = 0, h = 0;
  cuCtxGetLimit(&s, CU_LIMIT_STACK_SIZE);
  cuCtxGetLimit(&f, CU_LIMIT_PRINTF_FIFO_SIZE);
  cuCtxGetLimit(&h, CU_LIMIT_MALLOC_HEAP_SIZE);
  CK(cuCtxSetCurrent(observer));
  printf("%-34s set %d/%d/%d now stack %zu fifo %zu heap %zu: gave back %.1f MiB\n", what, r1,
         r2, r3, s, f, h, mib(free_mem(), before));
}

int main(void) {
  CUdevice d;
  CUcontext observer, primary, plain;
  CK(cuInit(0));
  CK(cuDeviceGet(&d, 0));
  CK(cuCtxCreate(&observer, NULL, 0, d));
  size_t f0 = free_mem();
  CK(cuDevicePrimaryCtxRetain(&primary, d));
  CK(cuCtxSetCurrent(primary));
  free_mem();  // the primary context is made on first use
  CK(cuCtxSetCurrent(observer));
  size_t f1 = free_mem();
  printf("primary context (retained, used once): %.1f MiB\n", mib(f0, f1));
  limits("primary, stack 0 fifo 0 heap 0", primary, observer, 0, 0, 0);
  CK(cuCtxCreate(&plain, NULL, 0, d));
  CK(cuCtxSetCurrent(observer));
  size_t f2 = free_mem();
  printf("a context made with cuCtxCreate: %.1f MiB\n", mib(f1, f2));
  // A kernel-running context's launch after a small stack: does it still run?
  limits("cuCtxCreate'd, stack 0 fifo 0 heap 0", plain, observer, 0, 0, 0);
  CK(cuCtxSetCurrent(plain));
  CUdeviceptr p;
  CK(cuMemAlloc(&p, 1 << 20));
  CK(cuMemsetD8(p, 7, 1 << 20));
  CK(cuCtxSynchronize());
  printf("memset in it after: ok\n");
  return 0;
}
