// The vector passes of sample (sample.cpp holds the algorithm), instantiated once per ISA
// (sample.cpp, sample_avx2.cpp, sample_avx512.cpp). All work on f32 arrays.
#pragma once

#include "vec.h"

// Elements per block of sample_exp's partial sums (fixed, so the sums do not depend on the thread count).
constexpr int64_t kSampleBlock = 2048;

// dst[i] = float(src[i]) for an f32 / f16 / bf16 src.
LLAISYS_DECLARE_PER_ISA(void sample_widen(int dtype, int64_t n, const void* src, float* dst))
// p[i] = exp((v[i] - max) / temperature) in f32; block_sums[b] = sum of p over block b (ceil(n / kSampleBlock)).
LLAISYS_DECLARE_PER_ISA(void sample_exp(int64_t n, const float* v, float max, float temperature, float* p,
                                        double* block_sums))
// Writes base + i for every i in [0, n) with v[i] > threshold (>= if inclusive), in order; returns the count.
LLAISYS_DECLARE_PER_ISA(int64_t sample_select(int64_t n, const float* v, float threshold, bool inclusive,
                                              int64_t base, int64_t* out))
// Sum of the p[i] >= threshold.
LLAISYS_DECLARE_PER_ISA(double sample_sum_at_least(int64_t n, const float* p, float threshold))

namespace llaisys::cpu::LLAISYS_ISA {

inline void sample_widen_kernel(int dtype, int64_t n, const void* src, float* dst) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* s = static_cast<const T*>(src);
        int64_t i = 0;
        for (; i + Vec::W <= n; i += Vec::W) Vec::load(s + i).store(dst + i);
        if (i < n) Vec::load_partial(s + i, int(n - i)).store_partial(dst + i, int(n - i));
    });
}

inline void sample_exp_kernel(int64_t n, const float* v, float max, float temperature, float* p, double* block_sums) {
    const int64_t blocks = (n + kSampleBlock - 1) / kSampleBlock;
    const Vec m = Vec::set1(max), t = Vec::set1(temperature);
#pragma omp parallel for schedule(static) if (n >= 4 * kParallelGrain)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t begin = b * kSampleBlock, end = begin + kSampleBlock < n ? begin + kSampleBlock : n;
        Vec acc = Vec::zero();
        int64_t i = begin;
        for (; i + Vec::W <= end; i += Vec::W) {
            Vec e = vexp((Vec::load(v + i) - m) / t);
            e.store(p + i);
            acc = acc + e;
        }
        if (i < end) {
            const int rest = int(end - i);
            Vec e = select(lanes_below(rest), vexp((Vec::load_partial(v + i, rest) - m) / t), Vec::zero());
            e.store_partial(p + i, rest);
            acc = acc + e;
        }
        block_sums[b] = double(reduce_add(acc));
    }
}

inline int64_t sample_select_kernel(int64_t n, const float* v, float threshold, bool inclusive, int64_t base,
                                    int64_t* out) {
    const Vec t = Vec::set1(threshold);
    int64_t count = 0, i = 0;
    for (; i + Vec::W <= n; i += Vec::W) {
        const Vec a = Vec::load(v + i);
        for (Mask m = inclusive ? ge_mask(a, t) : gt_mask(a, t); m; m &= m - 1) out[count++] = base + i + __builtin_ctz(m);
    }
    for (; i < n; ++i)
        if (inclusive ? v[i] >= threshold : v[i] > threshold) out[count++] = base + i;
    return count;
}

inline double sample_sum_at_least_kernel(int64_t n, const float* p, float threshold) {
    const Vec t = Vec::set1(threshold);
    double total = 0.0;
    for (int64_t begin = 0; begin < n; begin += kSampleBlock) {
        const int64_t end = begin + kSampleBlock < n ? begin + kSampleBlock : n;
        Vec acc = Vec::zero();
        int64_t i = begin;
        for (; i + Vec::W <= end; i += Vec::W) {
            const Vec a = Vec::load(p + i);
            acc = acc + select(ge_mask(a, t), a, Vec::zero());
        }
        float tail = 0.0f;
        for (; i < end; ++i) tail += p[i] >= threshold ? p[i] : 0.0f;
        total += double(reduce_add(acc)) + double(tail);
    }
    return total;
}

}  // namespace llaisys::cpu::LLAISYS_ISA
