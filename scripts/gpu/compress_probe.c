// Compressible VMM memory as the driver answers it, run natively and
// through the stand-in by scripts/gpu/compressible.sh (the two outputs are
// compared line by line): whether the GPU has generic compression, the
// granularity with and without it, the compression type cuMemCreate gave
// (read back from the handle and from a handle retained by address), the
// bytes written and read back, and what an undefined compression type
// gets. `hold`: after the writes, waits for a line on stdin (the script
// moves the vGPU meanwhile) and checks the bytes and properties again.
#include <string.h>

#include "probe.h"

static const char *name(CUresult r) {
  const char *n = "?";
  cuGetErrorName(r, &n);
  return n;
}

static int comp_of(CUmemGenericAllocationHandle h) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  CK(cuMemGetAllocationPropertiesFromHandle(&p, h));
  return p.allocFlags.compressionType;
}

int main(int argc, char **argv) {
  int hold = argc > 1 && strcmp(argv[1], "hold") == 0;
  CUdevice dev;
  CUcontext ctx;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  int v = -1;
  CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev));
  printf("generic compression supported: %d\n", v);

  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gmin = 0, grec = 0;
  CK(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  printf("granularity plain: minimum %zu recommended %zu\n", gmin, grec);
  CUmemAllocationProp cprop = prop;
  cprop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
  CK(cuMemGetAllocationGranularity(&gmin, &cprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK(cuMemGetAllocationGranularity(&grec, &cprop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  printf("granularity compressible: minimum %zu recommended %zu\n", gmin, grec);

  // 64 MiB of compressible memory, as cudaCompressibleMemory makes it.
  size_t n = 64u << 20;
  n = (n + grec - 1) / grec * grec;
  CUdeviceptr d = 0;
  CUmemGenericAllocationHandle h, hr;
  CK(cuMemAddressReserve(&d, n, 0, 0, 0));
  CK(cuMemCreate(&h, n, &cprop, 0));
  printf("created: compression type %d\n", comp_of(h));
  CK(cuMemMap(d, n, 0, h, 0));
  CK(cuMemRelease(h));
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(d, n, &acc, 1));
  CK(cuMemRetainAllocationHandle(&hr, (void *)(d + n / 2)));
  printf("retained: compression type %d\n", comp_of(hr));
  CK(cuMemRelease(hr));

  unsigned *src = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n / 4; i++) src[i] = (unsigned)(i * 2654435761u);
  // Half compressible data (zeros), half not.
  memset(src, 0, n / 2);
  CK(cuMemcpyHtoD(d, src, n));
  CK(cuMemcpyDtoH(back, d, n));
  printf("round trip of %zu MiB: %s\n", n >> 20, memcmp(src, back, n) ? "DIFFERS" : "same");
  if (hold) {
    printf("holding\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    memset(back, 0, n);
    CK(cuMemcpyDtoH(back, d, n));
    printf("after the move: %s\n", memcmp(src, back, n) ? "DIFFERS" : "same");
    CK(cuMemRetainAllocationHandle(&hr, (void *)d));
    printf("after the move: compression type %d\n", comp_of(hr));
    CK(cuMemRelease(hr));
  }
  CK(cuMemUnmap(d, n));
  CK(cuMemAddressFree(d, n));

  cprop.allocFlags.compressionType = 2;
  printf("cuMemCreate of compression type 2: %s\n", name(cuMemCreate(&h, n, &cprop, 0)));
  printf("granularity of compression type 2: %s\n",
         name(cuMemGetAllocationGranularity(&gmin, &cprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
  printf("done\n");
  return 0;
}
