// What the CUDA runtime probes (scripts/gpu/burst.cu, chain.cu) share:
// checking runtime calls in main and a steady clock in microseconds. The
// driver-API probes have probe.h.
#ifndef FAIRVGPU_RUNTIME_PROBE_H
#define FAIRVGPU_RUNTIME_PROBE_H

#include <chrono>
#include <cstdio>

// A failed runtime call ends the probe (from main), naming the call and
// the error.
#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      printf("%s: %s\n", #x, cudaGetErrorString(e));               \
      return 1;                                                    \
    }                                                              \
  } while (0)

// Microseconds on the steady clock.
static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#endif
