// A CUDA C++ program as a tenant builds it (`nvcc -o runtime_kernels
// runtime_kernels.cu`: the runtime linked statically, the kernels in a fat
// binary the runtime registers before main). Its kernels have the names
// and parameters of fairvgpu.ptx's, so that the sim executor can run them.
// Exit 0 only if every result is right; the last line says so.
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
    std::exit(1); } } while (0)

extern "C" __global__ void vector_add(const float *a, const float *b, float *c, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void saxpy(float a, const float *x, float *y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    const unsigned n = 1 << 20;
    std::vector<float> a(n), b(n), c(n);
    for (unsigned i = 0; i < n; i++) { a[i] = i % 1000; b[i] = 2.0f * (i % 1000); }
    float *da, *db, *dc;
    CK(cudaMalloc(&da, n * sizeof(float)));
    CK(cudaMalloc(&db, n * sizeof(float)));
    CK(cudaMalloc(&dc, n * sizeof(float)));
    CK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    vector_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    CK(cudaGetLastError());
    saxpy<<<(n + 255) / 256, 256>>>(0.5f, da, dc, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (unsigned i = 0; i < n; i++) {
        float want = 3.5f * (i % 1000);
        if (c[i] != want) { std::printf("c[%u] = %f, want %f\n", i, c[i], want); return 1; }
    }
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, vector_add));
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    std::printf("runtime_kernels: %u elements correct, max %d threads per block\n", n,
                fa.maxThreadsPerBlock);
    return 0;
}
