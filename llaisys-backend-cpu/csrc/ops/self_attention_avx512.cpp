// self_attention, AVX-512 (F/BW/VL/DQ) path: 16-lane tiles for many queries per kv head, 8-lane
// (ymm, 32 registers with VL) tiles for few (decode: 6 query heads per kv head in Qwen2).
// GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "self_attention.h"
#include "self_attention_simd256.h"
#include "paged_attention.h"

namespace {

struct V512 {
    using vec = __m512;
    static constexpr int W = 16;
    static vec zero() { return _mm512_setzero_ps(); }
    static vec set1(float x) { return _mm512_set1_ps(x); }
    static vec load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, vec x) { _mm512_storeu_ps(p, x); }
    static vec bcast(const float* p) { return _mm512_set1_ps(*p); }
    static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
    static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
    static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
    static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
    static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
    static vec min(vec a, vec b) { return _mm512_min_ps(a, b); }
    static vec round(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static vec pow2(vec n) {
        const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
        return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
    }
    static vec select_lt(vec x, vec y, vec a, vec b) {
        return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, y, _CMP_LT_OQ), b, a);
    }
};

// Row converters with 16 lanes and masked tails.
struct Cvt512 {
    template <class T>
    static void load_row(const T* src, float* dst, int64_t n) {
        if constexpr (sizeof(T) == 4) {
            std::memcpy(dst, src, sizeof(float) * n);
        } else {
            int64_t i = 0;
            for (; i + 16 <= n; i += 16)
                _mm512_storeu_ps(dst + i, expand(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)), src));
            if (i < n) {
                const __mmask16 m = __mmask16((1u << (n - i)) - 1);
                _mm512_mask_storeu_ps(dst + i, m, expand(_mm256_maskz_loadu_epi16(m, src + i), src));
            }
        }
    }

    template <class T>
    static void store_row(const float* src, T* dst, int64_t n) {
        if constexpr (sizeof(T) == 4) {
            std::memcpy(dst, src, sizeof(float) * n);
        } else {
            int64_t i = 0;
            for (; i + 16 <= n; i += 16)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), narrow(_mm512_loadu_ps(src + i), dst));
            if (i < n) {
                const __mmask16 m = __mmask16((1u << (n - i)) - 1);
                _mm256_mask_storeu_epi16(dst + i, m, narrow(_mm512_maskz_loadu_ps(m, src + i), dst));
            }
        }
    }

    static __m512 expand(__m256i h, const llaisys::bf16_t*) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static __m512 expand(__m256i h, const llaisys::f16_t*) { return _mm512_cvtph_ps(h); }
    static __m256i narrow(__m512 x, const llaisys::bf16_t*) {
        const __m512i u = _mm512_castps_si512(x);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
        const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, qnan);
        return _mm512_cvtepi32_epi16(r);
    }
    static __m256i narrow(__m512 x, const llaisys::f16_t*) {
        return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
};

}  // namespace

namespace llaisys::cpu::attn {

namespace {
template <class T>
void go(const Problem& p) {
    const int64_t queries_per_group = p.L * (p.H / p.Hkv);
    // 1..4 queries per kv head: the row form (lanes along the head dim) idles no lanes;
    // from 5 on, the lane form (queries in lanes) wins (measured on Zen 4, both ISAs)
    if (queries_per_group <= 4 && p.d % 8 == 0 && p.dv % 8 == 0)
        attention_rows<V256, 4, Cvt512, T>(p);
    else if (queries_per_group <= 8)
        attention<V256, 1, 16, 24, Cvt512, T>(p);  // ymm: 8 lanes, as many FLOPs per cycle on Zen 4
    else if (queries_per_group <= 16)
        attention<V512, 1, 16, 24, Cvt512, T>(p);
    else
        attention<V512, 2, 8, 12, Cvt512, T>(p);   // 32 queries per tile: 16 / 24 accumulators
}
}  // namespace

// Paged attention (paged_attention.h): 8-lane vectors (as many FLOPs per cycle on Zen 4 as 16-lane ones,
// and one vector type for every tile width keeps results batch-invariant), 1, 2 or 4 per tile, 32 registers.
struct PagedShapes512 {
    static constexpr int kMaxMB = 4;
    static constexpr int kr[3] = {16, 12, 6}, r[3] = {24, 12, 6};
};

void run_paged_avx512(int dtype, const PagedProblem& p) {
    switch (dtype) {
        case 0: paged_attention<V256, PagedShapes512, Cvt512, float>(p); break;
        case 1: paged_attention<V256, PagedShapes512, Cvt512, llaisys::f16_t>(p); break;
        default: paged_attention<V256, PagedShapes512, Cvt512, llaisys::bf16_t>(p); break;
    }
}

void run_avx512(int dtype, const Problem& p) {
    switch (dtype) {
        case 0: go<float>(p); break;
        case 1: go<llaisys::f16_t>(p); break;
        default: go<llaisys::bf16_t>(p); break;
    }
}

}  // namespace llaisys::cpu::attn
