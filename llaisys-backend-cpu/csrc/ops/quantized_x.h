// The activations of the block linears (linear_i8, linear_q) quantized per row and group of 32 k, on the fly:
//     sx = max|x| / 127 (f32),  xq = round-half-to-even(x / sx) in [-127, 127]
// with the integer sums of xq per half group (16 k): the block formats whose stored integers are unsigned
// (q + 128 for vpdpbusd, 4-bit codes, q4_0's and q6_k's offsets) and the formats with a min need them
// (block_formats.h). One row's xq depends on that row of x only.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "../common/thread_pool.h"
#include "linear.h"

namespace llaisys::cpu {

constexpr int64_t kQGroup = 32;  // k per group: of x here, and of every weight format (llaisys.ops.INT8_GROUP)
constexpr int kQHalf = 16;       // k per half group (q6_k's scales, the sums below)

}  // namespace llaisys::cpu

namespace llaisys::cpu::LLAISYS_ISA {

// x quantized (quantize_x): rows of ld int8 values (the K values, then zeros up to ld, a multiple of 64: whole
// groups for the kernels, rows 64-byte apart), and per (row, group) the f32 scale sx and the two half-group
// sums of xq (sum[(m * G + g) * 2 + h] for k in [32 g + 16 h, 32 g + 16 h + 16)).
struct QuantizedX {
    const int8_t* q;      // [M, ld]
    const float* sx;      // [M, G]
    const int32_t* sum;   // [M, G, 2]
    int64_t ld, G;

    int32_t group_sum(int64_t m, int64_t g) const { return sum[(m * G + g) * 2] + sum[(m * G + g) * 2 + 1]; }
};

// One group of n <= kQGroup values: xq (zero-padded to kQGroup), its scale and its two half sums. The scale is
// max|x| / 127 in f32 and xq = round-half-to-even(x / sx), x / sx computed as an f32 division (as the
// contract and the tests' reference do). A group with an inf or NaN gets the scale NaN (its row of out
// becomes NaN) and xq = 0; sx = 0 (all zero, or a max that underflows) gives xq = 0.
template <class T>
inline void quantize_group(const T* x, int n, int8_t* q, float* sx, int32_t* sum) {
    constexpr int W = Vec::W, L = int(kQGroup) / W;
    Vec v[L];
    Vec amax = Vec::zero();
    uint32_t nan = 0;
    for (int l = 0; l < L; ++l) {
        const int left = n - l * W;
        v[l] = left >= W ? Vec::load(x + l * W) : left > 0 ? Vec::load_partial(x + l * W, left) : Vec::zero();
        amax = vmax(amax, vmax(v[l], Vec::zero() - v[l]));
        nan |= bits(isnan_mask(v[l]));
    }
    const float s = reduce_max(amax) / 127.0f;
    const bool finite = !nan && s < std::numeric_limits<float>::infinity();
    if (!(finite && s > 0.0f)) {
        std::memset(q, 0, size_t(kQGroup));
        *sx = finite ? s : std::numeric_limits<float>::quiet_NaN();
        sum[0] = sum[1] = 0;
        return;
    }
    const Vec scale = Vec::set1(s), hi = Vec::set1(127.0f), lo = Vec::set1(-127.0f);
    int32_t halves[2] = {0, 0};
    for (int l = 0; l < L; ++l) {
        const Vec r = vmin(hi, vmax(lo, round_nearest(v[l] / scale)));  // |x / s| <= 127 up to a rounding error
        r.store(q + l * W);
        halves[l * W / kQHalf] += int32_t(reduce_add(r));  // exact: at most 16 integers of magnitude <= 127
    }
    *sx = s;
    sum[0] = halves[0];
    sum[1] = halves[1];
}

// x [M, K] of T -> QuantizedX in the calling thread's scratch (rows shared among threads when large).
template <class T>
inline QuantizedX quantize_x(const T* x, int64_t M, int64_t K) {
    const int64_t G = ceil_div(K, kQGroup), ld = round_up(K, 64);
    const size_t q_bytes = size_t(M * ld), s_bytes = size_t(round_up(M * G * 4, 64));
    char* buf = scratch(kSlotX).get<char>(q_bytes + 3 * s_bytes);
    int8_t* q = reinterpret_cast<int8_t*>(buf);
    float* sx = reinterpret_cast<float*>(buf + q_bytes);
    int32_t* sum = reinterpret_cast<int32_t*>(buf + q_bytes + s_bytes);
    run_ranges(M, [&](int64_t m_begin, int64_t m_end) {
        for (int64_t m = m_begin; m < m_end; ++m) {
            int8_t* qm = q + m * ld;
            for (int64_t g = 0; g < G; ++g) {
                const int64_t k0 = g * kQGroup;
                quantize_group(x + m * K + k0, int(std::min(kQGroup, K - k0)), qm + k0, sx + m * G + g,
                               sum + (m * G + g) * 2);
            }
            for (int64_t k = G * kQGroup; k < ld; ++k) qm[k] = 0;
        }
    }, M > 1 && M * K >= kParallelGrain);
    return QuantizedX{q, sx, sum, ld, G};
}

}  // namespace llaisys::cpu::LLAISYS_ISA
