// What driver 580's cluster table (1734dc26, CU_ETID_ClusterPrototype)
// answers, slot by slot, next to the public calls it mirrors: the stand-in
// serves it the same way (libcuda/src/export_table/cluster.rs).
// Built and run by scripts/gpu/mixed-precision.sh. Each call is made before
// its line prints what it wrote.
#include "probe.h"

static const char *PTX =
    ".version 7.8\n.target sm_90\n.address_size 64\n"
    ".visible .entry k(.param .u64 p) { ret; }\n";

static const char *nm(CUresult r) {
  const char *s = "?";
  cuGetErrorName(r, &s);
  return s;
}

typedef CUresult (*set3)(CUfunction, int, int, int);
typedef CUresult (*set1)(CUfunction, int);
typedef CUresult (*get3)(CUfunction, int *, int *, int *);
typedef CUresult (*get1)(CUfunction, int *);
typedef CUresult (*devq)(CUdevice, int *);
typedef CUresult (*maxsz)(CUfunction, int, size_t, int *);
typedef CUresult (*active)(CUfunction, int, size_t, int, int *);
typedef unsigned (*override_fn)(int, unsigned);
typedef CUresult (*noarg)(int *);
typedef CUresult (*vgpc)(CUdevice, unsigned char *);

static void attrs(CUfunction f, const char *when) {
  int v[6];
  for (int a = 10; a <= 15; a++) cuFuncGetAttribute(&v[a - 10], (CUfunction_attribute)a, f);
  printf("%s: func attrs 10..15 = %d %d %d %d %d %d\n", when, v[0], v[1], v[2], v[3], v[4], v[5]);
}

int main(void) {
  CK(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  static const unsigned char ids[][16] = {
      {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca},
      {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9}};
  const char *names[] = {"1734dc26 (clusters)", "f8cff951"};
  void *const *t = NULL;
  for (int i = 0; i < 2; i++) {
    const void *p = NULL;
    CUresult r = cuGetExportTable(&p, (const CUuuid *)ids[i]);
    printf("table %s: %s, first word %zu\n", names[i], nm(r), p ? *(const size_t *)p : 0);
    if (i == 0) t = (void *const *)p;
  }
  if (!t) return 1;
  CUmodule m;
  CUfunction f;
  CK(cuModuleLoadData(&m, PTX));
  CK(cuModuleGetFunction(&f, m, "k"));
  int a = -1, b = -1, c = -1;
  attrs(f, "fresh");
  { CUresult r_ = ((get3)t[5])(f, &a, &b, &c); printf("slot 5 get dim: %s %d %d %d\n", nm(r_), a, b, c); }
  { CUresult r_ = ((get1)t[12])(f, &a); printf("slot 12 must be set: %s %d\n", nm(r_), a); }
  { CUresult r_ = ((devq)t[8])(dev, &a); printf("slot 8 cluster launch: %s %d\n", nm(r_), a); }
  printf("slot 1 set dim 2,1,1: %s\n", nm(((set3)t[1])(f, 2, 1, 1)));
  attrs(f, "after slot 1");
  { CUresult r_ = ((get3)t[5])(f, &a, &b, &c); printf("slot 5 get dim: %s %d %d %d\n", nm(r_), a, b, c); }
  printf("slot 3 non-portable 1: %s\n", nm(((set1)t[3])(f, 1)));
  printf("slot 2 policy 1: %s\n", nm(((set1)t[2])(f, 1)));
  attrs(f, "after slots 2, 3");
  { CUresult r_ = ((get1)t[6])(f, &a); printf("slot 6 policy: %s %d\n", nm(r_), a); }
  { CUresult r_ = ((get1)t[7])(f, &a); printf("slot 7 non-portable: %s %d\n", nm(r_), a); }
  printf("slot 1 set dim 0,0,0: %s\n", nm(((set3)t[1])(f, 0, 0, 0)));
  attrs(f, "after reset");
  { CUresult r_ = ((maxsz)t[9])(f, 128, 0, &a); printf("slot 9 max cluster (128 threads): %s %d\n", nm(r_), a); }
  CUlaunchConfig cfg = {0};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 128; cfg.blockDimY = cfg.blockDimZ = 1;
  { CUresult r_ = cuOccupancyMaxPotentialClusterSize(&a, f, &cfg); printf("cuOccupancyMaxPotentialClusterSize: %s %d\n", nm(r_), a); }
  { CUresult r_ = ((active)t[10])(f, 128, 0, 2, &a); printf("slot 10 active clusters of 2: %s %d\n", nm(r_), a); }
  CUlaunchAttribute at;
  at.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  at.value.clusterDim.x = 2; at.value.clusterDim.y = 1; at.value.clusterDim.z = 1;
  cfg.attrs = &at; cfg.numAttrs = 1; cfg.gridDimX = 2;
  { CUresult r_ = cuOccupancyMaxActiveClusters(&a, f, &cfg); printf("cuOccupancyMaxActiveClusters (2): %s %d\n", nm(r_), a); }
  { CUresult r_ = ((noarg)t[14])(&a); printf("slot 14 cnp attrs: %s %d\n", nm(r_), a); }
  unsigned char v = 0;
  { CUresult r_ = ((vgpc)t[15])(dev, &v); printf("slot 15 singleton vGPC base: %s %d\n", nm(r_), v); }
  if ((size_t)t[0] >= 17 * 8) { CUresult r_ = ((devq)t[16])(dev, &a); printf("slot 16 preferred cluster: %s %d\n", nm(r_), a); }
  unsigned old = ((override_fn)t[11])(0, 0);
  unsigned back = ((override_fn)t[11])(0, old);
  printf("slot 11 override (0, 0) -> %u; restored -> %u\n", old, back);
  size_t words = (size_t)t[0] / 8;
  for (size_t i = 17; i < words; i++) printf("slot %zu present: %p\n", i, t[i]);
  return 0;
}
