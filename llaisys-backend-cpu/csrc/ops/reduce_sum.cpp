// reduce_sum (reduce_sum.h): the element-wise sum of several buffers in a fixed order, in f32.
#include "reduce_sum.h"

#include "../common/api.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void reduce_sum(int dtype, int64_t n, void* out, const void* const* src, int count))

namespace llaisys::cpu::LLAISYS_ISA {

namespace {

template <class T>
void reduce_typed(int64_t n, T* out, const void* const* src, int count) {
    constexpr int64_t kBlock = 4096;  // a multiple of every W
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    run_ranges(blocks, [&](int64_t blk_begin, int64_t blk_end) {
        for (int64_t blk = blk_begin; blk < blk_end; ++blk) {
            const int64_t begin = blk * kBlock, end = n < begin + kBlock ? n : begin + kBlock;
            int64_t i = begin;
            // one lane per element: acc = src0 + src1 + ..., the same additions in the partial tail
            for (; i + Vec::W <= end; i += Vec::W) {
                Vec acc = Vec::load(static_cast<const T*>(src[0]) + i);
                for (int r = 1; r < count; ++r) acc = acc + Vec::load(static_cast<const T*>(src[r]) + i);
                acc.store(out + i);
            }
            if (i < end) {
                const int rest = int(end - i);
                Vec acc = Vec::load_partial(static_cast<const T*>(src[0]) + i, rest);
                for (int r = 1; r < count; ++r) acc = acc + Vec::load_partial(static_cast<const T*>(src[r]) + i, rest);
                acc.store_partial(out + i, rest);
            }
        }
    }, n >= kParallelGrain);
}

}  // namespace

void reduce_sum(int dtype, int64_t n, void* out, const void* const* src, int count) {
    with_float_type(dtype, [&](auto tag) { reduce_typed(n, static_cast<decltype(tag)*>(out), src, count); });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the entry point, compiled once
void llaisys::cpu::reduce_sum(int dtype, int64_t n, void* out, const void* const* src, int count) {
    llaisys::require_float_dtype(dtype);
    LLAISYS_PER_ISA(reduce_sum)(dtype, n, out, src, count);
}
#endif
