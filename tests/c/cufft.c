// cuFFT through the stand-in: plans a 1D complex-to-complex transform,
// which makes cuFFT load its kernels and look up their handles (through the
// driver's tools module table, 6e163fbe, slot 7), and destroys the plan.
// With `exec` it also runs the transform forward and back and checks it
// against a direct DFT (this needs a GPU: the sim runs no cuFFT kernels).
//
// usage: cufft [exec]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cufft.h>

#define CUDA(x)                                                                \
    do {                                                                       \
        cudaError_t e_ = (x);                                                  \
        if (e_ != cudaSuccess) {                                               \
            printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x,                  \
                   cudaGetErrorString(e_));                                    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

#define FFT(x)                                                                 \
    do {                                                                       \
        cufftResult r_ = (x);                                                  \
        if (r_ != CUFFT_SUCCESS) {                                             \
            printf("%s:%d: %s: cufftResult %d\n", __FILE__, __LINE__, #x,      \
                   (int)r_);                                                   \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

enum { N = 1000 };

// Plans (twice: the second plan finds the kernels already loaded) and
// destroys them; runs the transform when asked.
int main(int argc, char **argv) {
    int exec = argc > 1 && strcmp(argv[1], "exec") == 0;
    int version = 0;
    FFT(cufftGetVersion(&version));
    printf("cufft: version %d\n", version);

    cufftHandle plan, plan2;
    FFT(cufftPlan1d(&plan, N, CUFFT_C2C, 1));
    FFT(cufftPlan1d(&plan2, 4096, CUFFT_C2C, 4));
    size_t work = 0;
    FFT(cufftGetSize(plan, &work));
    printf("cufft: plans made (work area %zu bytes)\n", work);

    if (exec) {
        cufftComplex *h = malloc(sizeof(cufftComplex) * N);
        cufftComplex *f = malloc(sizeof(cufftComplex) * N);
        for (int i = 0; i < N; i++) {
            h[i].x = (float)((i * 37) % 101) / 101.0f - 0.5f;
            h[i].y = (float)((i * 53) % 97) / 97.0f - 0.5f;
        }
        cufftComplex *d;
        CUDA(cudaMalloc((void **)&d, sizeof(cufftComplex) * N));
        CUDA(cudaMemcpy(d, h, sizeof(cufftComplex) * N, cudaMemcpyHostToDevice));
        FFT(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
        CUDA(cudaMemcpy(f, d, sizeof(cufftComplex) * N, cudaMemcpyDeviceToHost));
        // The forward transform against a direct DFT.
        double worst = 0;
        for (int k = 0; k < N; k++) {
            double re = 0, im = 0;
            for (int n = 0; n < N; n++) {
                double a = -2 * M_PI * (double)((long)k * n % N) / N;
                re += h[n].x * cos(a) - h[n].y * sin(a);
                im += h[n].x * sin(a) + h[n].y * cos(a);
            }
            double e = hypot(f[k].x - re, f[k].y - im);
            if (e > worst)
                worst = e;
        }
        // Back again: N times the input.
        FFT(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
        CUDA(cudaMemcpy(f, d, sizeof(cufftComplex) * N, cudaMemcpyDeviceToHost));
        double back = 0;
        for (int n = 0; n < N; n++) {
            double e = hypot(f[n].x / N - h[n].x, f[n].y / N - h[n].y);
            if (e > back)
                back = e;
        }
        printf("cufft: forward max error %.3g, round trip max error %.3g\n",
               worst, back);
        if (!(worst < 1e-3) || !(back < 1e-4)) {
            printf("cufft: FAILED\n");
            return 1;
        }
        printf("cufft: transform correct\n");
        CUDA(cudaFree(d));
        free(h);
        free(f);
    }

    FFT(cufftDestroy(plan2));
    FFT(cufftDestroy(plan));
    CUDA(cudaDeviceSynchronize());
    printf("cufft: all checks passed\n");
    return 0;
}
