// What the GPU probes (scripts/gpu/*_probe.c) share: checking driver calls
// and a monotonic clock.
#ifndef FAIRVGPU_PROBE_H
#define FAIRVGPU_PROBE_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// A failed driver call ends the probe, naming the call and the error.
#define CK(x)                                                               \
  do {                                                                      \
    CUresult r_ = (x);                                                      \
    if (r_ != CUDA_SUCCESS) {                                               \
      const char *n_ = "?";                                                 \
      cuGetErrorName(r_, &n_);                                              \
      fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, n_);      \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

// Seconds on the monotonic clock.
static inline double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#endif
