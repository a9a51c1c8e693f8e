// Round trips after host-side pauses (issue 33): what one short burst of
// GPU work costs when the program has been computing on the CPU before it,
// as sortingNetworks (a few kernels and a synchronize per size) and
// jacobiCudaGraphs (a kernel, a small copy back, a synchronize, per
// iteration) do. Prints, per pattern and pause, the median and 90th
// percentile of the burst in microseconds; run it natively and through the
// stand-in and compare the lines.
// build: nvcc -O2 -o burst burst.cu
#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "runtime_probe.h"

__global__ void touch(int *p) {
  if (threadIdx.x == 0) p[blockIdx.x] += 1;
}

// Spins the CPU for `us` (the program's own work between bursts).
static void pause_us(double us) {
  double end = now_us() + us;
  while (now_us() < end) {
  }
}

static void report(const char *what, double pause, std::vector<double> &t) {
  std::sort(t.begin(), t.end());
  printf("%-34s pause %6.0f us: median %8.1f us  p90 %8.1f us\n", what, pause,
         t[t.size() / 2], t[t.size() * 9 / 10]);
}

int main() {
  int *d;
  CK(cudaMalloc(&d, 1 << 20));
  CK(cudaMemset(d, 0, 1 << 20));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int n = 300;
  const double pauses[] = {0, 100, 1000, 10000};
  for (double p : pauses) {
    std::vector<double> t;
    for (int i = 0; i < n; i++) {
      pause_us(p);
      double t0 = now_us();
      touch<<<1, 32>>>(d);
      CK(cudaDeviceSynchronize());
      t.push_back(now_us() - t0);
    }
    report("kernel + device sync", p, t);
  }
  for (double p : pauses) {
    std::vector<double> t;
    for (int i = 0; i < n; i++) {
      pause_us(p);
      double t0 = now_us();
      for (int k = 0; k < 6; k++) touch<<<64, 256>>>(d);
      CK(cudaDeviceSynchronize());
      t.push_back(now_us() - t0);
    }
    report("6 kernels + device sync", p, t);
  }
  double sum = 0;
  for (int sync = 0; sync < 2; sync++) {
    for (double p : pauses) {
      std::vector<double> t;
      for (int i = 0; i < n; i++) {
        pause_us(p);
        double t0 = now_us();
        touch<<<64, 256, 0, s>>>(d);
        CK(cudaMemcpyAsync(&sum, d, sizeof(sum), cudaMemcpyDeviceToHost, s));
        if (sync) CK(cudaStreamSynchronize(s));
        t.push_back(now_us() - t0);
      }
      report(sync ? "kernel + copy back + stream sync" : "kernel + copy back", p, t);
    }
  }
  printf("done\n");
  return 0;
}
