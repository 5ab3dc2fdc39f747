// The SIMD vocabulary of the CPU kernels: one header, included by every op source in csrc/ops/.
//
// Build: setup.py compiles each op source once per instruction set of the target architecture, with
// -DLLAISYS_ISA=<set> and that set's flags: on x86-64 portable (baseline x86-64), avx2 (AVX2 + FMA + F16C) or
// avx512 (F + BW + VL + DQ); on AArch64 portable (armv8-a, the same lane loops as on x86-64, no fused
// products), neon (armv8-a Advanced SIMD, vec128_neon.h) or dotprod (armv8.2-a + the sdot byte dot products,
// the same header). Everything the source defines goes in namespace llaisys::cpu::LLAISYS_ISA (open it as
// `namespace llaisys::cpu::LLAISYS_ISA`), so the builds never share a symbol and the linker can never hand an
// AVX-512 (or sdot) copy of a helper to the portable path (setup.py checks every object but the portable ones
// for code outside its namespace). Code that must exist once (the exported entry point, state shared by the
// ISAs) goes under `#if LLAISYS_ISA_PORTABLE` and calls the build for the run-time SIMD level through
// LLAISYS_PER_ISA.
//
// Vector types, f32 lanes:
//   Vec8     8 lanes in every build: a ymm register (avx2, avx512: with masked tails and 32 registers), a
//            pair of 128-bit NEON registers (neon, dotprod), or on the portable path an array of 8 floats
//            whose lane loops the compiler turns into SSE2 (or NEON) code
//   Vec16    16 lanes, a zmm register (avx512 only)
//   Vec      the widest of this build: Vec16 with AVX-512, else Vec8
//   Vec8i, Vec16i: 32-bit integer lanes of the same widths (V::Int; bit work: bf16 rounding, exponents, bf16
//            pairs; int8 dot products; codes unpacked from words): load(p) (W * 4 bytes), + & | ^ << >>,
//            int_to_f32 (values, not bits) in every build (the portable Vec8i is an array: kernels written once
//            over V::Int); in the avx2 / avx512 / neon / dotprod builds also sra(a, n) (arithmetic shift right),
//            dot4_i8(acc, a, b) (+= the products of the 4 signed bytes of each lane; sdot in the dotprod build),
//            dot4_u8i8 (the same with unsigned a: vpdpbusd, on CPUs with AVX512-VNNI only: Vec16i;
//            dot4_u8i8_bcast: b the 4 bytes at a pointer, in every lane), dot4_u7i8 (a in [0, 127]: vpmaddubsw
//            without VNNI)
// Each vector type V has (see vec_portable.h, vec256.h, vec512.h, vec128_neon.h):
//   V::W; V::zero(), V::set1(f), V::broadcast(const float* p) (every lane = *p);
//   V::load(p), V::load_partial(p, n), v.store(p), v.store_partial(p, n), v.round_to<T>(): p points to
//   float, bf16_t or f16_t (V::load also takes W bytes, uint8_t or int8_t, as integers: vec256.h, vec512.h, vec128_neon.h; v.store(int8_t*) writes lanes holding integers in [-128, 127] as bytes); f16 / bf16 widen exactly to f32 and narrow with round to nearest even (NaN
//   stays a quiet NaN); a partial access touches lanes [0, n) only (0 <= n <= W) and reads the rest as 0;
//   + - * /, fmadd(a, b, c) = a*b + c, fnmadd(a, b, c) = c - a*b, mul_unfused(a, b) (never fused into an
//   FMA), vmin / vmax (the second operand if either is NaN), vsqrt, round_nearest, mul_pow2(a, n) = a * 2^n,
//   reduce_add, reduce_max, lane0;
//   masks: V::Mask (one per lane) from isnan_mask / eq_mask / lt_mask / gt_mask / ge_mask / V::first(n),
//   combined with | and &, consumed by select(m, if_true, if_false) and bits(m) (bit i = lane i);
//   reduce_add_each(const Vec8 (&a)[8]) (lane j = sum of a[j]).
// Below: scalar conversions (to_f32, from_f32<T>), hold_in_register, vexp, convert, with_float_type, map2, map1.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../common/thread_pool.h"
#include "../common/cpu_features.h"
#include "../common/dtype.h"
#include "llaisys/backend.h"

// ---- which instruction set this compile is for --------------------------------------------------------

#define LLAISYS_ISA_LEVEL_portable 1
#define LLAISYS_ISA_LEVEL_avx2 2
#define LLAISYS_ISA_LEVEL_avx512 3
#define LLAISYS_ISA_LEVEL_neon 4
#define LLAISYS_ISA_LEVEL_dotprod 5
#define LLAISYS_ISA_LEVEL_OF_(isa) LLAISYS_ISA_LEVEL_##isa
#define LLAISYS_ISA_LEVEL_OF(isa) LLAISYS_ISA_LEVEL_OF_(isa)

#if !defined(LLAISYS_ISA)
#error "compile op sources with -DLLAISYS_ISA=portable|avx2|avx512 (x86-64) or portable|neon|dotprod (aarch64) (setup.py does)"
#elif LLAISYS_ISA_LEVEL_OF(LLAISYS_ISA) == 5
#define LLAISYS_ISA_NEON 1
#define LLAISYS_ISA_DOTPROD 1
#if !(defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD))
#error "LLAISYS_ISA=dotprod needs an aarch64 compiler and -march=armv8.2-a+dotprod"
#endif
#elif LLAISYS_ISA_LEVEL_OF(LLAISYS_ISA) == 4
#define LLAISYS_ISA_NEON 1
#if !(defined(__aarch64__) && defined(__ARM_NEON))
#error "LLAISYS_ISA=neon needs an aarch64 compiler"
#endif
#elif LLAISYS_ISA_LEVEL_OF(LLAISYS_ISA) == 3
#define LLAISYS_ISA_AVX512 1
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
      defined(__FMA__) && defined(__F16C__))
#error "LLAISYS_ISA=avx512 needs -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c"
#endif
#elif LLAISYS_ISA_LEVEL_OF(LLAISYS_ISA) == 2
#define LLAISYS_ISA_AVX2 1
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "LLAISYS_ISA=avx2 needs -mavx2 -mfma -mf16c"
#endif
#elif LLAISYS_ISA_LEVEL_OF(LLAISYS_ISA) == 1
#define LLAISYS_ISA_PORTABLE 1
#else
#error "LLAISYS_ISA must be portable, avx2, avx512, neon or dotprod"
#endif

#define LLAISYS_ALWAYS_INLINE inline __attribute__((always_inline))
// Functions that multiply bf16 pairs (dot_bf16_pairs: AVX512-BF16's vdpbf16ps, AArch64 FEAT_BF16's bfdot), only
// called after has_feature(Feature::kBf16Pairs).
#if defined(__aarch64__)
#define LLAISYS_TARGET_BF16_PAIRS __attribute__((target("+bf16")))
#else
#define LLAISYS_TARGET_BF16_PAIRS __attribute__((target("avx512bf16")))
#endif

#if defined(LLAISYS_ISA_AVX2) || defined(LLAISYS_ISA_AVX512)
// GCC 12 warns "__Y is (may be) used uninitialized" inside the AVX-512 intrinsics' own _mm512_undefined_*()
// once they are inlined (a false positive, GCC bug 105593); silenced for the intrinsics header only.
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

#include "scalar.h"
#if defined(LLAISYS_ISA_PORTABLE)
#include "vec_portable.h"
#elif defined(LLAISYS_ISA_NEON)
#include "vec128_neon.h"
#else
#include "vec256.h"
#endif
#if defined(LLAISYS_ISA_AVX512)
#include "vec512.h"
#endif

// ---- calling the build of the run-time SIMD level (from code under #if LLAISYS_ISA_PORTABLE) ----------

// Declares `DECL` (a function declaration) in the namespace of each build of this architecture.
#define LLAISYS_DECLARE_PER_ISA(DECL)          \
    namespace llaisys::cpu {                   \
    namespace portable { DECL; }               \
    LLAISYS_DECLARE_PER_ISA_REST_(DECL)        \
    }
#if defined(__aarch64__)
#define LLAISYS_DECLARE_PER_ISA_REST_(DECL) namespace neon { DECL; } namespace dotprod { DECL; }
#else
#define LLAISYS_DECLARE_PER_ISA_REST_(DECL) namespace avx2 { DECL; } namespace avx512 { DECL; }
#endif

namespace llaisys::cpu {
// The build of the run-time SIMD level (simd_level()), one of the three on x86-64 (portable, avx2,
// avx512) or on AArch64 (portable, neon, dotprod).
template <class F>
inline F* pick_isa(F* portable, F* second, F* third) {
    switch (simd_level()) {
#if defined(__aarch64__)
        case Simd::kDotprod: return third;
        case Simd::kNeon: return second;
#else
        case Simd::kAvx512: return third;
        case Simd::kAvx2: return second;
#endif
        default: return portable;
    }
}
}  // namespace llaisys::cpu

// The function `name` (declared with LLAISYS_DECLARE_PER_ISA) of the build this process runs:
//     LLAISYS_PER_ISA(add)(dtype, n, c, a, b);
#if defined(__aarch64__)
#define LLAISYS_PER_ISA(name) \
    (::llaisys::cpu::pick_isa(&::llaisys::cpu::portable::name, &::llaisys::cpu::neon::name, &::llaisys::cpu::dotprod::name))
#else
#define LLAISYS_PER_ISA(name) \
    (::llaisys::cpu::pick_isa(&::llaisys::cpu::portable::name, &::llaisys::cpu::avx2::name, &::llaisys::cpu::avx512::name))
#endif

namespace llaisys::cpu::LLAISYS_ISA {

#if defined(LLAISYS_ISA_AVX512)
using Vec = Vec16;
#else
using Vec = Vec8;
#endif

// Makes the compiler hold v in a register from here on: a vector loaded once and used by several
// instructions is not read from memory again by each of them (GCC may fold such a load into every FMA that
// uses it: the decode linear's 3-row tile read each weight line, still on its way from memory, three times
// and ran at 1.6x the time of 4 rows). Nothing is computed; a no-op on the portable path.
template <class V>
LLAISYS_ALWAYS_INLINE void hold_in_register(V& v) {
#if defined(LLAISYS_ISA_PORTABLE)
    (void)v;
#elif defined(LLAISYS_ISA_NEON)
    __asm__("" : "+w"(v.lo), "+w"(v.hi));
#else
    __asm__("" : "+v"(v.r));
#endif
}

// Integer masks (k-registers, the portable bit masks) as bits; AVX2's vector masks have their own bits().
template <class M, std::enable_if_t<std::is_integral_v<M>, int> = 0>
inline uint32_t bits(M m) { return uint32_t(m); }

// Run a loop on the thread team only when it has this many elements of work: below it, waking threads costs more.
constexpr int64_t kParallelGrain = 1 << 15;

// exp(x) in f32 lanes, within ~2 ulp: x = n ln2 + r with |r| <= ln2 / 2, Cephes' expf polynomial for
// exp(r), times 2^n by mul_pow2, so that the result overflows to +inf above ~88.72 and underflows gradually
// (subnormals) to 0 below ~-87.3. exp(-inf) = 0, NaN stays NaN.
template <class V>
LLAISYS_ALWAYS_INLINE V vexp(V x) {
    const V xc = vmin(V::set1(89.0f), vmax(V::set1(-110.0f), x));  // x second: NaN passes both
    const V n = round_nearest(xc * V::set1(1.44269504088896341f));
    V r = fnmadd(n, V::set1(0.693359375f), xc);  // ln2 in two parts: n * 0.693359375 is exact
    r = fnmadd(n, V::set1(-2.12194440e-4f), r);
    V p = V::set1(1.9875691500e-4f);
    p = fmadd(p, r, V::set1(1.3981999507e-3f));
    p = fmadd(p, r, V::set1(8.3334519073e-3f));
    p = fmadd(p, r, V::set1(4.1665795894e-2f));
    p = fmadd(p, r, V::set1(1.6666665459e-1f));
    p = fmadd(p, r, V::set1(5.0000001201e-1f));
    p = fmadd(p * r, r, r + V::set1(1.0f));
    return mul_pow2(p, n);  // n in [-159, 129]
}

// dst[0, n) = src[0, n), converted between f32 / bf16 / f16 (round to nearest even), Vec::W at a time.
template <class S, class D>
inline void convert(const S* src, D* dst, int64_t n) {
    if constexpr (std::is_same_v<S, D>) {
        std::memcpy(static_cast<void*>(dst), src, sizeof(S) * size_t(n));
    } else {
        int64_t i = 0;
        for (; i + Vec::W <= n; i += Vec::W) Vec::load(src + i).store(dst + i);
        if (i < n) Vec::load_partial(src + i, int(n - i)).store_partial(dst + i, int(n - i));
    }
}

// Calls f(T{}) with T the element type of a floating dtype code (LLAISYS_F32, _F16, _BF16). Other codes
// do nothing: the entry point turns them into NOT_SUPPORTED before dispatching (require_float_dtype).
template <class F>
inline void with_float_type(int dtype, F&& f) {
    switch (dtype) {
        case LLAISYS_F32: f(float{}); break;
        case LLAISYS_F16: f(f16_t{}); break;
        case LLAISYS_BF16: f(bf16_t{}); break;
        default: break;
    }
}

// out[i] = f(a[i], b[i]) over n elements, in blocks of kBlock shared among the team (common/thread_pool.h) when large.
template <class T, class F>
inline void map2(int64_t n, T* out, const T* a, const T* b, F f) {
    constexpr int64_t kBlock = 4096;  // a multiple of every W
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    run_ranges(blocks, [&](int64_t blk_begin, int64_t blk_end) {
        for (int64_t blk = blk_begin; blk < blk_end; ++blk) {
            int64_t i = blk * kBlock;
            const int64_t end = n < i + kBlock ? n : i + kBlock;
            for (; i + Vec::W <= end; i += Vec::W) f(Vec::load(a + i), Vec::load(b + i)).store(out + i);
            if (i < end) {
                const int rest = int(end - i);
                f(Vec::load_partial(a + i, rest), Vec::load_partial(b + i, rest)).store_partial(out + i, rest);
            }
        }
    }, n >= kParallelGrain);
}

// out[i] = f(a[i]): map2 with one input (its second load of a hits L1).
template <class T, class F>
inline void map1(int64_t n, T* out, const T* a, F f) {
    map2(n, out, a, a, [&f](Vec x, Vec) { return f(x); });
}

}  // namespace llaisys::cpu::LLAISYS_ISA
