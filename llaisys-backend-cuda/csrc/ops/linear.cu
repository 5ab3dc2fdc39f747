// linear: out [M, N] = x [M, K] @ weight [N, K]^T + bias [N], through cublasGemmEx with f32 accumulation on
// the stream's own cuBLAS handle. Row-major out is column-major out^T = weight @ x^T: weight read
// transposed (lda = K), x as is (ldb = K), out with ldc = N. With a bias, a small kernel first fills every
// row of out with it and the GEMM adds its product (beta = 1): f32 alpha * (x @ w^T) + bias, one rounding.
#include <climits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"

namespace llaisys::cuda {
namespace {

// out[m, :] = bias (or 0 when bias is NULL) for every row m.
template <class T>
__global__ void fill_rows_kernel(int64_t rows, int64_t cols, T* out, const T* bias) {
    const int64_t total = rows * cols, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] = bias ? bias[i % cols] : from_float<T>(0.0f);
}

template <class T> constexpr cudaDataType kCudaType = CUDA_R_32F;
template <> constexpr cudaDataType kCudaType<f16> = CUDA_R_16F;
template <> constexpr cudaDataType kCudaType<bf16> = CUDA_R_16BF;

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(linear)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out, const void* x,
                       const void* weight, const void* bias) {
    using namespace llaisys::cuda;
    return guard("linear", [&] {
        StreamContext& s = stream_context(device, stream);
        if (M <= 0 || N <= 0) return;
        if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
            throw NotSupported("cuBLAS takes dimensions below 2^31, got M=" + std::to_string(M) + " N=" +
                               std::to_string(N) + " K=" + std::to_string(K));
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            if (bias || K == 0) {
                auto fill = &fill_rows_kernel<T>;
                const unsigned blocks = blocks_for(M * N, 256, int64_t(device_context(device).sm_count) * 8);
                LLAISYS_LAUNCH(fill, blocks, 256, 0, s.stream, M, N, static_cast<T*>(out), static_cast<const T*>(bias));
            }
            if (K == 0) return;
            const float alpha = 1.0f, beta = bias ? 1.0f : 0.0f;
            const cudaDataType type = kCudaType<T>;
            CUBLAS_CHECK(cublasGemmEx(s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, weight, type,
                                      int(K), x, type, int(K), &beta, out, type, int(N), CUDA_R_32F,
                                      CUBLAS_GEMM_DEFAULT));
        });
    });
}
