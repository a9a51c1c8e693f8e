// What IPC handles between processes of one VM can be built on: every
// guest process of a VM is a context of the same worker process on the
// host, so a handle one guest process exports must open in another
// context of that one process. Which memory can a context reach that
// another context of the same process allocated, on one GPU?
//   1. plain cuMemAlloc memory of context A, copied from in context B
//   2. the same, read by a kernel of context B
//   3. VMM memory (cuMemCreate, cuMemMap, cuMemSetAccess for the device)
//      mapped while A was current, read by a kernel of context B
//   4. the driver's own IPC: cuIpcGetMemHandle in A, cuIpcOpenMemHandle in
//      B (the same process)
//   5. with an argument "plain" or "interprocess": an event made (with
//      those flags) and recorded in A, then queried, synchronized and
//      waited on by a stream of B, each step printed before it is tried
//      (the script runs each in a process of its own, so a crash shows)
// Each line says what the driver returned and whether the bytes were
// right; the probe goes on after a failure.
// Build and run: nvcc -o /tmp/ipc_probe scripts/gpu/ipc_probe.c -lcuda
#include <string.h>

#include "probe.h"

// Adds 1 to each of n words at p (PTX, so that no runtime is needed).
static const char *PTX =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry inc(.param .u64 p, .param .u32 n) {\n"
    "  .reg .pred %q; .reg .b32 %r<4>; .reg .b64 %d<4>;\n"
    "  ld.param.u64 %d1, [p]; ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %tid.x; setp.ge.u32 %q, %r2, %r1; @%q bra done;\n"
    "  mul.wide.u32 %d2, %r2, 4; add.s64 %d3, %d1, %d2;\n"
    "  ld.global.u32 %r3, [%d3]; add.u32 %r3, %r3, 1; st.global.u32 [%d3], %r3;\n"
    "done: ret; }\n";

#define N 256

static void report(const char *what, CUresult r, int right) {
  const char *name = "?";
  cuGetErrorName(r, &name);
  printf("%-58s %s%s\n", what, name, r == CUDA_SUCCESS ? (right ? ", bytes right" : ", BYTES WRONG") : "");
}

// In context b: a kernel adds 1 to the N words at p, then the words are
// read back; right if each is want + 1.
static CUresult kernel_in(CUcontext b, CUfunction f, CUdeviceptr p, unsigned want, int *right) {
  unsigned host[N], n = N;
  void *args[] = {&p, &n};
  cuCtxSetCurrent(b);
  CUresult r = cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL);
  if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
  if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(host, p, sizeof host);
  *right = 1;
  for (int i = 0; r == CUDA_SUCCESS && i < N; i++) *right &= host[i] == want + 1;
  return r;
}

// 5: an event of A used from B.
static int events(CUcontext a, CUcontext b, int interprocess) {
  unsigned flags = CU_EVENT_DISABLE_TIMING | (interprocess ? CU_EVENT_INTERPROCESS : 0);
  const char *kind = interprocess ? "interprocess" : "plain";
  cuCtxSetCurrent(a);
  CUevent ev;
  CK(cuEventCreate(&ev, flags));
  CK(cuEventRecord(ev, NULL));
  cuCtxSetCurrent(b);
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  printf("5. %s event of A, in B: query...\n", kind);
  fflush(stdout);
  CUresult r = cuEventQuery(ev);
  report("   cuEventQuery", r, 1);
  fflush(stdout);
  r = cuEventSynchronize(ev);
  report("   cuEventSynchronize", r, 1);
  fflush(stdout);
  r = cuStreamWaitEvent(st, ev, 0);
  report("   cuStreamWaitEvent on a stream of B", r, 1);
  fflush(stdout);
  r = cuStreamSynchronize(st);
  report("   cuStreamSynchronize of that stream", r, 1);
  r = cuEventRecord(ev, st);
  report("   cuEventRecord on a stream of B", r, 1);
  r = cuCtxSynchronize();
  report("   cuCtxSynchronize in B", r, 1);
  printf("done\n");
  return 0;
}

int main(int argc, char **argv) {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext a, b;
  CK(cuCtxCreate(&a, NULL, 0, dev));
  CK(cuCtxCreate(&b, NULL, 0, dev));
  if (argc == 2) return events(a, b, !strcmp(argv[1], "interprocess"));
  CUmodule mb;
  CUfunction fb;
  cuCtxSetCurrent(b);
  CK(cuModuleLoadData(&mb, PTX));
  CK(cuModuleGetFunction(&fb, mb, "inc"));
  unsigned host[N];
  for (int i = 0; i < N; i++) host[i] = 7;

  // 1 and 2: plain memory of A.
  cuCtxSetCurrent(a);
  CUdeviceptr p;
  CK(cuMemAlloc(&p, sizeof host));
  CK(cuMemcpyHtoD(p, host, sizeof host));
  cuCtxSetCurrent(b);
  unsigned got[N];
  memset(got, 0, sizeof got);
  CUresult r = cuMemcpyDtoH(got, p, sizeof got);
  report("1. A's cuMemAlloc memory, copied out in B", r, r == CUDA_SUCCESS && got[0] == 7 && got[N - 1] == 7);
  int right = 0;
  r = kernel_in(b, fb, p, 7, &right);
  report("2. A's cuMemAlloc memory, a kernel of B", r, right);

  // 3: VMM memory mapped while A was current.
  cuCtxSetCurrent(a);
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  CUdeviceptr v;
  CK(cuMemCreate(&h, g, &prop, 0));
  CK(cuMemAddressReserve(&v, g, 0, 0, 0));
  CK(cuMemMap(v, g, 0, h, 0));
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CK(cuMemSetAccess(v, g, &acc, 1));
  CK(cuMemcpyHtoD(v, host, sizeof host));
  r = kernel_in(b, fb, v, 7, &right);
  report("3. VMM memory mapped under A, a kernel of B", r, right);

  // 4: the driver's IPC within one process.
  cuCtxSetCurrent(a);
  CUipcMemHandle ih;
  r = cuIpcGetMemHandle(&ih, p);
  report("4a. cuIpcGetMemHandle of A's memory", r, 1);
  if (r == CUDA_SUCCESS) {
    cuCtxSetCurrent(b);
    CUdeviceptr q = 0;
    r = cuIpcOpenMemHandle(&q, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    report("4b. cuIpcOpenMemHandle of it in B (same process)", r, 1);
    if (r == CUDA_SUCCESS) {
      printf("    opened at %#llx (exported %#llx)\n", (unsigned long long)q, (unsigned long long)p);
      cuIpcCloseMemHandle(q);
    }
  }
  printf("done\n");
  return 0;
}
