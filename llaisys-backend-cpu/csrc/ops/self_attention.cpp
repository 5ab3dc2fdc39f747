// self_attention: the exported entry point, the portable path and the per-thread scratch.
// The algorithm is in self_attention.h; the AVX2 / AVX-512 paths in self_attention_avx2/_avx512.cpp.
#include "self_attention.h"

#include "paged_attention.h"

#include <cmath>
#include <cstdlib>
#include <new>
#include <string>

#include "../common/api.h"
#include "../common/cpu_features.h"
#include "../common/dtype.h"

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

namespace {

// A portable "vector" of 8 floats; plain loops that the compiler may vectorize for the baseline ISA.
struct PV {
    struct vec { float x[8]; };
    static constexpr int W = 8;
    template <class F>
    static vec map(F f) { vec r; for (int i = 0; i < W; ++i) r.x[i] = f(i); return r; }
    static vec zero() { return set1(0.0f); }
    static vec set1(float a) { return map([&](int) { return a; }); }
    static vec load(const float* p) { return map([&](int i) { return p[i]; }); }
    static void store(float* p, const vec& a) { for (int i = 0; i < W; ++i) p[i] = a.x[i]; }
    static vec bcast(const float* p) { return set1(*p); }
    static vec fma(const vec& a, const vec& b, const vec& c) { return map([&](int i) { return a.x[i] * b.x[i] + c.x[i]; }); }
    static vec add(const vec& a, const vec& b) { return map([&](int i) { return a.x[i] + b.x[i]; }); }
    static vec sub(const vec& a, const vec& b) { return map([&](int i) { return a.x[i] - b.x[i]; }); }
    static vec mul(const vec& a, const vec& b) { return map([&](int i) { return a.x[i] * b.x[i]; }); }
    // x86 semantics: the second operand when either is NaN
    static vec max(const vec& a, const vec& b) { return map([&](int i) { return a.x[i] > b.x[i] ? a.x[i] : b.x[i]; }); }
    static vec min(const vec& a, const vec& b) { return map([&](int i) { return a.x[i] < b.x[i] ? a.x[i] : b.x[i]; }); }
    static vec round(const vec& a) { return map([&](int i) { return std::nearbyint(a.x[i]); }); }
    static vec pow2(const vec& n) {
        return map([&](int i) {
            const uint32_t bits = uint32_t(int32_t(n.x[i]) + 127) << 23;
            return bits_to_f32(bits);
        });
    }
    static vec select_lt(const vec& x, const vec& y, const vec& a, const vec& b) {
        return map([&](int i) { return x.x[i] < y.x[i] ? a.x[i] : b.x[i]; });
    }
};

struct CvtPortable {
    template <class T>
    static void load_row(const T* src, float* dst, int64_t n) { for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(src[i]); }
    template <class T>
    static void store_row(const float* src, T* dst, int64_t n) { for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<T>(src[i]); }
};

}  // namespace

void run_portable(int dtype, const Problem& p) {
    switch (dtype) {
        case 0: attention<PV, 1, 4, 4, CvtPortable, float>(p); break;
        case 1: attention<PV, 1, 4, 4, CvtPortable, f16_t>(p); break;
        default: attention<PV, 1, 4, 4, CvtPortable, bf16_t>(p); break;
    }
}

// Paged attention (paged_attention.h): one vector of 8 queries per tile.
struct PagedShapesPortable {
    static constexpr int kMaxMB = 1;
    static constexpr int kr[3] = {4, 4, 4}, r[3] = {4, 4, 4};
};

void run_paged_portable(int dtype, const PagedProblem& p) {
    switch (dtype) {
        case 0: paged_attention<PV, PagedShapesPortable, CvtPortable, float>(p); break;
        case 1: paged_attention<PV, PagedShapesPortable, CvtPortable, f16_t>(p); break;
        default: paged_attention<PV, PagedShapesPortable, CvtPortable, bf16_t>(p); break;
    }
}

}  // namespace llaisys::cpu::attn

using namespace llaisys;

int LLAISYS_FN(self_attention)(int device, void* stream, int dtype, int numerics, int64_t L, int64_t S, int64_t H,
                               int64_t Hkv, int64_t d, int64_t dv, double scale, void* out,
                                              const void* q, const void* k, const void* v) {
    (void)device; (void)stream;
    return guard("self_attention", [&] {
        require_exact_numerics(numerics);
        auto need = [](bool ok, const std::string& what) { if (!ok) throw InvalidArgument(what); };
        if (dtype != kF32 && dtype != kF16 && dtype != kBF16) unsupported_dtype(dtype);
        need(L >= 0 && S >= 0 && H >= 0 && d >= 0 && dv >= 0,
             "negative size (L=" + std::to_string(L) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
                 " d=" + std::to_string(d) + " dv=" + std::to_string(dv) + ")");
        need(Hkv > 0 && H % Hkv == 0,
             "the " + std::to_string(H) + " query heads (H) must be a multiple of the " + std::to_string(Hkv) +
                 " kv heads (Hkv)");
        need(S >= L, "S=" + std::to_string(S) + " keys, fewer than the L=" + std::to_string(L) + " queries");
        need(S <= (int64_t(1) << 24), "S=" + std::to_string(S) + " keys exceeds the supported 16777216");
        need(std::isfinite(scale), "scale must be finite, got " + std::to_string(scale));
        if (L == 0 || H == 0 || dv == 0) return;
        need(out && q && k && v, "null data pointer (out, q, k or v)");
        const cpu::attn::Problem p{L, S, H, Hkv, d, dv, float(scale), out, q, k, v};
        switch (cpu::simd_level()) {
            case cpu::Simd::kAvx512: cpu::attn::run_avx512(dtype, p); break;
            case cpu::Simd::kAvx2: cpu::attn::run_avx2(dtype, p); break;
            default: cpu::attn::run_portable(dtype, p); break;
        }
    });
}
