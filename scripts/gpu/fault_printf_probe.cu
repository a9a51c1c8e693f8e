// What the driver does with kernel printf and sticky faults when one
// process holds several contexts, as a vGPU's worker does (it decides how
// a guest process's printf reaches that process, and what one process's
// fault costs the VM's others). Built and run by scripts/gpu/faults.sh.
//
// Output lines of our own go through write(2) on fd 1, never through
// stdio, so their order against the driver's printf text in the same file
// shows when (and through what) the driver wrote it.
#include <assert.h>
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern "C" __global__ void say(int tag) { printf("kernel %d thread %d\n", tag, threadIdx.x); }
extern "C" __global__ void fail_assert(int *p) { assert(p == nullptr); }
extern "C" __global__ void fail_trap() { asm volatile("trap;"); }
extern "C" __global__ void fail_read(int *p, int *out) { *out = *p; }
extern "C" __global__ void put(int *out, int v) { *out = v; }

static void mark(const char *s) {
  char b[256];
  int n = snprintf(b, sizeof b, "MARK %s\n", s);
  (void)!write(1, b, n);
}

static const char *name(CUresult r) {
  const char *s = "?";
  cuGetErrorName(r, &s);
  return s;
}

static void report(const char *what, CUresult r) {
  char b[256];
  snprintf(b, sizeof b, "%s: %s", what, name(r));
  mark(b);
}


static CUmodule load(const char *path) {
  CUmodule m;
  CUresult r = cuModuleLoad(&m, path);
  if (r != CUDA_SUCCESS) { report("cuModuleLoad", r); _exit(2); }
  return m;
}

static CUfunction fn(CUmodule m, const char *n) {
  CUfunction f;
  cuModuleGetFunction(&f, m, n);
  return f;
}

// One context that prints and the neighbour that synchronizes: which
// synchronization flushes which context's text.
static void printf_order(CUdevice dev, const char *cubin) {
  CUcontext a, b;
  cuCtxCreate(&b, NULL, 0, dev);
  CUmodule mb = load(cubin);
  cuCtxCreate(&a, NULL, 0, dev);
  CUmodule ma = load(cubin);
  int tag = 1;
  void *args[] = {&tag};
  CUstream s;
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  CUevent e;
  cuEventCreate(&e, 0);
  mark("launch A tag 1 (2 threads) on a stream");
  cuLaunchKernel(fn(ma, "say"), 1, 1, 1, 2, 1, 1, 0, s, args, 0);
  cuEventRecord(e, s);
  while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) {}
  mark("A's event query says done");
  cuCtxSetCurrent(b);
  cuCtxSynchronize();
  mark("B ctx synchronized");
  int tag2 = 2;
  void *args2[] = {&tag2};
  cuLaunchKernel(fn(mb, "say"), 1, 1, 1, 1, 1, 1, 0, 0, args2, 0);
  cuCtxSynchronize();
  mark("B launched tag 2 and synchronized");
  cuCtxSetCurrent(a);
  cuEventSynchronize(e);
  mark("A event synchronized");
  cuStreamSynchronize(s);
  mark("A stream synchronized");
  cuCtxSynchronize();
  mark("A ctx synchronized");
  tag = 3;
  cuLaunchKernel(fn(ma, "say"), 1, 1, 1, 1, 1, 1, 0, s, args, 0);
  cuEventRecord(e, s);
  cuEventSynchronize(e);
  mark("A tag 3: event synchronized");
  tag = 4;
  cuLaunchKernel(fn(ma, "say"), 1, 1, 1, 1, 1, 1, 0, s, args, 0);
  cuStreamSynchronize(s);
  mark("A tag 4: stream synchronized");
  tag = 5;
  cuLaunchKernel(fn(ma, "say"), 1, 1, 1, 1, 1, 1, 0, s, args, 0);
  while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) {}
  mark("A tag 5: stream query done");
  tag = 6;
  cuLaunchKernel(fn(ma, "say"), 1, 1, 1, 1, 1, 1, 0, s, args, 0);
  mark("A tag 6 launched after tag 5 (no sync)");
  cuCtxSynchronize();
  mark("A ctx synchronized");
  fflush(stdout);
  mark("stdio flushed");
  tag = 7;
  cuLaunchKernel(fn(ma, "say"), 1, 1, 1, 1, 1, 1, 0, s, args, 0);
  cuStreamSynchronize(s);
  mark("A tag 7 stream synchronized; destroying A");
  cuCtxDestroy(a);
  mark("A destroyed");
  fflush(stdout);
  mark("stdio flushed");
  cuCtxDestroy(b);
}

// A fault of kind `k` in one context: what the others, and a new one, see.
static void fault(CUdevice dev, const char *cubin, const char *k) {
  CUcontext a, b;
  CUdeviceptr out, keep;
  cuCtxCreate(&b, NULL, 0, dev);
  CUmodule mb = load(cubin);
  cuMemAlloc(&keep, 4);
  cuCtxCreate(&a, NULL, 0, dev);
  CUmodule ma = load(cubin);
  cuMemAlloc(&out, 4);
  CUdeviceptr wild = 0x10;
  void *ra[] = {&wild, &out};
  void *aa[] = {&out};
  char b2[128];
  CUresult r;
  if (!strcmp(k, "assert")) r = cuLaunchKernel(fn(ma, "fail_assert"), 1, 1, 1, 1, 1, 1, 0, 0, aa, 0);
  else if (!strcmp(k, "trap")) r = cuLaunchKernel(fn(ma, "fail_trap"), 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
  else r = cuLaunchKernel(fn(ma, "fail_read"), 1, 1, 1, 1, 1, 1, 0, 0, ra, 0);
  snprintf(b2, sizeof b2, "%s: launch", k); report(b2, r);
  snprintf(b2, sizeof b2, "%s: faulting ctx sync", k); report(b2, cuCtxSynchronize());
  cuCtxSetCurrent(b);
  int v = 42;
  void *pa[] = {&keep, &v};
  snprintf(b2, sizeof b2, "%s: other ctx launch", k);
  report(b2, cuLaunchKernel(fn(mb, "put"), 1, 1, 1, 1, 1, 1, 0, 0, pa, 0));
  snprintf(b2, sizeof b2, "%s: other ctx sync", k); report(b2, cuCtxSynchronize());
  CUcontext c;
  snprintf(b2, sizeof b2, "%s: new ctx create", k); report(b2, cuCtxCreate(&c, NULL, 0, dev));
  cuCtxDestroy(a);
  CUcontext d;
  snprintf(b2, sizeof b2, "%s: new ctx create after destroying the faulted one", k);
  report(b2, cuCtxCreate(&d, NULL, 0, dev));
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s CUBIN printf|assert|trap|read\n", argv[0]); return 2; }
  cuInit(0);
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  if (!strcmp(argv[2], "printf")) printf_order(dev, argv[1]);
  else fault(dev, argv[1], argv[2]);
  mark("end");
  return 0;
}
