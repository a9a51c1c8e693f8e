/*
 * CUDA arrays through the driver: 1D, 2D, 3D and layered arrays made and
 * described, bytes copied in and out through every copy path with an array
 * at one end (cuMemcpyHtoA/AtoH/DtoA/AtoD/AtoA, their Async forms,
 * cuMemcpy2D and cuMemcpy3D and their Async forms) and checked; texture
 * objects over an array, linear and pitched memory and a surface object
 * made, their descriptions read back, destroyed; and what must fail (a
 * format the driver has not, a copy past an array's end, a surface over an
 * array made without SURFACE_LDST; with `strict`, a texture over memory the
 * process does not own). Builds with plain cc: the driver's ABI is declared
 * below and in cu_check.h, with the checks.
 *
 * usage: arrays [strict]
 * Prints "ok: ..." for each check; exits 0 only if all is right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu_check.h"

typedef struct CUarray_st *CUarray;
typedef unsigned long long CUtexObject;
typedef unsigned long long CUsurfObject;

enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_FLOAT = 0x20,
    CUDA_ARRAY3D_LAYERED = 0x01,
    CUDA_ARRAY3D_SURFACE_LDST = 0x02,
    CU_MEMORYTYPE_HOST = 1,
    CU_MEMORYTYPE_DEVICE = 2,
    CU_MEMORYTYPE_ARRAY = 3,
    CU_RESOURCE_TYPE_ARRAY = 0,
    CU_RESOURCE_TYPE_LINEAR = 2,
    CU_RESOURCE_TYPE_PITCH2D = 3,
    CU_TR_ADDRESS_MODE_CLAMP = 1,
    CU_TR_FILTER_MODE_POINT = 0,
    CU_TR_FILTER_MODE_LINEAR = 1,
    CU_TRSF_READ_AS_INTEGER = 1,
};

typedef struct {
    size_t Width, Height;
    int Format;
    unsigned NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

typedef struct {
    int resType;
    union {
        struct {
            CUarray hArray;
        } array;
        struct {
            CUdeviceptr devPtr;
            int format;
            unsigned numChannels;
            size_t sizeInBytes;
        } linear;
        struct {
            CUdeviceptr devPtr;
            int format;
            unsigned numChannels;
            size_t width, height, pitchInBytes;
        } pitch2D;
        struct {
            int reserved[32];
        } reserved;
    } res;
    unsigned flags;
} CUDA_RESOURCE_DESC;

typedef struct {
    int addressMode[3];
    int filterMode;
    unsigned flags, maxAnisotropy;
    int mipmapFilterMode;
    float mipmapLevelBias, minMipmapLevelClamp, maxMipmapLevelClamp;
    float borderColor[4];
    int reserved[12];
} CUDA_TEXTURE_DESC;

CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *, CUarray);
CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *, CUarray);
CUresult cuMemcpyHtoA_v2(CUarray, size_t, const void *, size_t);
CUresult cuMemcpyAtoH_v2(void *, CUarray, size_t, size_t);
CUresult cuMemcpyHtoAAsync_v2(CUarray, size_t, const void *, size_t, CUstream);
CUresult cuMemcpyAtoHAsync_v2(void *, CUarray, size_t, size_t, CUstream);
CUresult cuMemcpyDtoA_v2(CUarray, size_t, CUdeviceptr, size_t);
CUresult cuMemcpyAtoD_v2(CUdeviceptr, CUarray, size_t, size_t);
CUresult cuMemcpyAtoA_v2(CUarray, size_t, CUarray, size_t, size_t);
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *, CUstream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *);
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *, CUstream);
CUresult cuTexObjectCreate(CUtexObject *, const CUDA_RESOURCE_DESC *, const CUDA_TEXTURE_DESC *,
                           const void *);
CUresult cuTexObjectDestroy(CUtexObject);
CUresult cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC *, CUtexObject);
CUresult cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC *, CUtexObject);
CUresult cuSurfObjectCreate(CUsurfObject *, const CUDA_RESOURCE_DESC *);
CUresult cuSurfObjectDestroy(CUsurfObject);
CUresult cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC *, CUsurfObject);

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 7 + seed + (i >> 8));
}

static CUDA_MEMCPY3D copy3d(void) {
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    return c;
}

int main(int argc, char **argv) {
    int strict = argc > 1 && strcmp(argv[1], "strict") == 0;
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream st;
    CK(cuStreamCreate(&st, 0));

    /* Refused descriptions. */
    CUarray bad = 0;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {64, 16, 0, 0x40, 1, 0};
    BAD("array of an unknown format", cuArray3DCreate_v2(&bad, &d3));
    d3.Format = CU_AD_FORMAT_FLOAT;
    d3.NumChannels = 3;
    BAD("array of three channels", cuArray3DCreate_v2(&bad, &d3));

    /* 1D arrays: 256 bytes each. */
    CUDA_ARRAY_DESCRIPTOR d1 = {256, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1};
    CUarray a1, b1;
    CK(cuArrayCreate_v2(&a1, &d1));
    CK(cuArrayCreate_v2(&b1, &d1));
    CUDA_ARRAY_DESCRIPTOR got1;
    CK(cuArrayGetDescriptor_v2(&got1, a1));
    EXPECT("1D descriptor", got1.Width == 256 && got1.Height == 0 &&
                                got1.Format == CU_AD_FORMAT_UNSIGNED_INT8 && got1.NumChannels == 1);
    unsigned char h[4096], hd[4096], back[4096];
    fill(h, 256, 1);
    CK(cuMemcpyHtoA_v2(a1, 0, h, 256));
    memset(back, 0, sizeof back);
    CK(cuMemcpyAtoH_v2(back, a1, 16, 64));
    EXPECT("HtoA then AtoH", memcmp(back, h + 16, 64) == 0);
    CUdeviceptr dbuf;
    CK(cuMemAlloc_v2(&dbuf, 1 << 16));
    fill(hd, 4096, 2); /* the device buffer's first bytes */
    CK(cuMemcpyHtoD_v2(dbuf, hd, 4096));
    CK(cuMemcpyDtoA_v2(a1, 128, dbuf + 8, 64));
    CK(cuMemcpyAtoD_v2(dbuf + 32768, a1, 128, 64));
    CK(cuMemcpyDtoH_v2(back, dbuf + 32768, 64));
    EXPECT("DtoA then AtoD", memcmp(back, hd + 8, 64) == 0);
    CK(cuMemcpyAtoA_v2(b1, 32, a1, 128, 64));
    CK(cuMemcpyAtoH_v2(back, b1, 32, 64));
    EXPECT("AtoA", memcmp(back, hd + 8, 64) == 0);
    fill(h, 256, 3);
    CK(cuMemcpyHtoAAsync_v2(b1, 0, h, 256, st));
    memset(back, 0, 256);
    CK(cuMemcpyAtoHAsync_v2(back, b1, 0, 256, st));
    CK(cuStreamSynchronize(st));
    EXPECT("HtoAAsync then AtoHAsync", memcmp(back, h, 256) == 0);
    BAD("copy past a 1D array's end", cuMemcpyHtoA_v2(a1, 200, h, 100));
    BAD("copy out past a 1D array's end", cuMemcpyAtoH_v2(back, a1, 255, 2));

    /* A 2D array of floats (64 x 16, rows of 256 bytes), surface-capable. */
    CUDA_ARRAY3D_DESCRIPTOR d2 = {64, 16, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SURFACE_LDST};
    CUarray a2;
    CK(cuArray3DCreate_v2(&a2, &d2));
    CUDA_ARRAY3D_DESCRIPTOR got3;
    CK(cuArray3DGetDescriptor_v2(&got3, a2));
    EXPECT("2D descriptor", got3.Width == 64 && got3.Height == 16 && got3.Depth == 0 &&
                                got3.Format == CU_AD_FORMAT_FLOAT && got3.NumChannels == 1 &&
                                got3.Flags == CUDA_ARRAY3D_SURFACE_LDST);
    CK(cuArrayGetDescriptor_v2(&got1, a2));
    EXPECT("2D descriptor (2D call)", got1.Width == 64 && got1.Height == 16);
    /* Host rows of 300 bytes into the array, then a box back out. */
    static unsigned char host2[300 * 16], out2[512 * 16];
    fill(host2, sizeof host2, 4);
    CUDA_MEMCPY2D c2;
    memset(&c2, 0, sizeof c2);
    c2.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2.srcHost = host2;
    c2.srcPitch = 300;
    c2.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c2.dstArray = a2;
    c2.WidthInBytes = 256;
    c2.Height = 16;
    CK(cuMemcpy2D_v2(&c2));
    memset(&c2, 0, sizeof c2);
    c2.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c2.srcArray = a2;
    c2.srcXInBytes = 16;
    c2.srcY = 2;
    c2.dstMemoryType = CU_MEMORYTYPE_HOST;
    c2.dstHost = out2;
    c2.dstPitch = 512;
    c2.WidthInBytes = 64;
    c2.Height = 5;
    memset(out2, 0, sizeof out2);
    CK(cuMemcpy2D_v2(&c2));
    int same = 1;
    for (int y = 0; y < 5; y++)
        same &= memcmp(out2 + y * 512, host2 + (y + 2) * 300 + 16, 64) == 0;
    EXPECT("2D host to array to host", same);
    /* Device (pitch 512) into the array and back out to the device. */
    CUDA_MEMCPY2D cd;
    memset(&cd, 0, sizeof cd);
    cd.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    cd.srcDevice = dbuf;
    cd.srcPitch = 512;
    cd.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    cd.dstArray = a2;
    cd.dstY = 4;
    cd.WidthInBytes = 256;
    cd.Height = 8;
    CK(cuMemcpy2DAsync_v2(&cd, st));
    memset(&cd, 0, sizeof cd);
    cd.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    cd.srcArray = a2;
    cd.srcY = 4;
    cd.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cd.dstDevice = dbuf + 8192;
    cd.dstPitch = 256;
    cd.WidthInBytes = 256;
    cd.Height = 8;
    CK(cuMemcpy2DAsync_v2(&cd, st));
    CK(cuStreamSynchronize(st));
    CK(cuMemcpyDtoH_v2(back, dbuf + 8192, 2048));
    same = 1;
    for (int y = 0; y < 8; y++) same &= memcmp(back + y * 256, hd + y * 512, 256) == 0;
    EXPECT("2D device to array to device", same);
    /* Host rows with gaps (pitch 300) into device memory without: the
       stand-in packs the rows into one copy; sync and async. */
    memset(&c2, 0, sizeof c2);
    c2.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2.srcHost = host2;
    c2.srcPitch = 300;
    c2.srcXInBytes = 8;
    c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c2.dstDevice = dbuf + 40960;
    c2.dstPitch = 256;
    c2.WidthInBytes = 256;
    c2.Height = 16;
    CK(cuMemcpy2D_v2(&c2));
    CK(cuMemcpyDtoH_v2(back, dbuf + 40960, 4096));
    same = 1;
    for (int y = 0; y < 16; y++) same &= memcmp(back + y * 256, host2 + y * 300 + 8, 256) == 0;
    EXPECT("2D host rows packed into device memory", same);
    /* More rows than one packed copy takes (4 MiB): 5000 rows of 1 KiB. */
    static unsigned char tall[1100 * 5000], tall_back[1024 * 5000];
    fill(tall, sizeof tall, 9);
    CUdeviceptr dtall;
    CK(cuMemAlloc_v2(&dtall, 1024 * 5000));
    c2.srcHost = tall;
    c2.srcPitch = 1100;
    c2.srcXInBytes = 0;
    c2.dstDevice = dtall;
    c2.dstPitch = 1024;
    c2.WidthInBytes = 1024;
    c2.Height = 5000;
    CK(cuMemcpy2DAsync_v2(&c2, st));
    CK(cuStreamSynchronize(st));
    CK(cuMemcpyDtoH_v2(tall_back, dtall, sizeof tall_back));
    same = 1;
    for (int y = 0; y < 5000; y++) same &= memcmp(tall_back + y * 1024, tall + y * 1100, 1024) == 0;
    EXPECT("2D host rows packed in runs, async", same);
    CK(cuMemFree_v2(dtall));
    memset(&c2, 0, sizeof c2);
    c2.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2.srcHost = host2;
    c2.srcPitch = 300;
    c2.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c2.dstArray = a2;
    c2.dstXInBytes = 200;
    c2.WidthInBytes = 64;
    c2.Height = 1;
    BAD("2D copy past a row's end", cuMemcpy2D_v2(&c2));
    c2.dstXInBytes = 0;
    c2.dstY = 12;
    c2.Height = 5;
    BAD("2D copy past the last row", cuMemcpy2D_v2(&c2));

    /* A 3D array: 16 x 8 x 4 of ushort2 (rows of 64 bytes). */
    CUDA_ARRAY3D_DESCRIPTOR dd = {16, 8, 4, CU_AD_FORMAT_UNSIGNED_INT16, 2, 0};
    CUarray a3, b3;
    CK(cuArray3DCreate_v2(&a3, &dd));
    CK(cuArray3DCreate_v2(&b3, &dd));
    CK(cuArray3DGetDescriptor_v2(&got3, a3));
    EXPECT("3D descriptor", got3.Width == 16 && got3.Height == 8 && got3.Depth == 4 &&
                                got3.Format == CU_AD_FORMAT_UNSIGNED_INT16 &&
                                got3.NumChannels == 2 && got3.Flags == 0);
    static unsigned char host3[64 * 8 * 4], out3[64 * 8 * 4];
    fill(host3, sizeof host3, 5);
    CUDA_MEMCPY3D c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host3;
    c.srcPitch = 64;
    c.srcHeight = 8;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = a3;
    c.WidthInBytes = 64;
    c.Height = 8;
    c.Depth = 4;
    CK(cuMemcpy3D_v2(&c));
    /* A box of it: bytes 8..40 of rows 1..5 of slices 1..3, packed. */
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = a3;
    c.srcXInBytes = 8;
    c.srcY = 1;
    c.srcZ = 1;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = out3;
    c.dstPitch = 32;
    c.dstHeight = 4;
    c.WidthInBytes = 32;
    c.Height = 4;
    c.Depth = 2;
    memset(out3, 0, sizeof out3);
    CK(cuMemcpy3D_v2(&c));
    same = 1;
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 4; y++)
            same &= memcmp(out3 + (z * 4 + y) * 32, host3 + ((z + 1) * 8 + y + 1) * 64 + 8, 32) == 0;
    EXPECT("3D host to array to host (a box)", same);
    /* Array to array, then to the device, then checked. */
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = a3;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = b3;
    c.WidthInBytes = 64;
    c.Height = 8;
    c.Depth = 4;
    CK(cuMemcpy3DAsync_v2(&c, st));
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = b3;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dbuf + 16384;
    c.dstPitch = 128;
    c.dstHeight = 10;
    c.WidthInBytes = 64;
    c.Height = 8;
    c.Depth = 4;
    CK(cuMemcpy3DAsync_v2(&c, st));
    /* And the device's copy into the first array's last slice. */
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = dbuf + 16384;
    c.srcPitch = 128;
    c.srcHeight = 10;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = a3;
    c.dstZ = 3;
    c.WidthInBytes = 64;
    c.Height = 8;
    c.Depth = 1;
    CK(cuMemcpy3D_v2(&c));
    CK(cuStreamSynchronize(st));
    static unsigned char dev3[128 * 10 * 4];
    CK(cuMemcpyDtoH_v2(dev3, dbuf + 16384, sizeof dev3));
    same = 1;
    for (int z = 0; z < 4; z++)
        for (int y = 0; y < 8; y++)
            same &= memcmp(dev3 + (z * 10 + y) * 128, host3 + (z * 8 + y) * 64, 64) == 0;
    EXPECT("3D array to array to device", same);
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = a3;
    c.srcZ = 3;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = out3;
    c.dstPitch = 64;
    c.dstHeight = 8;
    c.WidthInBytes = 64;
    c.Height = 8;
    c.Depth = 1;
    CK(cuMemcpy3D_v2(&c));
    EXPECT("3D device to array's last slice", memcmp(out3, host3, 64 * 8) == 0);
    c.srcZ = 2;
    c.Depth = 3;
    BAD("3D copy past the last slice", cuMemcpy3D_v2(&c));

    /* A layered 2D array: 8 x 8 floats, 3 layers. */
    CUDA_ARRAY3D_DESCRIPTOR dl = {8, 8, 3, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_LAYERED};
    CUarray al;
    CK(cuArray3DCreate_v2(&al, &dl));
    CK(cuArray3DGetDescriptor_v2(&got3, al));
    EXPECT("layered descriptor", got3.Depth == 3 && got3.Flags == CUDA_ARRAY3D_LAYERED);
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = host3;
    c.srcPitch = 32;
    c.srcHeight = 8;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c.dstArray = al;
    c.WidthInBytes = 32;
    c.Height = 8;
    c.Depth = 3;
    CK(cuMemcpy3D_v2(&c));
    c = copy3d();
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = al;
    c.srcZ = 1;
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = out3;
    c.dstPitch = 32;
    c.dstHeight = 8;
    c.WidthInBytes = 32;
    c.Height = 8;
    c.Depth = 2;
    memset(out3, 0, sizeof out3);
    CK(cuMemcpy3D_v2(&c));
    EXPECT("layered host to array to host", memcmp(out3, host3 + 32 * 8, 32 * 8 * 2) == 0);

    /* Texture objects: over the 2D array, linear memory, pitched memory. */
    CUDA_RESOURCE_DESC res, rback;
    CUDA_TEXTURE_DESC td, tback;
    memset(&res, 0, sizeof res);
    memset(&td, 0, sizeof td);
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = a2;
    td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    td.filterMode = CU_TR_FILTER_MODE_POINT;
    CUtexObject t1, t2, t3;
    CK(cuTexObjectCreate(&t1, &res, &td, NULL));
    EXPECT("texture over an array has a value", t1 != 0);
    memset(&rback, 0, sizeof rback);
    CK(cuTexObjectGetResourceDesc(&rback, t1));
    EXPECT("texture's resource", rback.resType == CU_RESOURCE_TYPE_ARRAY && rback.res.array.hArray == a2);
    memset(&tback, 0, sizeof tback);
    CK(cuTexObjectGetTextureDesc(&tback, t1));
    EXPECT("texture's description", tback.addressMode[0] == CU_TR_ADDRESS_MODE_CLAMP &&
                                        tback.addressMode[1] == CU_TR_ADDRESS_MODE_CLAMP &&
                                        tback.filterMode == CU_TR_FILTER_MODE_POINT);
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_LINEAR;
    res.res.linear.devPtr = dbuf;
    res.res.linear.format = CU_AD_FORMAT_UNSIGNED_INT8;
    res.res.linear.numChannels = 4;
    res.res.linear.sizeInBytes = 4096;
    td.flags = CU_TRSF_READ_AS_INTEGER;
    CK(cuTexObjectCreate(&t2, &res, &td, NULL));
    CK(cuTexObjectGetResourceDesc(&rback, t2));
    EXPECT("linear texture's resource", rback.resType == CU_RESOURCE_TYPE_LINEAR &&
                                            rback.res.linear.devPtr == dbuf &&
                                            rback.res.linear.sizeInBytes == 4096 &&
                                            rback.res.linear.numChannels == 4);
    CK(cuTexObjectGetTextureDesc(&tback, t2));
    EXPECT("linear texture's flags", tback.flags == CU_TRSF_READ_AS_INTEGER);
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_PITCH2D;
    res.res.pitch2D.devPtr = dbuf;
    res.res.pitch2D.format = CU_AD_FORMAT_FLOAT;
    res.res.pitch2D.numChannels = 1;
    res.res.pitch2D.width = 64;
    res.res.pitch2D.height = 16;
    res.res.pitch2D.pitchInBytes = 512;
    td.flags = 0;
    CK(cuTexObjectCreate(&t3, &res, &td, NULL));
    CK(cuTexObjectGetResourceDesc(&rback, t3));
    EXPECT("pitched texture's resource", rback.resType == CU_RESOURCE_TYPE_PITCH2D &&
                                             rback.res.pitch2D.width == 64 &&
                                             rback.res.pitch2D.height == 16 &&
                                             rback.res.pitch2D.pitchInBytes == 512);
    {
        /* Memory this process does not own: freed, and pitched memory past
         * its allocation. The stand-in's host refuses both (`strict`); the
         * driver itself may make them (it does not look), which is only
         * reported. A linear texture that starts in the process's memory
         * and reaches past its allocation is made, as the driver makes it
         * (convolutionFFT2D's over a padded width); the host's covers the
         * process's own part. */
        CUdeviceptr gone;
        CK(cuMemAlloc_v2(&gone, 1 << 16));
        CK(cuMemFree_v2(gone));
        CUtexObject tx;
        res.res.pitch2D.devPtr = gone;
        if (strict) {
            BAD("texture over freed memory", cuTexObjectCreate(&tx, &res, &td, NULL));
        } else {
            CUresult r = cuTexObjectCreate(&tx, &res, &td, NULL);
            printf("info: texture over freed memory: %s\n", cu_name(r));
            if (r == 0) CK(cuTexObjectDestroy(tx));
        }
        res.res.pitch2D.devPtr = dbuf;
        res.res.pitch2D.height = 1024;
        if (strict) {
            BAD("pitched texture past its allocation", cuTexObjectCreate(&tx, &res, &td, NULL));
        } else {
            CUresult r = cuTexObjectCreate(&tx, &res, &td, NULL);
            printf("info: pitched texture past its allocation: %s\n", cu_name(r));
            if (r == 0) CK(cuTexObjectDestroy(tx));
        }
        /* Linear float2 (two channels), past the allocation's end. */
        memset(&res, 0, sizeof res);
        res.resType = CU_RESOURCE_TYPE_LINEAR;
        res.res.linear.devPtr = dbuf;
        res.res.linear.format = CU_AD_FORMAT_FLOAT;
        res.res.linear.numChannels = 2;
        res.res.linear.sizeInBytes = 1 << 20;
        td.filterMode = CU_TR_FILTER_MODE_LINEAR;
        CK(cuTexObjectCreate(&tx, &res, &td, NULL));
        CK(cuTexObjectGetResourceDesc(&rback, tx));
        EXPECT("linear float2 texture past its allocation made",
               rback.res.linear.numChannels == 2 && rback.res.linear.sizeInBytes == 1 << 20);
        CK(cuTexObjectDestroy(tx));
        td.filterMode = CU_TR_FILTER_MODE_POINT;
    }

    /* A surface over the surface-capable array; none over the 3D one. */
    memset(&res, 0, sizeof res);
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = a2;
    CUsurfObject s1, s2;
    CK(cuSurfObjectCreate(&s1, &res));
    CK(cuSurfObjectGetResourceDesc(&rback, s1));
    EXPECT("surface's resource", rback.resType == CU_RESOURCE_TYPE_ARRAY && rback.res.array.hArray == a2);
    res.res.array.hArray = a3;
    /* The driver makes one without SURFACE_LDST too (H100, driver 580). */
    CK(cuSurfObjectCreate(&s2, &res));
    EXPECT("surface over an array without SURFACE_LDST made, as the driver makes it", s2 != 0);
    CK(cuSurfObjectDestroy(s2));

    CK(cuSurfObjectDestroy(s1));
    CK(cuTexObjectDestroy(t1));
    CK(cuTexObjectDestroy(t2));
    CK(cuTexObjectDestroy(t3));
    CK(cuArrayDestroy(a1));
    CK(cuArrayDestroy(b1));
    CK(cuArrayDestroy(a2));
    CK(cuArrayDestroy(a3));
    CK(cuArrayDestroy(b3));
    CK(cuArrayDestroy(al));
    CK(cuMemFree_v2(dbuf));
    CK(cuStreamDestroy_v2(st));
    CK(cuCtxSynchronize());
    printf("arrays: all freed\n");
    return 0;
}
