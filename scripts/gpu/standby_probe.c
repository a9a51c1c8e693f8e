// Can a second MPS server of the same GPU serve at once while the first
// server's clients are torn down after a fatal fault? (It decides whether
// the daemon keeps standby workers, their contexts made ahead, on a second
// MPS control daemon.) Built and run by scripts/gpu/mps-standby.sh.
//   standby_probe client ID FAULT_AFTER_S PIN_MIB  a client (as a worker:
//       PIN_MIB of host memory registered, two contexts) looping short
//       kernels; with FAULT_AFTER_S > 0 it reads a wild address after that
//       long and exits 3 once it sees the fault (destroying its contexts,
//       as a poisoned worker does); a client that sees another's fault
//       waits to be killed, as the daemon kills workers. Prints its kernels
//       per second.
//   standby_probe standby CONTEXTS PIN_MIB  makes CONTEXTS contexts and
//       registers PIN_MIB, prints "ready", waits for a line on stdin, then
//       times a guest's first work in the last context: module, allocation,
//       copy, kernel, copy back
//   standby_probe fresh                    the same work, contexts made now
// Times are CLOCK_REALTIME seconds, to line up with the script's own.
#include "probe.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry rd(.param .u64 p, .param .u64 out) {\n"
    "  .reg .b64 %rd<4>; .reg .f32 %f<2>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [out];\n"
    "  ld.global.f32 %f1, [%rd1]; st.global.f32 [%rd2], %f1; ret; }\n"
    ".visible .entry spin(.param .u64 ns) {\n"
    "  .reg .b64 %rd<5>; .reg .pred %p;\n"
    "  ld.param.u64 %rd1, [ns]; mov.u64 %rd2, %globaltimer;\n"
    "L: mov.u64 %rd3, %globaltimer; sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1; @%p bra L; ret; }\n";

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Registers `mib` MiB of fresh host memory with the current context, as a
// worker registers its VM's region.
static void pin(long mib) {
  if (mib <= 0) return;
  size_t len = (size_t)mib << 20;
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) exit(1);
  memset(p, 1, len);
  CK(cuMemHostRegister(p, len, CU_MEMHOSTREGISTER_PORTABLE));
}

static int client(int id, double fault_after, long pin_mib) {
  CUdevice dev;
  CUcontext setup, c;
  CUmodule m;
  CUfunction spin, rd;
  CUdeviceptr out;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxCreate(&setup, NULL, 0, dev));
  pin(pin_mib);
  CK(cuCtxCreate(&c, NULL, 0, dev));
  CK(cuModuleLoadData(&m, PTX));
  CK(cuModuleGetFunction(&spin, m, "spin"));
  CK(cuModuleGetFunction(&rd, m, "rd"));
  CK(cuMemAlloc(&out, 4));
  printf("client %d up %.6f\n", id, wall());
  fflush(stdout);
  unsigned long long ns = 100000;
  void *sargs[] = {&ns};
  double t0 = now(), last = t0;
  long n = 0, since = 0;
  for (;;) {
    CUresult r = cuLaunchKernel(spin, 8, 1, 1, 32, 1, 1, 0, 0, sargs, 0);
    if (r == CUDA_SUCCESS) r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
      const char *s = "?";
      cuGetErrorName(r, &s);
      printf("client %d error %s at %.6f after %ld kernels\n", id, s, wall(), n);
      fflush(stdout);
      for (;;) pause();
    }
    n++;
    since++;
    if (now() - last >= 1.0) {
      printf("client %d kernels_per_s %.0f\n", id, since / (now() - last));
      fflush(stdout);
      last = now();
      since = 0;
    }
    if (fault_after > 0 && now() - t0 >= fault_after) {
      CUdeviceptr wild = 0x10;
      void *args[] = {&wild, &out};
      cuLaunchKernel(rd, 1, 1, 1, 1, 1, 1, 0, 0, args, 0);
      r = cuCtxSynchronize();
      const char *s = "?";
      cuGetErrorName(r, &s);
      printf("client %d fault seen %s at %.6f\n", id, s, wall());
      fflush(stdout);
      cuCtxDestroy(c);
      cuCtxDestroy(setup);
      printf("client %d contexts destroyed at %.6f\n", id, wall());
      return 3;
    }
  }
}

// A guest's first work after a reset: load, allocate, copy, run, copy back.
static void work(const char *who) {
  double t0 = wall();
  CUmodule m;
  CUfunction rd;
  CUdeviceptr in, out;
  float v = 42.0f, got = 0;
  CK(cuModuleLoadData(&m, PTX));
  double t1 = wall();
  CK(cuModuleGetFunction(&rd, m, "rd"));
  CK(cuMemAlloc(&in, 1 << 22));
  CK(cuMemAlloc(&out, 4));
  double t2 = wall();
  CK(cuMemcpyHtoD(in, &v, 4));
  void *args[] = {&in, &out};
  CK(cuLaunchKernel(rd, 1, 1, 1, 1, 1, 1, 0, 0, args, 0));
  CK(cuMemcpyDtoH(&got, out, 4));
  double t3 = wall();
  printf("%s work start %.6f module_ms %.1f alloc_ms %.1f run_ms %.1f total_ms %.1f ok=%d\n",
         who, t0, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3,
         got == 42.0f);
  fflush(stdout);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 5 && !strcmp(argv[1], "client"))
    return client(atoi(argv[2]), atof(argv[3]), atol(argv[4]));
  CUdevice dev;
  CUcontext c[16];
  double t0 = wall();
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  double t1 = wall();
  if (argc >= 4 && !strcmp(argv[1], "standby")) {
    int n = atoi(argv[2]);
    if (n < 1 || n > 16) return 1;
    for (int i = 0; i < n; i++) {
      CK(cuCtxCreate(&c[i], NULL, 0, dev));
      if (i == 0) pin(atol(argv[3]));
    }
    printf("standby ready init_ms %.1f contexts_ms %.1f\n", (t1 - t0) * 1e3,
           (wall() - t1) * 1e3);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    printf("standby go %.6f\n", wall());
    work("standby");
    // Stays until killed, as a serving worker would.
    for (;;) pause();
  }
  if (argc >= 2 && !strcmp(argv[1], "fresh")) {
    CK(cuCtxCreate(&c[0], NULL, 0, dev));
    printf("fresh started %.6f init_ms %.1f context_ms %.1f\n", t0, (t1 - t0) * 1e3,
           (wall() - t1) * 1e3);
    work("fresh");
    return 0;
  }
  fprintf(stderr, "usage: see the comment at the top\n");
  return 1;
}
