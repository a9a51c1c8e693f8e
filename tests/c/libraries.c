/* NVIDIA's cuRAND, cuSPARSE, cuSOLVER and cuBLASLt through the stand-in: each makes
 * its handle (loading its kernels, asking the driver for its context and
 * device), binds it to a stream of ours, answers the questions it answers
 * without running a kernel (workspace sizes), and lets go. Run by
 * tests/tests/cuda_runtime.rs against the sim, which runs none of these
 * libraries' kernels. */
#include <stdio.h>
#include <cuda_runtime.h>
#include <curand.h>
#include <cusparse.h>
#include <cusolverDn.h>
#include <cublasLt.h>

static int failures;
#define CHECK(what, x)                                                          \
    do {                                                                        \
        int r_ = (int)(x);                                                      \
        if (r_) {                                                               \
            printf("libraries: %s failed: %d\n", what, r_);                     \
            failures++;                                                         \
        }                                                                       \
    } while (0)

int main(void) {
    cudaStream_t st;
    CHECK("cudaStreamCreate", cudaStreamCreate(&st));

    curandGenerator_t g;
    CHECK("curandCreateGenerator", curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    CHECK("curandSetStream", curandSetStream(g, st));
    CHECK("curandSetPseudoRandomGeneratorSeed", curandSetPseudoRandomGeneratorSeed(g, 1234));
    CHECK("curandDestroyGenerator", curandDestroyGenerator(g));

    /* A 4x4 CSR matrix of 4 nonzeros and two vectors, in device memory. */
    int *rows, *cols;
    float *vals, *x, *y;
    CHECK("cudaMalloc rows", cudaMalloc((void **)&rows, 5 * sizeof(int)));
    CHECK("cudaMalloc cols", cudaMalloc((void **)&cols, 4 * sizeof(int)));
    CHECK("cudaMalloc vals", cudaMalloc((void **)&vals, 4 * sizeof(float)));
    CHECK("cudaMalloc x", cudaMalloc((void **)&x, 4 * sizeof(float)));
    CHECK("cudaMalloc y", cudaMalloc((void **)&y, 4 * sizeof(float)));
    cusparseHandle_t sp;
    CHECK("cusparseCreate", cusparseCreate(&sp));
    CHECK("cusparseSetStream", cusparseSetStream(sp, st));
    int version = 0;
    CHECK("cusparseGetVersion", cusparseGetVersion(sp, &version));
    cusparseSpMatDescr_t a;
    cusparseDnVecDescr_t vx, vy;
    CHECK("cusparseCreateCsr", cusparseCreateCsr(&a, 4, 4, 4, rows, cols, vals, CUSPARSE_INDEX_32I,
                                                 CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    CHECK("cusparseCreateDnVec x", cusparseCreateDnVec(&vx, 4, x, CUDA_R_32F));
    CHECK("cusparseCreateDnVec y", cusparseCreateDnVec(&vy, 4, y, CUDA_R_32F));
    float one = 1.0f, zero = 0.0f;
    size_t spmv = (size_t)-1;
    CHECK("cusparseSpMV_bufferSize", cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, a, vx,
                                                             &zero, vy, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &spmv));
    if (spmv == (size_t)-1) {
        printf("libraries: cusparseSpMV_bufferSize gave no size\n");
        failures++;
    }
    CHECK("cusparseDestroySpMat", cusparseDestroySpMat(a));
    CHECK("cusparseDestroyDnVec x", cusparseDestroyDnVec(vx));
    CHECK("cusparseDestroyDnVec y", cusparseDestroyDnVec(vy));
    CHECK("cusparseDestroy", cusparseDestroy(sp));

    cusolverDnHandle_t dn;
    CHECK("cusolverDnCreate", cusolverDnCreate(&dn));
    CHECK("cusolverDnSetStream", cusolverDnSetStream(dn, st));
    double *m;
    CHECK("cudaMalloc m", cudaMalloc((void **)&m, 64 * 64 * sizeof(double)));
    int lwork = -1;
    CHECK("cusolverDnDpotrf_bufferSize",
          cusolverDnDpotrf_bufferSize(dn, CUBLAS_FILL_MODE_LOWER, 64, m, 64, &lwork));
    if (lwork < 0) {
        printf("libraries: cusolverDnDpotrf_bufferSize gave no size\n");
        failures++;
    }
    CHECK("cusolverDnDestroy", cusolverDnDestroy(dn));

    /* cuBLASLt's heuristics for a 256x256x256 FP32 matmul: chosen from the
     * device's properties, no kernel runs. */
    cublasLtHandle_t lt;
    CHECK("cublasLtCreate", cublasLtCreate(&lt));
    cublasLtMatmulDesc_t op;
    CHECK("cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK("cublasLtMatrixLayoutCreate a", cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 256, 256, 256));
    CHECK("cublasLtMatrixLayoutCreate b", cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 256, 256, 256));
    CHECK("cublasLtMatrixLayoutCreate c", cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 256, 256, 256));
    cublasLtMatmulPreference_t pref;
    CHECK("cublasLtMatmulPreferenceCreate", cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = 4 << 20;
    CHECK("cublasLtMatmulPreferenceSetAttribute",
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t heur[4];
    int found = 0;
    CHECK("cublasLtMatmulAlgoGetHeuristic",
          cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 4, heur, &found));
    if (found < 1) {
        printf("libraries: cuBLASLt found no algorithm\n");
        failures++;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    CHECK("cublasLtDestroy", cublasLtDestroy(lt));

    cudaFree(rows);
    cudaFree(cols);
    cudaFree(vals);
    cudaFree(x);
    cudaFree(y);
    cudaFree(m);
    CHECK("cudaStreamDestroy", cudaStreamDestroy(st));
    printf("libraries: cusparse %d, potrf workspace %d, spmv buffer %zu, cublasLt algorithms %d\n", version,
           lwork, spmv, found);
    if (failures) {
        printf("libraries: %d checks failed\n", failures);
        return 1;
    }
    printf("libraries: all checks passed\n");
    return 0;
}
