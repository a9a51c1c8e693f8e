// Chains of short kernels (issue 33): what each kernel of a back-to-back
// sequence costs when the kernels are shorter than a launch, as in
// sortingNetworks (tens of small kernels of three functions and changing
// grids per size, then a synchronize) and transpose (one kernel repeated
// between two events). Prints, per shape and chain length, the median and
// 90th percentile of the whole chain and the median per kernel, in
// microseconds; run it natively and through the stand-in and compare.
// build: nvcc -O2 -o chain chain.cu
#include <algorithm>
#include <cstdio>
#include <vector>

#include "runtime_probe.h"

__global__ void step_a(int *p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}
__global__ void step_b(int *p, int n, int stride) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i + stride < n) p[i] ^= p[i + stride];
}
__global__ void step_c(int *p, int n, int stride, int dir) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && (i & stride)) p[i] += dir;
}

static void report(const char *what, int len, std::vector<double> &t) {
  std::sort(t.begin(), t.end());
  double med = t[t.size() / 2];
  printf("%-30s x%4d: median %9.1f us  p90 %9.1f us  per kernel %6.2f us\n",
         what, len, med, t[t.size() * 9 / 10], med / len);
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 200;
  const int n = 1 << 16;
  int *d;
  CK(cudaMalloc(&d, n * sizeof(int)));
  CK(cudaMemset(d, 0, n * sizeof(int)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int lens[] = {8, 32, 128};
  for (int len : lens) {
    // sortingNetworks' shape: three functions, grids changing along the
    // chain, the runtime's error check after each, then a synchronize.
    std::vector<double> t;
    for (int r = 0; r < rounds; r++) {
      double t0 = now_us();
      for (int k = 0; k < len; k++) {
        int blocks = 16 << (k % 5);
        switch (k % 3) {
          case 0: step_a<<<blocks, 128>>>(d, n); break;
          case 1: step_b<<<blocks, 128>>>(d, n, 1 << (k % 7)); break;
          default: step_c<<<blocks, 128>>>(d, n, 1 << (k % 7), k & 1 ? 1 : -1);
        }
        CK(cudaGetLastError());
      }
      CK(cudaDeviceSynchronize());
      t.push_back(now_us() - t0);
    }
    report("3 functions + device sync", len, t);
  }
  for (int len : lens) {
    // transpose's shape: one kernel repeated between two events, the time
    // the events measure on the device.
    std::vector<double> t;
    for (int r = 0; r < rounds; r++) {
      CK(cudaEventRecord(e0));
      for (int k = 0; k < len; k++) step_a<<<n / 128, 128>>>(d, n);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1000.0);
    }
    report("1 function between events", len, t);
  }
  printf("done\n");
  return 0;
}
