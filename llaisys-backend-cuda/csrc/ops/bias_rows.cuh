// out [M, N] = bias (each row) or 0: what a linear computes when K = 0 (linear_q, linear_gq).
#pragma once

#include "../common/dtype.cuh"

namespace llaisys::cuda {

template <class T>
__global__ void bias_rows_kernel(int64_t rows, int64_t cols, T* out, const T* bias) {
    const int64_t total = rows * cols, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] = bias ? bias[i % cols] : from_float<T>(0.0f);
}

}  // namespace llaisys::cuda
