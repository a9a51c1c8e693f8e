// Does a kernel fault in one CUDA context of a process break the other
// contexts of that process? (It decides what a worker must do when one of
// its guests faults.) Built and run by scripts/gpu/recovery.sh.
#include <cuda.h>
#include <stdio.h>

static const char *PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry rd(.param .u64 p, .param .u64 out) {\n"
    "  .reg .b64 %rd<4>; .reg .f32 %f<2>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [out];\n"
    "  ld.global.f32 %f1, [%rd1]; st.global.f32 [%rd2], %f1; ret; }\n";

static const char *name(CUresult r) {
  const char *s = "?";
  cuGetErrorName(r, &s);
  return s;
}

int main(void) {
  CUdevice dev;
  CUcontext a, b;
  CUmodule m;
  CUfunction f;
  CUdeviceptr out, ok;
  cuInit(0);
  cuDeviceGet(&dev, 0);
  cuCtxCreate(&b, NULL, 0, dev);
  CUdeviceptr keep;
  printf("bystander alloc: %s\n", name(cuMemAlloc(&keep, 1 << 20)));
  cuCtxCreate(&a, NULL, 0, dev);
  cuModuleLoadData(&m, PTX);
  cuModuleGetFunction(&f, m, "rd");
  cuMemAlloc(&out, 4);
  CUdeviceptr wild = 0x10;
  void *args[] = {&wild, &out};
  printf("faulting launch: %s\n", name(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, 0)));
  printf("faulting context sync: %s\n", name(cuCtxSynchronize()));
  printf("faulting context alloc after: %s\n", name(cuMemAlloc(&ok, 4)));
  cuCtxSetCurrent(b);
  printf("other context sync: %s\n", name(cuCtxSynchronize()));
  printf("other context alloc: %s\n", name(cuMemAlloc(&ok, 4)));
  printf("other context memset: %s\n", name(cuMemsetD8(keep, 1, 1 << 20)));
  CUcontext c;
  printf("new context create: %s\n", name(cuCtxCreate(&c, NULL, 0, dev)));
  printf("new context alloc: %s\n", name(cuMemAlloc(&ok, 4)));
  return 0;
}
