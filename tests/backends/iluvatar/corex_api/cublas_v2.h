/* Test-only: the cuBLAS API as Iluvatar CoreX offers it, for the clang-22 compile check of the shared sources
 * in the CoreX configuration (tests/backends/cuda/test_clang_cuda.py). It declares, and only declares, what
 * those sources call, with CUDA 10.2's signatures, because CoreX ships a CUDA 10.2-era cuBLAS (CoreX 4.4:
 * libcublas.so.10.2): cublasGemmEx takes its compute type as a cudaDataType (there is no
 * cublasComputeType_t), and there is no cublasSetWorkspace. CoreX adds CUDA_R_16BF for bf16 GEMMs (it comes
 * from library_types.h, here CUDA 13's). A source that calls anything else of cuBLAS fails this check, so a
 * call CoreX may lack is noticed before it reaches a CoreX machine. */
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

struct cublasContext;
typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cudaDataType computeType, cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif
