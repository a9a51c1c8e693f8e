// On the GPU machine: a kernel that samples texture objects and writes a
// surface object, built with nvcc (the CUDA runtime over the driver, or over
// the stand-in). A 2D float array is filled from the host, a texture over it
// and one over linear device memory are read point-sampled, the kernel
// writes 2*t + l + 1 through a surface into a second array, and the host
// checks every value. Prints "texsurf: ok" and exits 0 only if all match.
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define CK(x)                                                                           \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x,                \
                    cudaGetErrorName(e_));                                              \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

__global__ void k(cudaTextureObject_t tex, cudaTextureObject_t lin, cudaSurfaceObject_t surf,
                  int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) {
        float t = tex2D<float>(tex, x + 0.5f, y + 0.5f);
        float l = tex1Dfetch<float>(lin, y * w + x);
        surf2Dwrite(2.0f * t + l + 1.0f, surf, x * (int)sizeof(float), y);
    }
}

int main() {
    const int w = 96, h = 40;
    std::vector<float> a(w * h), b(w * h), out(w * h);
    for (int i = 0; i < w * h; i++) {
        a[i] = (float)(i % 97) * 0.5f;
        b[i] = (float)(i % 13);
    }
    cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
    cudaArray_t in, res;
    CK(cudaMallocArray(&in, &f, w, h));
    CK(cudaMallocArray(&res, &f, w, h, cudaArraySurfaceLoadStore));
    CK(cudaMemcpy2DToArray(in, 0, 0, a.data(), w * sizeof(float), w * sizeof(float), h,
                           cudaMemcpyHostToDevice));
    float *d;
    CK(cudaMalloc(&d, w * h * sizeof(float)));
    CK(cudaMemcpy(d, b.data(), w * h * sizeof(float), cudaMemcpyHostToDevice));

    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = in;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t tex, lin;
    CK(cudaCreateTextureObject(&tex, &rd, &td, nullptr));
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeLinear;
    rd.res.linear.devPtr = d;
    rd.res.linear.desc = f;
    rd.res.linear.sizeInBytes = w * h * sizeof(float);
    CK(cudaCreateTextureObject(&lin, &rd, &td, nullptr));
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = res;
    cudaSurfaceObject_t surf;
    CK(cudaCreateSurfaceObject(&surf, &rd));

    dim3 block(16, 8), grid((w + 15) / 16, (h + 7) / 8);
    k<<<grid, block>>>(tex, lin, surf, w, h);
    CK(cudaGetLastError());
    CK(cudaMemcpy2DFromArray(out.data(), w * sizeof(float), res, 0, 0, w * sizeof(float), h,
                             cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < w * h; i++)
        if (out[i] != 2.0f * a[i] + b[i] + 1.0f) bad++;
    CK(cudaDestroySurfaceObject(surf));
    CK(cudaDestroyTextureObject(tex));
    CK(cudaDestroyTextureObject(lin));
    CK(cudaFreeArray(in));
    CK(cudaFreeArray(res));
    CK(cudaFree(d));
    if (bad) {
        printf("texsurf: FAILED: %d of %d values differ\n", bad, w * h);
        return 1;
    }
    printf("texsurf: ok (%d values sampled and written)\n", w * h);
    return 0;
}
