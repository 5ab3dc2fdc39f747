// linear_i8: out[M, N] = x[M, K] @ w[N, K]^T + bias[N] with int8 weights w[n, k] = scale(n, k / 32) * q[n, k],
// q and the scales stored in blocks of 16 rows (backend.h, linear_i8; llaisys.ops.int8 makes them):
//     weight [NB, G, 8, 16, 4]: weight[b][g][s][r][i] = q[16 b + r, 32 g + 4 s + i]
//     scales [NB, G, 16]:       scales[b][g][r] = scale(16 b + r, g)
// zero past N and K, so a kernel reads whole blocks and groups.
//
// Every row of x is quantized on the fly per group of kI8Group k, like the weights: sx = max|x| / 127,
// xq = round-half-to-even(x / sx) (quantize_x, into a per-thread scratch). Then
//     out[m, n] = sum over g, in order, of (scale(n, g) * sx[m, g]) * dot_g(q[n], xq[m]) + bias[n]
// with every group dot product an exact int32 and the rest f32, rounded once to the output dtype.
// A row of out depends on its row of x only: the integer dots are exact and the f32 chain over g runs in the
// same order whatever M is (batch invariance).
//
// linear_i8.cpp: the exported entry point and each build's choice of kernel; linear_i8_simd.h: the SIMD
// kernel (avx2 / avx512 builds, with or without AVX512-VNNI); the portable build runs linear_i8_scalar below.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "../common/thread_pool.h"
#include "linear.h"

namespace llaisys::cpu {

constexpr int64_t kI8Group = 32;                                       // k per scale (llaisys.ops.INT8_GROUP)
constexpr int kI8BlockRows = 16;                                       // rows per block (INT8_BLOCK_ROWS)
constexpr int kI8Steps = int(kI8Group) / 4;                            // steps of 4 k per group
constexpr int64_t kI8GroupBytes = kI8Group * kI8BlockRows;             // one group of one block: 512 bytes

struct LinearI8Args {
    int dtype;                 // LLAISYS_F32 / _F16 / _BF16: out, x and bias
    int64_t M, N, K;           // M, N >= 1 (the entry point returns before), K >= 0
    void* out;                 // [M, N]
    const void* x;             // [M, K]
    const int8_t* weight;      // [NB, G, 8, 16, 4] blocks, values in [-127, 127]
    const bf16_t* scales;      // [NB, G, 16] blocks
    const void* bias;          // [N] or nullptr
};

// LLAISYS_CPU_LINEAR_VNNI=0: no AVX512-VNNI (vpdpbusd) even where the CPU has it (the avx512 build then
// takes the path of AVX-512 CPUs without VNNI). Read once per process; tests use it to reach every path.
bool linear_vnni_allowed();

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void linear_i8(const LinearI8Args& args))

namespace llaisys::cpu::LLAISYS_ISA {

// x quantized per row and group (quantize_x): rows of ld int8 values (the K values, then zeros up to ld, a
// multiple of 64: whole groups for the kernels, rows 64-byte apart), and per (row, group) the f32 scale sx and
// -128 * the sum of the group's xq (the correction of vpdpbusd's unsigned operand, see linear_i8_simd.h).
struct QuantizedX {
    const int8_t* q;       // [M, ld]
    const float* sx;       // [M, G]
    const int32_t* corr;   // [M, G]
    int64_t ld, G;
};

// One group of n <= kI8Group values: xq (zero-padded to kI8Group), its scale and its correction. The scale is
// max|x| / 127 in f32 and xq = round-half-to-even(x / sx), x / sx computed as an f32 division (as the
// contract and the tests' reference do). A group with an inf or NaN gets the scale NaN (its row of out
// becomes NaN) and xq = 0; sx = 0 (all zero, or a max that underflows) gives xq = 0.
template <class T>
inline void quantize_group(const T* x, int n, int8_t* q, float* sx, int32_t* corr) {
    constexpr int W = Vec::W, L = int(kI8Group) / W;
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
        std::memset(q, 0, size_t(kI8Group));
        *sx = finite ? s : std::numeric_limits<float>::quiet_NaN();
        *corr = 0;
        return;
    }
    const Vec scale = Vec::set1(s), hi = Vec::set1(127.0f), lo = Vec::set1(-127.0f);
    float r[kI8Group];  // |x / s| <= 127 up to a rounding error; clamped all the same
    for (int l = 0; l < L; ++l) vmin(hi, vmax(lo, round_nearest(v[l] / scale))).store(r + l * W);
    int32_t sum = 0;
    for (int i = 0; i < int(kI8Group); ++i) {
        q[i] = int8_t(int32_t(r[i]));
        sum += int32_t(r[i]);
    }
    *sx = s;
    *corr = -128 * sum;
}

// x [M, K] of T -> QuantizedX in the calling thread's scratch (rows shared among threads when large).
template <class T>
inline QuantizedX quantize_x(const T* x, int64_t M, int64_t K) {
    const int64_t G = ceil_div(K, kI8Group), ld = round_up(K, 64);
    const size_t q_bytes = size_t(M * ld), s_bytes = size_t(round_up(M * G * 4, 64));
    char* buf = scratch(kSlotX).get<char>(q_bytes + 2 * s_bytes);
    int8_t* q = reinterpret_cast<int8_t*>(buf);
    float* sx = reinterpret_cast<float*>(buf + q_bytes);
    int32_t* corr = reinterpret_cast<int32_t*>(buf + q_bytes + s_bytes);
    run_ranges(M, [&](int64_t m_begin, int64_t m_end) {
        for (int64_t m = m_begin; m < m_end; ++m) {
            int8_t* qm = q + m * ld;
            for (int64_t g = 0; g < G; ++g) {
                const int64_t k0 = g * kI8Group;
                quantize_group(x + m * K + k0, int(std::min(kI8Group, K - k0)), qm + k0, sx + m * G + g, corr + m * G + g);
            }
            for (int64_t k = G * kI8Group; k < ld; ++k) qm[k] = 0;
        }
    }, M > 1 && M * K >= kParallelGrain);
    return QuantizedX{q, sx, corr, ld, G};
}

// The portable build's kernel: one output at a time, the same arithmetic in scalar code (without FMA).
template <class T>
void linear_i8_scalar(const LinearI8Args& a, const QuantizedX& xq) {
    const int64_t M = a.M, N = a.N, G = xq.G;
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    run_ranges(N, [&](int64_t n_begin, int64_t n_end) {
        for (int64_t n = n_begin; n < n_end; ++n) {
            const int64_t b = n / kI8BlockRows, r = n % kI8BlockRows;
            const int8_t* w = a.weight + b * G * kI8GroupBytes + r * 4;  // + g * kI8GroupBytes + s * 64 + i
            const bf16_t* sc = a.scales + b * G * kI8BlockRows + r;        // + g * kI8BlockRows
            for (int64_t m = 0; m < M; ++m) {
                const int8_t* x = xq.q + m * xq.ld;
                float acc = 0.0f;
                for (int64_t g = 0; g < G; ++g) {
                    int32_t dot = 0;  // the padding past K is zero in both
                    for (int s = 0; s < kI8Steps; ++s)
                        for (int i = 0; i < 4; ++i)
                            dot += int32_t(w[g * kI8GroupBytes + s * 4 * kI8BlockRows + i]) *
                                   int32_t(x[g * kI8Group + 4 * s + i]);
                    acc += (to_f32(sc[g * kI8BlockRows]) * xq.sx[m * G + g]) * float(dot);
                }
                if (bias) acc += to_f32(bias[n]);
                out[m * N + n] = from_f32<T>(acc);
            }
        }
    }, N * a.K * M >= (int64_t(1) << 16));
}

}  // namespace llaisys::cpu::LLAISYS_ISA
