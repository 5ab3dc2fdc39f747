// embedding_q: out[i, :] = row index[i] of a [vocab, dim] matrix stored in a block format (block_formats.h),
// decoded: each weight computed in f32 exactly as ggml's dequantize_row_* computes it (scale * q, + min where
// the format has one; every product is exact in f32), then rounded once to the output dtype. Only the rows
// asked for are read. Every index is checked against [0, vocab) before anything is written.
#include "../common/api.h"
#include "../common/index_check.h"
#include "block_formats.h"
#include "linear.h"

LLAISYS_DECLARE_PER_ISA(void embedding_q(int dtype, int fmt, int64_t n, int64_t dim, int64_t vocab, void* out,
                                         const int64_t* index, const uint8_t* weight, const uint8_t* scales))

namespace llaisys::cpu::LLAISYS_ISA {

template <class F, class T>
void embedding_rows(int64_t n, int64_t dim, T* out, const int64_t* index, const uint8_t* weight,
                    const uint8_t* scales) {
    const int64_t G = ceil_div(dim, kQGroup);
    constexpr int64_t kSubK = kQGroup / F::kSubs;
    run_ranges(n, [&](int64_t i_begin, int64_t i_end) {
        for (int64_t i = i_begin; i < i_end; ++i) {
            const int64_t row = index[i], blk = row / kQBlockRows;
            const BlockPtrs b{weight + blk * G * F::kWeightBytes, scales + blk * G * F::kScaleBytes};
            const int r = int(row % kQBlockRows);
            for (int64_t g = 0; g < G; ++g) {
                const float min = F::min(b, r, g);
                for (int t = 0; t < F::kSubs; ++t) {
                    const float scale = F::scale(b, r, g, t);
                    const int64_t end = std::min(dim, g * kQGroup + (t + 1) * kSubK);
                    for (int64_t k = g * kQGroup + t * kSubK; k < end; ++k) {
                        float v = scale * float(F::q(b, r, k));
                        if constexpr (F::kMin) v = v + min;
                        out[i * dim + k] = from_f32<T>(v);
                    }
                }
            }
        }
    }, n > 1 && n * dim >= kParallelGrain);
}

void embedding_q(int dtype, int fmt, int64_t n, int64_t dim, int64_t, void* out, const int64_t* index,
                 const uint8_t* weight, const uint8_t* scales) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        with_qformat(fmt, [&](auto format) {
            embedding_rows<decltype(format), T>(n, dim, static_cast<T*>(out), index, weight, scales);
        });
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(embedding_q)(int device, void* stream, int dtype, int fmt, int64_t n_index, int64_t dim,
                            int64_t vocab, void* out, const void* index_ptr, const void* weight, const void* scales) {
    (void)device;
    const auto* index = static_cast<const int64_t*>(index_ptr);
    return llaisys::launch("embedding_q", stream, [=] {
        llaisys::require_float_dtype(dtype);
        llaisys::cpu::require_qformat(fmt);
        llaisys::check_row_indices(index, n_index, vocab);
        LLAISYS_PER_ISA(embedding_q)(dtype, fmt, n_index, dim, vocab, out, index,
                                     static_cast<const uint8_t*>(weight), static_cast<const uint8_t*>(scales));
    });
}
#endif
