// What does it cost the host to put B small kernels on a stream, one
// cuLaunchKernel each versus one CUDA graph launch of B kernel nodes? It
// decides whether a worker should replay a run of queued launches as a graph
// (the launch-rate goal of the libcuda stand-in). Built and run by
// scripts/gpu/launch-batch.sh.
//
// Methods, each for batches of B launches of a one-store kernel put(p, i)
// whose parameter i changes from launch to launch:
//   launch   B x cuLaunchKernel
//   replay   one cuGraphLaunch of a graph of B nodes, parameters unchanged
//   setparam B x cuGraphExecKernelNodeSetParams, then one cuGraphLaunch
//   capture  stream capture of B launches, cuGraphExecUpdate, cuGraphLaunch
//   build    B x cuGraphAddKernelNode to a new graph, cuGraphExecUpdate, cuGraphLaunch
// Two regimes: "burst" (synchronize after each batch, only the host calls
// timed) and "sustained" (N launches, one synchronize at the end, all timed).
// After each setparam/capture run the output array is checked: every
// kernel must have stored its own i + 1.
#include "probe.h"
#include <string.h>

static const char *PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry put(.param .u64 p, .param .u32 i) {\n"
    "  .reg .b64 %rd<4>; .reg .b32 %r<3>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [i];\n"
    "  mul.wide.u32 %rd2, %r1, 4; add.s64 %rd3, %rd1, %rd2;\n"
    "  add.u32 %r2, %r1, 1; st.u32 [%rd3], %r2; ret; }\n"
    ".visible .entry spin(.param .u64 ns) {\n"
    "  .reg .b64 %rd<5>; .reg .pred %p;\n"
    "  ld.param.u64 %rd1, [ns]; mov.u64 %rd2, %globaltimer;\n"
    "L: mov.u64 %rd3, %globaltimer; sub.s64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1; @%p bra L; ret; }\n";

enum { MAXB = 512, SLOTS = 1 << 20 };
static CUfunction put;
static CUmodule mod;
static CUstream st, cap;
static CUdeviceptr out;
static CUgraphExec exec;
static CUgraph graph;
static CUgraphNode nodes[MAXB];

// A one-thread launch of `f` with `args`, as a kernel node's parameters.
static CUDA_KERNEL_NODE_PARAMS one_thread(CUfunction f, void **args) {
  CUDA_KERNEL_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.func = f;
  p.gridDimX = p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = args;
  return p;
}

static void launch_one(unsigned i) {
  unsigned idx = i % SLOTS;
  void *args[] = {&out, &idx};
  CK(cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
}

// A graph of B put nodes in a chain, built node by node, instantiated.
static void build(int b) {
  CUgraph g;
  CK(cuGraphCreate(&g, 0));
  for (int i = 0; i < b; i++) {
    unsigned idx = i;
    void *args[] = {&out, &idx};
    CUDA_KERNEL_NODE_PARAMS p = one_thread(put, args);
    CK(cuGraphAddKernelNode(&nodes[i], g, i ? &nodes[i - 1] : NULL, i ? 1 : 0, &p));
  }
  // The graph stays: its node handles name the exec's nodes.
  CK(cuGraphInstantiateWithFlags(&exec, g, 0));
  graph = g;
}

static void batch(const char *m, unsigned base, int b) {
  if (!strcmp(m, "launch")) {
    for (int i = 0; i < b; i++) launch_one(base + i);
  } else if (!strcmp(m, "replay")) {
    CK(cuGraphLaunch(exec, st));
  } else if (!strcmp(m, "setparam")) {
    for (int i = 0; i < b; i++) {
      unsigned idx = (base + i) % SLOTS;
      void *args[] = {&out, &idx};
      CUDA_KERNEL_NODE_PARAMS p = one_thread(put, args);
      CK(cuGraphExecKernelNodeSetParams(exec, nodes[i], &p));
    }
    CK(cuGraphLaunch(exec, st));
  } else if (!strcmp(m, "capture")) {
    CUgraph g;
    CK(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < b; i++) {
      unsigned idx = (base + i) % SLOTS;
      void *args[] = {&out, &idx};
      CK(cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, cap, args, NULL));
    }
    CK(cuStreamEndCapture(cap, &g));
    CUgraphExecUpdateResultInfo info;
    CK(cuGraphExecUpdate(exec, g, &info));
    CK(cuGraphDestroy(g));
    CK(cuGraphLaunch(exec, st));
  } else if (!strcmp(m, "build")) {
    CUgraph g;
    CUgraphNode prev = NULL, n;
    CK(cuGraphCreate(&g, 0));
    for (int i = 0; i < b; i++) {
      unsigned idx = (base + i) % SLOTS;
      void *args[] = {&out, &idx};
      CUDA_KERNEL_NODE_PARAMS p = one_thread(put, args);
      CK(cuGraphAddKernelNode(&n, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
      prev = n;
    }
    CUgraphExecUpdateResultInfo info;
    CK(cuGraphExecUpdate(exec, g, &info));
    CK(cuGraphDestroy(g));
    CK(cuGraphLaunch(exec, st));
  }
}

static int check(unsigned n) {
  unsigned *h = malloc(SLOTS * 4);
  CK(cuMemcpyDtoH(h, out, SLOTS * 4));
  int bad = 0;
  for (unsigned i = 0; i < n && i < SLOTS; i++) bad += h[i] != i + 1;
  free(h);
  return bad;
}

// Launch + synchronize round trips of one kernel, as a guest's synchronous
// loop makes them: cuLaunchKernel against one launch of a one-node graph
// (its node updated every time, or left as it is).
static void latency(void) {
  CUfunction spin;
  CK(cuModuleGetFunction(&spin, mod, "spin"));
  const int iters = 3000;
  printf("\n%-22s %8s %12s %12s\n", "latency", "kernel", "mean_us", "p50_us");
  for (int ki = 0; ki < 2; ki++) {
    unsigned long long ns = ki ? 20000 : 0;
    void *args[] = {&ns};
    CUgraph g;
    CUgraphNode node;
    CUgraphExec ex;
    CUDA_KERNEL_NODE_PARAMS p = one_thread(spin, args);
    CK(cuGraphCreate(&g, 0));
    CK(cuGraphAddKernelNode(&node, g, NULL, 0, &p));
    CK(cuGraphInstantiateWithFlags(&ex, g, 0));
    const char *ways[] = {"launch+streamsync", "launch+ctxsync", "graph1+streamsync", "graph1set+streamsync"};
    for (int w = 0; w < 4; w++) {
      static double t[3000];
      for (int i = -200; i < iters; i++) {
        double t0 = now();
        if (w < 2) {
          CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
        } else {
          if (w == 3) CK(cuGraphExecKernelNodeSetParams(ex, node, &p));
          CK(cuGraphLaunch(ex, st));
        }
        if (w == 1) CK(cuCtxSynchronize()); else CK(cuStreamSynchronize(st));
        if (i >= 0) t[i] = now() - t0;
      }
      double sum = 0;
      for (int i = 0; i < iters; i++) sum += t[i];
      // p50 by partial selection sort (small n).
      for (int i = 0; i <= iters / 2; i++)
        for (int j = i + 1; j < iters; j++)
          if (t[j] < t[i]) { double x = t[i]; t[i] = t[j]; t[j] = x; }
      printf("%-22s %8llu %12.3f %12.3f\n", ways[w], ns, sum / iters * 1e6, t[iters / 2] * 1e6);
      fflush(stdout);
    }
    CK(cuGraphExecDestroy(ex));
    CK(cuGraphDestroy(g));
  }
}

int main(int argc, char **argv) {
  int sustained_n = argc > 1 ? atoi(argv[1]) : 200000;
  CUdevice dev;
  CUcontext ctx;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxCreate(&ctx, NULL, 0, dev));
  CK(cuModuleLoadData(&mod, PTX));
  CK(cuModuleGetFunction(&put, mod, "put"));
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
  CK(cuMemAlloc(&out, SLOTS * 4));
  const char *methods[] = {"launch", "replay", "setparam", "capture", "build"};
  const int sizes[] = {16, 64, 128, 256};
  printf("%-9s %5s %14s %14s %14s %6s\n", "method", "B", "burst_ns/launch", "sust_ns/launch",
         "sust_per_s", "wrong");
  for (int si = 0; si < 4; si++) {
    int b = sizes[si];
    build(b);
    for (int mi = 0; mi < 5; mi++) {
      const char *m = methods[mi];
      // Warm-up.
      for (int r = 0; r < 20; r++) batch(m, 0, b);
      CK(cuStreamSynchronize(st));
      // Bursts: host time of the calls only.
      int rounds = 400;
      double host = 0;
      for (int r = 0; r < rounds; r++) {
        double t0 = now();
        batch(m, (unsigned)r * b, b);
        host += now() - t0;
        CK(cuStreamSynchronize(st));
      }
      // Sustained: everything until the last kernel is done.
      CK(cuMemsetD32(out, 0, SLOTS));
      CK(cuCtxSynchronize());
      int nb = sustained_n / b;
      double t0 = now();
      for (int r = 0; r < nb; r++) batch(m, (unsigned)r * b, b);
      CK(cuStreamSynchronize(st));
      double all = now() - t0;
      int wrong = strcmp(m, "replay") ? check((unsigned)nb * b) : -1;
      printf("%-9s %5d %14.0f %14.0f %14.0f %6d\n", m, b, host / (rounds * b) * 1e9,
             all / ((double)nb * b) * 1e9, nb * b / all, wrong);
      fflush(stdout);
    }
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphDestroy(graph));
  }
  latency();
  return 0;
}
