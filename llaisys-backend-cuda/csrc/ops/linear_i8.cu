// linear_i8: linear with int8 weights in blocks of 16 rows (backend.h), the CPU kernel's arithmetic bit for bit
// (linear_i8.cuh). Two kernels per pass of rows:
//   1. quantize_kernel: the pass's rows of x into xq and sx, in the stream's workspace (one thread per group);
//   2. linear_i8_kernel: a block per (weight block of 16 rows, MR rows of x): its warps compute the exact group
//      dots of the block's weights (each weight byte read once per MR rows), and 16 MR threads run the f32
//      chains over the groups in order (i8::block_chains).
// A pass is as many rows as the workspace holds quantized (all of them for any prompt of the model shapes with
// the default 16 MiB); a row's result does not depend on MR, the pass or the other rows.
#include <string>

#include "../common/context.h"
#include "../common/launch.h"
#include "linear_i8.cuh"

namespace llaisys::cuda {
namespace {

// grid (ceil(N / 16), row tiles), i8::kThreads threads: block (b, y) computes columns 16 b .. 16 b + 15 of out for
// rows m0 .. m0 + MR - 1, m0 = MR y (then MR gridDim.y further, while rows are left).
template <class T, int MR>
__global__ void __launch_bounds__(i8::kThreads) linear_i8_kernel(int64_t M, int64_t N, T* out, i8::QuantizedRows xq,
                                                                 const int8_t* weight, const bf16* scales,
                                                                 const T* bias) {
    const int64_t blk = blockIdx.x;
    const int8_t* w = weight + blk * xq.G * i8::kGroupBytes;
    const bf16* sc = scales + blk * xq.G * i8::kBlockRows;
    for (int64_t m0 = int64_t(blockIdx.y) * MR; m0 < M; m0 += int64_t(gridDim.y) * MR) {
        int64_t rows[MR];
#pragma unroll
        for (int m = 0; m < MR; ++m) rows[m] = m0 + m < M ? m0 + m : -1;
        const float acc = i8::block_chains<MR>(w, sc, xq, rows);
        if (int(threadIdx.x) < i8::kBlockRows * MR) {
            const int64_t m = m0 + int(threadIdx.x) / i8::kBlockRows, n = blk * i8::kBlockRows + int(threadIdx.x) % i8::kBlockRows;
            if (m < M && n < N) {
                // K = 0: out = bias itself (as the CPU kernel copies it), not 0 + bias
                const float b = bias ? to_float(bias[n]) : 0.0f;
                out[m * N + n] = from_float<T>(!bias ? acc : xq.G ? acc + b : b);
            }
        }
    }
}

template <class T, int MR>
void launch_dots(StreamContext& s, int64_t M, int64_t N, T* out, const i8::QuantizedRows& xq, const int8_t* weight,
                 const bf16* scales, const T* bias) {
    const int64_t tiles = (M + MR - 1) / MR;
    const dim3 grid(unsigned((N + i8::kBlockRows - 1) / i8::kBlockRows), unsigned(tiles < 65535 ? tiles : 65535));
    auto kernel = &linear_i8_kernel<T, MR>;
    LLAISYS_LAUNCH(kernel, grid, i8::kThreads, 0, s.stream, M, N, out, xq, weight, scales, bias);
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(linear_i8)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K, void* out,
                          const void* x, const void* weight, const void* scales, const void* bias) {
    using namespace llaisys::cuda;
    return guard("linear_i8", [&] {
        StreamContext& s = stream_context(device, stream);
        if (M <= 0 || N <= 0) return;
        const int64_t G = (K + i8::kGroup - 1) / i8::kGroup, ld = G * i8::kGroup;
        // a pass: xq (rows x ld bytes, then padding to 256) and sx (rows x G floats) in the workspace
        const int64_t row_bytes = ld + G * int64_t(sizeof(float));
        const int64_t pass_rows = row_bytes ? int64_t(s.workspace_bytes - 256) / row_bytes : M;
        if (pass_rows < 1)
            throw NotSupported("K = " + std::to_string(K) + " needs " + std::to_string(row_bytes) +
                               " bytes of workspace per row; the stream has " + std::to_string(s.workspace_bytes));
        const int sm_count = device_context(device).sm_count;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            for (int64_t r0 = 0; r0 < M; r0 += pass_rows) {
                const int64_t rows = M - r0 < pass_rows ? M - r0 : pass_rows;
                int8_t* q = static_cast<int8_t*>(s.workspace);
                float* sx = reinterpret_cast<float*>(q + (rows * ld + 255) / 256 * 256);
                const T* xr = static_cast<const T*>(x) + r0 * K;
                if (G > 0) {
                    auto quantize = &i8::quantize_kernel<T>;
                    LLAISYS_LAUNCH(quantize, blocks_for(rows * G, 256, int64_t(sm_count) * 8), 256, 0, s.stream, rows, K,
                                   xr, q, sx, ld, G);
                }
                const i8::QuantizedRows xq{q, sx, ld, G};
                T* o = static_cast<T*>(out) + r0 * N;
                const auto* w = static_cast<const int8_t*>(weight);
                const auto* sc = static_cast<const bf16*>(scales);
                const auto* b = static_cast<const T*>(bias);
                if (rows == 1) launch_dots<T, 1>(s, rows, N, o, xq, w, sc, b);  // decode: weight-bound
                else if (rows == 2) launch_dots<T, 2>(s, rows, N, o, xq, w, sc, b);
                else if (rows <= 4) launch_dots<T, 4>(s, rows, N, o, xq, w, sc, b);
                else launch_dots<T, i8::kMaxRows>(s, rows, N, o, xq, w, sc, b);
            }
        });
    });
}
