// What slot 7 of the driver's tools module table (6e163fbe) does, on the
// real driver: cuFFT calls it as slot7(ctx, module, callback, data) after
// cuModuleLoadData, with a callback that stores its second argument through
// its first, and takes a return of 1 as success. This calls it on modules
// of 0, 1, 2 and 3 kernels and prints what comes back and what the
// callback is given (four words), against the handles cuModuleGetFunction
// and cuModuleEnumerateFunctions give. A case that might crash the process
// runs alone, named as the argument.
// usage: module_tools_probe [null-module|bogus-module|null-callback|library-handle|unloaded]
#include <stdint.h>
#include <string.h>

#include "probe.h"

typedef uint64_t (*slot_fn)(uint64_t, uint64_t, uint64_t, uint64_t);

static const char *ptx_head = ".version 8.0\n.target sm_90\n.address_size 64\n";

// A module whose kernels are k0 .. k{n-1}, and a global (so that a module
// of no kernels is not empty).
static CUmodule load(int n) {
  char text[4096];
  int at = snprintf(text, sizeof text, "%s.visible .global .u32 g;\n", ptx_head);
  for (int i = 0; i < n; i++)
    at += snprintf(text + at, sizeof text - at,
                   ".visible .entry k%d(.param .u64 p)\n{\n\tret;\n}\n", i);
  CUmodule m;
  CK(cuModuleLoadData(&m, text));
  return m;
}

static struct {
  int calls;
  uint64_t a[16][4];
} rec;
static int cb_return;

static int cb(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  if (rec.calls < 16) {
    rec.a[rec.calls][0] = a;
    rec.a[rec.calls][1] = b;
    rec.a[rec.calls][2] = c;
    rec.a[rec.calls][3] = d;
  }
  rec.calls++;
  return cb_return;
}

static void call(const char *what, slot_fn f, uint64_t ctx, uint64_t m, void *callback, CUmodule names) {
  memset(&rec, 0, sizeof rec);
  uint64_t data = 0x1234567890;
  uint64_t r = f(ctx, m, (uint64_t)callback, data);
  printf("%s: returned %#lx (low 32 bits %d), %d callback calls\n", what, (unsigned long)r,
         (int)(uint32_t)r, rec.calls);
  for (int i = 0; i < rec.calls && i < 16; i++) {
    const char *name = "?";
    if (names && cuFuncGetName(&name, (CUfunction)rec.a[i][1]) != CUDA_SUCCESS)
      name = "(not a function)";
    printf("  call %d: a=%#lx%s b=%#lx (%s) c=%#lx d=%#lx\n", i, (unsigned long)rec.a[i][0],
           rec.a[i][0] == data ? " (the data)" : "", (unsigned long)rec.a[i][1], name,
           (unsigned long)rec.a[i][2], (unsigned long)rec.a[i][3]);
  }
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  int version;
  CK(cuDriverGetVersion(&version));
  printf("driver %d, context %p\n", version, (void *)ctx);

  static const CUuuid id = {{0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c,
                             0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e}};
  const uint64_t *t;
  CK(cuGetExportTable((const void **)&t, &id));
  printf("table %p: size %lu bytes (%lu slots)\n", (void *)t, (unsigned long)t[0],
         (unsigned long)t[0] / 8);
  slot_fn s7 = (slot_fn)t[7];

  CUmodule m[4];
  for (int n = 0; n < 4; n++) {
    m[n] = load(n);
    unsigned count = 0;
    CK(cuModuleGetFunctionCount(&count, m[n]));
    CUfunction fs[3] = {0};
    if (count)
      CK(cuModuleEnumerateFunctions(fs, count, m[n]));
    printf("module %d kernels: %p, cuModuleGetFunctionCount %u, enumerated", n, (void *)m[n],
           count);
    for (unsigned i = 0; i < count; i++) {
      const char *name;
      CK(cuFuncGetName(&name, fs[i]));
      CUfunction g;
      char k[8];
      snprintf(k, sizeof k, "k%u", i);
      CK(cuModuleGetFunction(&g, m[n], k));
      printf(" %p (%s; cuModuleGetFunction(%s) %p)", (void *)fs[i], name, k, (void *)g);
    }
    printf("\n");
  }
  // Cases that may crash the process: one per run, named on the command line.
  if (only && !strcmp(only, "null-module"))
    call("slot7(ctx, NULL module)", s7, (uint64_t)ctx, 0, cb, NULL);
  if (only && !strcmp(only, "bogus-module"))
    call("slot7(ctx, bogus module 0x6)", s7, (uint64_t)ctx, 6, cb, NULL);
  if (only && !strcmp(only, "null-callback"))
    call("slot7(ctx, module of 2, NULL callback)", s7, (uint64_t)ctx, (uint64_t)m[2], NULL, NULL);
  if (only && !strcmp(only, "library-handle")) {
    CUlibrary lib;
    char text[512];
    snprintf(text, sizeof text, "%s.visible .entry lk(.param .u64 p)\n{\n\tret;\n}\n", ptx_head);
    CK(cuLibraryLoadData(&lib, text, NULL, NULL, 0, NULL, NULL, 0));
    call("slot7(ctx, a library handle)", s7, (uint64_t)ctx, (uint64_t)lib, cb, NULL);
  }
  if (only && !strcmp(only, "unloaded")) {
    CK(cuModuleUnload(m[1]));
    call("slot7(ctx, unloaded module)", s7, (uint64_t)ctx, (uint64_t)m[1], cb, NULL);
  }
  if (only) {
    printf("done\n");
    return 0;
  }

  for (int n = 0; n < 4; n++) {
    char what[64];
    snprintf(what, sizeof what, "slot7(ctx, module of %d)", n);
    call(what, s7, (uint64_t)ctx, (uint64_t)m[n], cb, m[n]);
  }
  cb_return = 1;
  call("slot7(ctx, module of 3), callback returning 1", s7, (uint64_t)ctx, (uint64_t)m[3], cb, m[3]);
  cb_return = -1;
  call("slot7(ctx, module of 3), callback returning -1", s7, (uint64_t)ctx, (uint64_t)m[3], cb, m[3]);
  cb_return = 0;
  call("slot7(NULL ctx, module of 2)", s7, 0, (uint64_t)m[2], cb, m[2]);
  // Again, after the first: are the handles the same each time?
  call("slot7(ctx, module of 2) again", s7, (uint64_t)ctx, (uint64_t)m[2], cb, m[2]);

  // Another context, current or not.
  CUcontext other;
  CK(cuCtxCreate(&other, NULL, 0, dev));
  printf("second context %p (now current)\n", (void *)other);
  call("slot7(ctx, module of 2) with the other context current", s7, (uint64_t)ctx,
       (uint64_t)m[2], cb, m[2]);
  call("slot7(other ctx, module of 2 of ctx)", s7, (uint64_t)other, (uint64_t)m[2], cb, m[2]);
  call("slot7(NULL, module of 2 of ctx) with the other current", s7, 0, (uint64_t)m[2], cb, m[2]);
  CK(cuCtxSetCurrent(ctx));

  // A library's module.
  CUlibrary lib;
  char text[512];
  snprintf(text, sizeof text, "%s.visible .entry lk(.param .u64 p)\n{\n\tret;\n}\n", ptx_head);
  CK(cuLibraryLoadData(&lib, text, NULL, NULL, 0, NULL, NULL, 0));
  CUmodule lm;
  CK(cuLibraryGetModule(&lm, lib));
  call("slot7(ctx, a library's module of 1)", s7, (uint64_t)ctx, (uint64_t)lm, cb, lm);
  printf("done\n");
  return 0;
}
