// What does handing the GPU from one CUDA context to another cost a
// launch+synchronize loop, as the grant passes between vGPUs every slice?
// One thread, two contexts: each runs a loop of 20 us spin kernels for a
// 6 ms slice, then the other; against one context alone. Prints the
// steady iteration time and the first iterations after each switch.
// Built and run by scripts/gpu/handoff.sh.
#include "probe.h"

static const char *PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns) {\n"
    "  .reg .b64 %rd<5>; .reg .pred %p;\n"
    "  ld.param.u64 %rd1, [ns]; mov.u64 %rd2, %globaltimer;\n"
    "L: mov.u64 %rd3, %globaltimer; sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1; @%p bra L; ret; }\n";

static CUfunction load(CUcontext c) {
  CUmodule m;
  CUfunction f;
  CK(cuCtxSetCurrent(c));
  CK(cuModuleLoadData(&m, PTX));
  CK(cuModuleGetFunction(&f, m, "spin"));
  return f;
}

// Runs the loop in context `c` for `slice` seconds; adds the first three
// iterations' times to first[0..3] and returns the iterations done.
static long slice_of(CUcontext c, CUfunction f, double slice, double *first, double *rest,
                     long *nrest) {
  unsigned long long ns = 20000;
  void *args[] = {&ns};
  CK(cuCtxSetCurrent(c));
  double t0 = now(), t = t0;
  long n = 0;
  while (t - t0 < slice) {
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, 0));
    CK(cuCtxSynchronize());
    double t2 = now();
    if (n < 3) {
      first[n] += t2 - t;
    } else {
      *rest += t2 - t;
      (*nrest)++;
    }
    t = t2;
    n++;
  }
  return n;
}

int main(void) {
  CUdevice dev;
  CUcontext a, b;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxCreate(&a, NULL, 0, dev));
  CK(cuCtxCreate(&b, NULL, 0, dev));
  CUfunction fa = load(a), fb = load(b);
  for (int mode = 0; mode < 2; mode++) {
    double first[3] = {0}, rest = 0;
    long nrest = 0, n = 0, slices = 0;
    double t0 = now();
    while (now() - t0 < 3.0) {
      // mode 0: context a alone, slice after slice; mode 1: a, b, a, ...
      int other = mode == 1 && (slices & 1);
      n += slice_of(other ? b : a, other ? fb : fa, 0.006, first, &rest, &nrest);
      slices++;
    }
    double secs = now() - t0;
    printf("%s: %ld iterations in %.3f s (%.2f us each), %ld slices; first three after a "
           "slice starts %.2f %.2f %.2f us, the rest %.2f us\n",
           mode ? "two contexts alternating" : "one context", n, secs, secs / n * 1e6, slices,
           first[0] / slices * 1e6, first[1] / slices * 1e6, first[2] / slices * 1e6,
           rest / nrest * 1e6);
  }
  return 0;
}
