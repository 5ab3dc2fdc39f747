// Portable SIMD helpers shared by the CPU kernels: a float vector `Vec` (16 lanes of __m512 in
// *_avx512.cpp, 8 lanes of __m256 in *_avx2.cpp, one float in portable files) that loads f32 / f16 /
// bf16 into f32 lanes and stores back with round-to-nearest-even, plus a vectorised exp.
//
// Everything here lives in namespace llaisys::cpu::LLAISYS_ISA (avx512, avx2 or portable, picked from
// the compiler flags of the including file), so code compiled for different instruction sets never
// shares a symbol: the linker cannot merge an AVX-512 copy of a helper into the portable path.
// For the same reason the SIMD namespaces do not call the inline functions of common/dtype.h.
//
// A kernel is written once as a template over Vec (see e.g. add.h) and instantiated by each ISA file:
//     for (i = 0; i + Vec::W <= n; i += Vec::W) Vec::load(a + i) ...
//     tail: Vec::load_partial(a + i, n - i) / v.store_partial(c + i, n - i)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/api.h"
#include "../common/cpu_features.h"
#include "../common/dtype.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define LLAISYS_ISA avx512
#define LLAISYS_ISA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LLAISYS_ISA avx2
#define LLAISYS_ISA_AVX2 1
#else
#define LLAISYS_ISA portable
#define LLAISYS_ISA_PORTABLE 1
#endif

#if !defined(LLAISYS_ISA_PORTABLE)
// GCC 12 warns "__Y is (may be) used uninitialized" inside the AVX-512 intrinsics' own
// _mm512_undefined_*() once they are inlined (a false positive, GCC bug 105593); silenced for the
// intrinsics header only (the warning is attributed to its lines).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// Declares `DECL` (a function declaration) in each ISA namespace, for the entry point that dispatches.
#define LLAISYS_DECLARE_PER_ISA(DECL)          \
    namespace llaisys::cpu {                   \
    namespace portable { DECL; }               \
    namespace avx2 { DECL; }                   \
    namespace avx512 { DECL; }                 \
    }

// Calls llaisys::cpu::<isa>::FN(args...) for the run-time SIMD level (see common/cpu_features.h).
#define LLAISYS_CALL_PER_ISA(FN, ...)                                                   \
    do {                                                                                \
        switch (::llaisys::cpu::simd_level()) {                                         \
            case ::llaisys::cpu::Simd::kAvx512: ::llaisys::cpu::avx512::FN(__VA_ARGS__); break; \
            case ::llaisys::cpu::Simd::kAvx2: ::llaisys::cpu::avx2::FN(__VA_ARGS__); break;     \
            default: ::llaisys::cpu::portable::FN(__VA_ARGS__); break;                  \
        }                                                                               \
    } while (0)

// VAR = llaisys::cpu::<isa>::FN(args...) for the run-time SIMD level.
#define LLAISYS_ASSIGN_PER_ISA(VAR, FN, ...)                                                   \
    do {                                                                                        \
        switch (::llaisys::cpu::simd_level()) {                                                 \
            case ::llaisys::cpu::Simd::kAvx512: VAR = ::llaisys::cpu::avx512::FN(__VA_ARGS__); break; \
            case ::llaisys::cpu::Simd::kAvx2: VAR = ::llaisys::cpu::avx2::FN(__VA_ARGS__); break;     \
            default: VAR = ::llaisys::cpu::portable::FN(__VA_ARGS__); break;                    \
        }                                                                                       \
    } while (0)

namespace llaisys::cpu::LLAISYS_ISA {

// Run an OpenMP loop only when it has this many elements of work: below it, waking threads costs more.
constexpr int64_t kParallelGrain = 1 << 15;

#if defined(LLAISYS_ISA_AVX512)

struct Vec {
    static constexpr int W = 16;
    __m512 r;

    Vec() = default;
    Vec(__m512 v) : r(v) {}
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec set1(float x) { return _mm512_set1_ps(x); }

    static Vec load(const float* p) { return _mm512_loadu_ps(p); }
    static Vec load(const bf16_t* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static Vec load(const f16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    // n < W lanes; the rest are 0. Masked loads never touch memory past p + n.
    static Vec load_partial(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
    static Vec load_partial(const bf16_t* p, int n) { return widen_bf16(_mm256_maskz_loadu_epi16(mask(n), p)); }
    static Vec load_partial(const f16_t* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p)); }

    void store(float* p) const { _mm512_storeu_ps(p, r); }
    void store(bf16_t* p) const { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_bf16(r)); }
    void store(f16_t* p) const { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow_f16(r)); }
    void store_partial(float* p, int n) const { _mm512_mask_storeu_ps(p, mask(n), r); }
    void store_partial(bf16_t* p, int n) const { _mm256_mask_storeu_epi16(p, mask(n), narrow_bf16(r)); }
    void store_partial(f16_t* p, int n) const { _mm256_mask_storeu_epi16(p, mask(n), narrow_f16(r)); }

    // The value after a round trip through T (round to nearest even), still in f32 lanes.
    template <class T> Vec round_to() const;

    static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
    static __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
    // f32 bits rounded to nearest even at bit 16 (NaN -> quiet NaN), in the low 16 bits of each lane.
    static __m512i bf16_bits(__m512 v) {
        __m512i u = _mm512_castps_si512(v);
        __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
        __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    }
    static __m256i narrow_bf16(__m512 v) { return _mm512_cvtepi32_epi16(bf16_bits(v)); }
    static __m256i narrow_f16(__m512 v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
};

template <> inline Vec Vec::round_to<float>() const { return r; }
template <> inline Vec Vec::round_to<bf16_t>() const { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(r), 16)); }
template <> inline Vec Vec::round_to<f16_t>() const { return _mm512_cvtph_ps(narrow_f16(r)); }

inline Vec operator+(Vec a, Vec b) { return _mm512_add_ps(a.r, b.r); }
inline Vec operator-(Vec a, Vec b) { return _mm512_sub_ps(a.r, b.r); }
inline Vec operator*(Vec a, Vec b) { return _mm512_mul_ps(a.r, b.r); }
inline Vec operator/(Vec a, Vec b) { return _mm512_div_ps(a.r, b.r); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a.r, b.r, c.r); }   // a * b + c
// a * b rounded to f32 even when an add follows: GCC contracts a * b + c into one FMA in C++ by default
// (-ffp-contract=fast), which torch's separate ops do not; use this where matching torch bit for bit matters.
inline Vec mul_unfused(Vec a, Vec b) {
    __m512 p = _mm512_mul_ps(a.r, b.r);
    __asm__("" : "+v"(p));
    return p;
}
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a.r, b.r, c.r); } // c - a * b
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a.r, b.r); }  // b if either is NaN
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a.r, b.r); }  // b if either is NaN
inline Vec vsqrt(Vec a) { return _mm512_sqrt_ps(a.r); }
inline float reduce_add(Vec a) { return _mm512_reduce_add_ps(a.r); }
inline float reduce_max(Vec a) { return _mm512_reduce_max_ps(a.r); }
inline Vec round_nearest(Vec a) { return _mm512_roundscale_ps(a.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// 2^n for integral n in [-126, 127] held in float lanes.
inline Vec pow2i(Vec n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.r), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
// Lane masks as a bit per lane.
using Mask = uint32_t;
inline Mask isnan_mask(Vec a) { return _mm512_cmp_ps_mask(a.r, a.r, _CMP_UNORD_Q); }
inline Mask eq_mask(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_EQ_OQ); }
inline Mask lt_mask(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_LT_OQ); }
inline Mask gt_mask(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_GT_OQ); }
inline Mask ge_mask(Vec a, Vec b) { return _mm512_cmp_ps_mask(a.r, b.r, _CMP_GE_OQ); }
inline Vec select(Mask m, Vec if_true, Vec if_false) { return _mm512_mask_blend_ps(__mmask16(m), if_false.r, if_true.r); }

#elif defined(LLAISYS_ISA_AVX2)

struct Vec {
    static constexpr int W = 8;
    __m256 r;

    Vec() = default;
    Vec(__m256 v) : r(v) {}
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec set1(float x) { return _mm256_set1_ps(x); }

    static Vec load(const float* p) { return _mm256_loadu_ps(p); }
    static Vec load(const bf16_t* p) { return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static Vec load(const f16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    // n < W lanes through a zeroed stack buffer, so nothing past p + n is read.
    template <class T> static Vec load_partial(const T* p, int n) {
        T buf[W];
        std::memset(buf, 0, sizeof(buf));
        std::memcpy(buf, p, sizeof(T) * n);
        return load(buf);
    }

    void store(float* p) const { _mm256_storeu_ps(p, r); }
    void store(bf16_t* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow_bf16(r)); }
    void store(f16_t* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow_f16(r)); }
    template <class T> void store_partial(T* p, int n) const {
        T buf[W];
        store(buf);
        std::memcpy(p, buf, sizeof(T) * n);
    }

    template <class T> Vec round_to() const;

    static __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
    static __m256i bf16_bits(__m256 v) {
        __m256i u = _mm256_castps_si256(v);
        __m256i hi = _mm256_srli_epi32(u, 16);
        __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
        __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    }
    static __m128i narrow_bf16(__m256 v) {
        __m256i b = bf16_bits(v);  // each lane <= 0xffff, so the unsigned saturating pack is exact
        return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    }
    static __m128i narrow_f16(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
};

template <> inline Vec Vec::round_to<float>() const { return r; }
template <> inline Vec Vec::round_to<bf16_t>() const { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(r), 16)); }
template <> inline Vec Vec::round_to<f16_t>() const { return _mm256_cvtph_ps(narrow_f16(r)); }

inline Vec operator+(Vec a, Vec b) { return _mm256_add_ps(a.r, b.r); }
inline Vec operator-(Vec a, Vec b) { return _mm256_sub_ps(a.r, b.r); }
inline Vec operator*(Vec a, Vec b) { return _mm256_mul_ps(a.r, b.r); }
inline Vec operator/(Vec a, Vec b) { return _mm256_div_ps(a.r, b.r); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a.r, b.r, c.r); }
inline Vec mul_unfused(Vec a, Vec b) {
    __m256 p = _mm256_mul_ps(a.r, b.r);
    __asm__("" : "+x"(p));
    return p;
}
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a.r, b.r, c.r); }
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a.r, b.r); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a.r, b.r); }
inline Vec vsqrt(Vec a) { return _mm256_sqrt_ps(a.r); }
inline float reduce_add(Vec a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.r), _mm256_extractf128_ps(a.r, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float reduce_max(Vec a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.r), _mm256_extractf128_ps(a.r, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline Vec round_nearest(Vec a) { return _mm256_round_ps(a.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec pow2i(Vec n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.r), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
using Mask = uint32_t;
inline Mask isnan_mask(Vec a) { return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.r, a.r, _CMP_UNORD_Q))); }
inline Mask eq_mask(Vec a, Vec b) { return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.r, b.r, _CMP_EQ_OQ))); }
inline Mask lt_mask(Vec a, Vec b) { return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.r, b.r, _CMP_LT_OQ))); }
inline Mask gt_mask(Vec a, Vec b) { return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.r, b.r, _CMP_GT_OQ))); }
inline Mask ge_mask(Vec a, Vec b) { return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(a.r, b.r, _CMP_GE_OQ))); }
inline Vec select(Mask m, Vec if_true, Vec if_false) {
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i sel = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(m)), bits), bits);
    return _mm256_blendv_ps(if_false.r, if_true.r, _mm256_castsi256_ps(sel));
}

#else  // portable: one float per "vector"; the compiler may still auto-vectorise the loops

struct Vec {
    static constexpr int W = 1;
    float r;

    Vec() = default;
    Vec(float v) : r(v) {}
    static Vec zero() { return 0.0f; }
    static Vec set1(float x) { return x; }
    template <class T> static Vec load(const T* p) { return to_f32(*p); }
    template <class T> static Vec load_partial(const T* p, int) { return to_f32(*p); }
    template <class T> void store(T* p) const { *p = from_f32<T>(r); }
    template <class T> void store_partial(T* p, int) const { *p = from_f32<T>(r); }
    template <class T> Vec round_to() const { return to_f32(from_f32<T>(r)); }
};

inline Vec operator+(Vec a, Vec b) { return a.r + b.r; }
inline Vec operator-(Vec a, Vec b) { return a.r - b.r; }
inline Vec operator*(Vec a, Vec b) { return a.r * b.r; }
inline Vec operator/(Vec a, Vec b) { return a.r / b.r; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return a.r * b.r + c.r; }
inline Vec mul_unfused(Vec a, Vec b) { return a.r * b.r; }  // baseline x86-64 has no FMA to fuse into
inline Vec fnmadd(Vec a, Vec b, Vec c) { return c.r - a.r * b.r; }
inline Vec vmin(Vec a, Vec b) { return a.r < b.r ? a.r : b.r; }
inline Vec vmax(Vec a, Vec b) { return a.r > b.r ? a.r : b.r; }
inline Vec vsqrt(Vec a) { return std::sqrt(a.r); }
inline float reduce_add(Vec a) { return a.r; }
inline float reduce_max(Vec a) { return a.r; }
using Mask = uint32_t;
inline Mask isnan_mask(Vec a) { return a.r != a.r; }
inline Mask eq_mask(Vec a, Vec b) { return a.r == b.r; }
inline Mask lt_mask(Vec a, Vec b) { return a.r < b.r; }
inline Mask gt_mask(Vec a, Vec b) { return a.r > b.r; }
inline Mask ge_mask(Vec a, Vec b) { return a.r >= b.r; }
inline Vec select(Mask m, Vec if_true, Vec if_false) { return m ? if_true : if_false; }

#endif

#if defined(LLAISYS_ISA_PORTABLE)
inline Vec vexp(Vec x) { return std::exp(x.r); }
#else
// exp(x) in f32 lanes, within ~2 ulp of the correctly rounded result (Cephes expf polynomial after
// reducing x = n ln2 + r, |r| <= ln2 / 2). exp(x) = 0 below -104, +inf above 88.72, NaN stays NaN.
inline Vec vexp(Vec x) {
    const Vec hi = Vec::set1(88.72283905206835f), lo = Vec::set1(-86.5f);
    Vec xc = vmin(hi, vmax(lo, x));  // x second: NaN passes through both
    Vec n = round_nearest(xc * Vec::set1(1.44269504088896341f));
    Vec r = fnmadd(n, Vec::set1(0.693359375f), xc);
    r = fnmadd(n, Vec::set1(-2.12194440e-4f), r);
    Vec p = Vec::set1(1.9875691500e-4f);
    p = fmadd(p, r, Vec::set1(1.3981999507e-3f));
    p = fmadd(p, r, Vec::set1(8.3334519073e-3f));
    p = fmadd(p, r, Vec::set1(4.1665795894e-2f));
    p = fmadd(p, r, Vec::set1(1.6666665459e-1f));
    p = fmadd(p, r, Vec::set1(5.0000001201e-1f));
    p = fmadd(p * r, r, r + Vec::set1(1.0f));
    // 2^n as 2^(n-1) * 2, so that n = 128 (x just below 88.72) does not overflow the exponent field
    Vec y = p * pow2i(n - Vec::set1(1.0f)) * Vec::set1(2.0f);
    // below -86.5 the clamp would give exp(-86.5); redo those lanes with a split power-of-two scale
    Mask small = lt_mask(x, lo);
    if (small) {
        Vec xs = vmax(Vec::set1(-104.0f), x);
        Vec n2 = round_nearest(xs * Vec::set1(1.44269504088896341f));
        Vec r2 = fnmadd(n2, Vec::set1(0.693359375f), xs);
        r2 = fnmadd(n2, Vec::set1(-2.12194440e-4f), r2);
        Vec q = Vec::set1(1.9875691500e-4f);
        q = fmadd(q, r2, Vec::set1(1.3981999507e-3f));
        q = fmadd(q, r2, Vec::set1(8.3334519073e-3f));
        q = fmadd(q, r2, Vec::set1(4.1665795894e-2f));
        q = fmadd(q, r2, Vec::set1(1.6666665459e-1f));
        q = fmadd(q, r2, Vec::set1(5.0000001201e-1f));
        q = fmadd(q * r2, r2, r2 + Vec::set1(1.0f));
        // n2 in [-150, -125]: scale by 2^(n2 + 60) then by 2^-60 (gradual underflow to 0)
        Vec ys = q * pow2i(n2 + Vec::set1(60.0f)) * Vec::set1(8.67361737988403547e-19f);
        ys = select(lt_mask(x, Vec::set1(-104.0f)), Vec::zero(), ys);
        y = select(small, ys, y);
    }
    y = select(gt_mask(x, Vec::set1(88.72283905206835f)), Vec::set1(INFINITY), y);
    return y;
}
#endif

// The mask with lanes [0, rest) set.
inline Mask lanes_below(int rest) { return rest >= 32 ? ~Mask(0) : (Mask(1) << rest) - 1; }

// Calls f(T{}) with T the element type of a floating dtype code (kF32, kF16, kBF16). The entry point
// (portable file) rejects other codes before dispatching, so no error path is compiled per ISA.
template <class F>
inline void with_float_type(int dtype, F&& f) {
    switch (dtype) {
        case kF32: f(float{}); break;
        case kF16: f(f16_t{}); break;
        case kBF16: f(bf16_t{}); break;
        default: break;
    }
}

// out[i] = f(a[i], b[i]) over n elements, in blocks of kBlock shared among OpenMP threads when large.
template <class T, class F>
inline void map2(int64_t n, T* out, const T* a, const T* b, F f) {
    constexpr int64_t kBlock = 4096;  // a multiple of every W
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t i = blk * kBlock;
        const int64_t end = n < i + kBlock ? n : i + kBlock;
        for (; i + Vec::W <= end; i += Vec::W) f(Vec::load(a + i), Vec::load(b + i)).store(out + i);
        if (i < end) {
            const int rest = int(end - i);
            f(Vec::load_partial(a + i, rest), Vec::load_partial(b + i, rest)).store_partial(out + i, rest);
        }
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA

namespace llaisys::cpu {
// Throws NotSupported unless dtype is f32, f16 or bf16 (call it in the portable entry point).
inline void require_float_dtype(int dtype) {
    if (dtype != kF32 && dtype != kF16 && dtype != kBF16) unsupported_dtype(dtype);
}
}  // namespace llaisys::cpu
