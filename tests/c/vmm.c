/*
 * CUDA's virtual memory management API through the driver: reserve, create,
 * map, set access, copies and a memset and a kernel on mapped memory, unmap,
 * release, free; and what must fail without harm (a foreign or released
 * handle, a foreign reservation, overlapping maps, unmapping part of a
 * mapping, copies to reserved but unmapped addresses, more memory than the
 * vGPU has). Compressible memory as cudaCompressibleMemory asks for it: made,
 * its properties saying so (read back from the host), mapped, written and
 * read back; a compression type the driver does not define is refused. Builds with plain gcc: with -DHAVE_CUDA_H against CUDA 13's
 * cuda.h, else with the declarations below and in cu_check.h (the driver's
 * ABI).
 *
 * usage: vmm KERNELS.ptx FOREIGN_HANDLE FOREIGN_RESERVATION [leak]
 * `leak`: maps memory and exits at once (_exit), freeing nothing: the host
 * must reclaim it all. Exit 0 only if all is right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu_check.h"

#ifndef HAVE_CUDA_H
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUmemLocation_st {
    int type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;
enum {
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED = 107,
    CU_MEM_ALLOCATION_COMP_NONE = 0,
    CU_MEM_ALLOCATION_COMP_GENERIC = 1,
};
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDeviceCanAccessPeer(int *, CUdevice, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, int);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuMemGetAccess(unsigned long long *, const CUmemLocation *, CUdeviceptr);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *,
                                                CUmemGenericAllocationHandle);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
#endif

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s KERNELS.ptx FOREIGN_HANDLE FOREIGN_RESERVATION [leak]\n", argv[0]);
        return 2;
    }
    CUmemGenericAllocationHandle foreign = strtoull(argv[2], NULL, 0);
    CUdeviceptr foreign_va = strtoull(argv[3], NULL, 0);
    int leak = argc > 4 && strcmp(argv[4], "leak") == 0;
    CUdevice dev;
    CUcontext ctx;
    int v = 0;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    if (v != 1) {
        fprintf(stderr, "VMM not supported (%d)\n", v);
        return 1;
    }
    CK(cuDeviceCanAccessPeer(&v, dev, dev));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t g = 0;
    CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (g != 2u << 20) {
        fprintf(stderr, "granularity %zu\n", g);
        return 1;
    }

    /* Four granules of addresses: h1 (two) and h2 (one) mapped back to back. */
    CUdeviceptr d = 0;
    CK(cuMemAddressReserve(&d, 4 * g, 0, 0, 0));
    CUmemGenericAllocationHandle h1, h2, h3, h4, hr;
    CK(cuMemCreate(&h1, 2 * g, &prop, 0));
    CK(cuMemCreate(&h2, 2 * g, &prop, 0));
    CK(cuMemMap(d, 2 * g, 0, h1, 0));
    CK(cuMemMap(d + 2 * g, g, g, h2, 0)); /* h2's second half */
    CK(cuMemRelease(h1));                 /* lives on while mapped */
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(d, 3 * g, &acc, 1));
    unsigned long long flags = 0;
    CK(cuMemGetAccess(&flags, &acc.location, d + g + 5));
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        fprintf(stderr, "access flags %llu\n", flags);
        return 1;
    }
    CUmemAllocationProp got;
    CK(cuMemGetAllocationPropertiesFromHandle(&got, h2));
    if (got.type != CU_MEM_ALLOCATION_TYPE_PINNED || got.location.id != dev ||
        got.allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_NONE) {
        fprintf(stderr, "properties of h2\n");
        return 1;
    }
    CK(cuMemRetainAllocationHandle(&hr, (void *)(d + 100)));
    if (hr != h1) {
        fprintf(stderr, "retained %llu, mapped %llu\n", hr, h1);
        return 1;
    }
    CK(cuMemRelease(hr));

    if (leak) {
        /* Dies holding a reservation, mappings and a handle. */
        printf("vmm: leaving without freeing\n");
        fflush(stdout);
        _exit(0);
    }

    /* A copy across the two mappings, both ways. */
    size_t n = 2 * g;
    unsigned char *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 7 + 3);
    CK(cuMemcpyHtoD_v2(d + g, src, n));
    CK(cuMemcpyDtoH_v2(back, d + g, n));
    if (memcmp(src, back, n) != 0) {
        fprintf(stderr, "round trip differs\n");
        return 1;
    }
    printf("vmm: %zu bytes round trip across two mappings\n", n);
    CK(cuMemsetD32_v2(d, 0x3f800000u, g / 4)); /* 1.0f over the first granule */
    float *f = (float *)back;
    CK(cuMemcpyDtoH_v2(f, d, 4096));
    for (int i = 0; i < 1024; i++)
        if (f[i] != 1.0f) {
            fprintf(stderr, "memset: [%d] = %f\n", i, f[i]);
            return 1;
        }

    /* A kernel reads and writes mapped memory: c (in h2) = a + b (in h1). */
    CUmodule mod;
    CUfunction add;
    char *ptx = read_file(argv[1]);
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&add, mod, "vector_add"));
    CUdeviceptr a = d, b = d + 4096, c = d + 2 * g + 64;
    unsigned int cnt = 1024;
    void *args[] = {&a, &b, &c, &cnt};
    CK(cuLaunchKernel(add, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH_v2(f, c, 4096));
    for (int i = 0; i < 1024; i++)
        if (f[i] != 2.0f) {
            fprintf(stderr, "vector_add: [%d] = %f\n", i, f[i]);
            return 1;
        }
    printf("vmm: kernel on mapped memory correct\n");

    /* What must fail, and leave the rest working. */
    BAD("map of a foreign handle", cuMemMap(d + 3 * g, g, 0, foreign, 0));
    CK(cuMemCreate(&h3, g, &prop, 0));
    CK(cuMemRelease(h3));
    BAD("map of a released handle", cuMemMap(d + 3 * g, g, 0, h3, 0));
    CK(cuMemCreate(&h4, g, &prop, 0));
    BAD("overlapping map", cuMemMap(d + g, g, 0, h4, 0));
    BAD("map into a foreign reservation", cuMemMap(foreign_va, g, 0, h4, 0));
    BAD("map past the handle", cuMemMap(d + 3 * g, g, g, h4, 0));
    BAD("unmap of part of a mapping", cuMemUnmap(d + g, g));
    BAD("unmap of unmapped memory", cuMemUnmap(d + 3 * g, g));
    BAD("free of a mapped reservation", cuMemAddressFree(d, 4 * g));
    BAD("copy to reserved, unmapped memory", cuMemcpyHtoD_v2(d + 3 * g, src, 16));
    BAD("copy from reserved, unmapped memory", cuMemcpyDtoH_v2(back, d + 3 * g, 16));
    CUmemGenericAllocationHandle huge;
    BAD("memory over the vGPU's limit", cuMemCreate(&huge, 512 * g, &prop, 0));
    BAD("release twice", cuMemRelease(h1));
    CK(cuMemMap(d + 3 * g, g, 0, h4, 0));
    CK(cuMemSetAccess(d + 3 * g, g, &acc, 1));
    CK(cuMemcpyHtoD_v2(d + 3 * g, src, 16));

    /* Compressible memory, as cudaCompressibleMemory makes it. */
    CK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev));
    if (v != 1) {
        fprintf(stderr, "no generic compression (%d)\n", v);
        return 1;
    }
    CUmemAllocationProp cprop = prop;
    cprop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    size_t cg = 0;
    CK(cuMemGetAllocationGranularity(&cg, &cprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr cd = 0;
    CUmemGenericAllocationHandle hc, hcr;
    CK(cuMemAddressReserve(&cd, 2 * cg, 0, 0, 0));
    CK(cuMemCreate(&hc, 2 * cg, &cprop, 0));
    memset(&got, 0, sizeof got);
    CK(cuMemGetAllocationPropertiesFromHandle(&got, hc));
    if (got.allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_GENERIC) {
        fprintf(stderr, "compressible memory not compressible (%d)\n",
                got.allocFlags.compressionType);
        return 1;
    }
    CK(cuMemMap(cd, 2 * cg, 0, hc, 0));
    CK(cuMemRelease(hc));
    CK(cuMemSetAccess(cd, 2 * cg, &acc, 1));
    /* Its handle found again from an address still says so. */
    CK(cuMemRetainAllocationHandle(&hcr, (void *)(cd + cg)));
    memset(&got, 0, sizeof got);
    CK(cuMemGetAllocationPropertiesFromHandle(&got, hcr));
    if (hcr != hc || got.allocFlags.compressionType != CU_MEM_ALLOCATION_COMP_GENERIC) {
        fprintf(stderr, "retained compressible handle %llu: compression %d\n", hcr,
                got.allocFlags.compressionType);
        return 1;
    }
    CK(cuMemRelease(hcr));
    size_t cn = 2 * cg < n ? 2 * cg : n;
    memset(back, 0, cn);
    CK(cuMemcpyHtoD_v2(cd, src, cn));
    CK(cuMemcpyDtoH_v2(back, cd, cn));
    if (memcmp(src, back, cn) != 0) {
        fprintf(stderr, "compressible round trip differs\n");
        return 1;
    }
    printf("vmm: compressible memory made, mapped, written and read back (%zu bytes)\n", cn);
    CK(cuMemUnmap(cd, 2 * cg));
    CK(cuMemAddressFree(cd, 2 * cg));
    cprop.allocFlags.compressionType = 2;
    BAD("compression type 2", cuMemCreate(&huge, g, &cprop, 0));
    BAD("granularity of compression type 2",
        cuMemGetAllocationGranularity(&cg, &cprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));

    /* Everything back, in pieces of whole mappings. */
    CK(cuMemUnmap(d, 3 * g));
    CK(cuMemUnmap(d + 3 * g, g));
    CK(cuMemRelease(h2));
    CK(cuMemRelease(h4));
    CK(cuMemAddressFree(d, 4 * g));
    BAD("use after free", cuMemcpyDtoH_v2(back, d, 16));
    printf("vmm: all checks passed\n");
    return 0;
}
