// self_attention: causal GQA attention (the algorithm is in self_attention.h). This file picks each build's
// tile shapes for its registers and holds the per-thread scratch and the exported entry point.
#include "self_attention.h"

#include <cstdlib>
#include <new>
#include <string>
#include <type_traits>

#include "../common/api.h"

namespace llaisys::cpu::LLAISYS_ISA {

template <class T, bool kHf>
static void attend(const Problem& p) {
    const int64_t queries_per_group = p.L * (p.H / p.Hkv);
#if defined(LLAISYS_ISA_PORTABLE)
    (void)queries_per_group;
    attention<Vec8, 1, 4, 4, T, kHf>(p);
#else
    // 1..4 queries per kv head: the row form (lanes along the head dim) idles no lanes;
    // from 5 on, the lane form (queries in lanes) wins (measured on Zen 4, both ISAs)
    if (queries_per_group <= 4 && p.d % 8 == 0 && p.dv % 8 == 0)
        attention_rows<Vec8, 4, T, kHf>(p);
#if defined(LLAISYS_ISA_AVX512)
    else if (queries_per_group <= 8)
        attention<Vec8, 1, 16, 24, T, kHf>(p);   // ymm: 8 lanes, as many FLOPs per cycle on Zen 4; 32 registers
    else if (queries_per_group <= 16)
        attention<Vec16, 1, 16, 24, T, kHf>(p);
    else
        attention<Vec16, 2, 8, 12, T, kHf>(p);   // 32 queries per tile: 16 / 24 accumulators
#else
    else if (queries_per_group <= 8)
        attention<Vec8, 1, 12, 12, T, kHf>(p);   // 12 + 2 of 16 registers
    else
        attention<Vec8, 2, 6, 6, T, kHf>(p);     // 12 + 3 registers
#endif
#endif
}

void self_attention(int dtype, bool hf, const Problem& p) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>)
            attend<T, false>(p);  // in f32 the HF rounding of P is a no-op, and its blocks only move f32 ulps
        else if (hf)
            attend<T, true>(p);
        else
            attend<T, false>(p);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the scratch and the exported entry point, compiled once
namespace llaisys::cpu::attn {

float* scratch(int slot, int64_t floats) {
    struct Buffer { float* ptr; int64_t size; };
    thread_local Buffer buffers[2] = {{nullptr, 0}, {nullptr, 0}};
    Buffer& b = buffers[slot];
    if (b.size < floats) {
        std::free(b.ptr);
        b.ptr = nullptr;
        b.size = 0;
        const size_t bytes = (size_t(floats) * sizeof(float) + 63) / 64 * 64;
        b.ptr = static_cast<float*>(std::aligned_alloc(64, bytes));
        if (!b.ptr) throw std::bad_alloc();
        b.size = floats;
    }
    return b.ptr;
}

}  // namespace llaisys::cpu::attn

int LLAISYS_FN(self_attention)(int device, void* stream, int dtype, int numerics, int64_t L, int64_t S, int64_t H,
                               int64_t Hkv, int64_t d, int64_t dv, double scale, void* out, const void* q,
                               const void* k, const void* v) {
    (void)device;
    return llaisys::launch("self_attention", stream, [=] {
        const bool hf = llaisys::hf_numerics(numerics);
        llaisys::require_float_dtype(dtype);
        // key positions are compared as f32 in the lanes: exact up to 2^24
        if (S > (int64_t(1) << 24))
            throw llaisys::NotSupported("S=" + std::to_string(S) + " keys exceeds the supported 16777216");
        if (L == 0 || H == 0 || dv == 0) return;  // nothing to compute
        LLAISYS_PER_ISA(self_attention)(dtype, hf, llaisys::cpu::attn::Problem{L, S, H, Hkv, d, dv, float(scale), out, q, k, v});
    });
}
#endif
