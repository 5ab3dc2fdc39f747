// linear: out[M,N] = x[M,K] @ weight[N,K]^T + bias[N] (f32 / f16 / bf16, f32 accumulation).
// The exported entry point (dispatch on simd_level()) and the portable path: baseline x86-64, where the
// "vector" is an array of 8 floats whose element-wise loops the compiler turns into SSE code.
#include <cstdlib>
#include <cstring>
#include <string>

#include "../common/cpu_features.h"
#include "linear.h"
#include "linear_impl.h"

namespace llaisys::cpu::linear {

namespace {

struct Portable {
    struct vec { float v[8]; };
    static constexpr int W = 8;

    static inline vec zero() { vec r; for (int i = 0; i < W; ++i) r.v[i] = 0.0f; return r; }
    static inline vec set1(float f) { vec r; for (int i = 0; i < W; ++i) r.v[i] = f; return r; }
    static inline vec load(const float* p) { vec r; for (int i = 0; i < W; ++i) r.v[i] = p[i]; return r; }
    static inline vec load(const bf16_t* p) {
        vec r;
        for (int i = 0; i < W; ++i) r.v[i] = bf16_bits_to_f32(p[i].bits);
        return r;
    }
    // Branch-free f16 -> f32 (vectorisable): place exponent and mantissa in f32 position and rescale by
    // 2^112 (exact for normals and subnormals); inf / NaN keep an all-ones exponent.
    static inline float f16_bits_to_f32(uint16_t h) {
        const uint32_t em = uint32_t(h & 0x7fffu) << 13, sign = uint32_t(h & 0x8000u) << 16;
        const float scaled = bits_to_f32(em) * 0x1p112f;
        const uint32_t special = 0u - uint32_t(em >= (0x7c00u << 13));  // all ones for inf / NaN
        const uint32_t bits = (special & (em | 0x7f800000u)) | (~special & f32_to_bits(scaled));
        return bits_to_f32(bits | sign);
    }
    static inline vec load(const f16_t* p) {
        vec r;
        for (int i = 0; i < W; ++i) r.v[i] = f16_bits_to_f32(p[i].bits);
        return r;
    }
    static inline vec fma(vec a, vec b, vec c) { for (int i = 0; i < W; ++i) c.v[i] += a.v[i] * b.v[i]; return c; }
    static inline vec add(vec a, vec b) { for (int i = 0; i < W; ++i) a.v[i] += b.v[i]; return a; }
    static inline float reduce(vec a) {
        float s0 = (a.v[0] + a.v[4]) + (a.v[2] + a.v[6]), s1 = (a.v[1] + a.v[5]) + (a.v[3] + a.v[7]);
        return s0 + s1;
    }
    static inline void store(float* p, vec a) { for (int i = 0; i < W; ++i) p[i] = a.v[i]; }
    static inline void store(bf16_t* p, vec a) { for (int i = 0; i < W; ++i) p[i].bits = f32_to_bf16_bits(a.v[i]); }
    static inline void store(f16_t* p, vec a) { for (int i = 0; i < W; ++i) p[i] = to_f16(a.v[i]); }
    static inline float f16_to_f32(uint16_t h) { return f16_bits_to_f32(h); }
    static inline uint16_t f32_to_f16(float f) { return to_f16(f).bits; }
    template <class T> static inline vec load_n(const T* p, int64_t n) { return load_n_via_stack<Portable>(p, n); }
    template <class T> static inline void store_n(T* p, vec v, int64_t n) { store_n_via_stack<Portable>(p, v, n); }
    static inline void transpose(vec (&r)[W]) {
        vec t[W];
        for (int i = 0; i < W; ++i)
            for (int j = 0; j < W; ++j) t[j].v[i] = r[i].v[j];
        for (int i = 0; i < W; ++i) r[i] = t[i];
    }
};

// 4 x 8 tile: 8 SSE accumulators.
using PortableKernel = F32Kernel<Portable, 4, 1, 256, 128>;

}  // namespace

void run_portable(const Args& a) {
    switch (a.dtype) {
        case kF32: return run_typed<Portable, PortableKernel, float>(a);
        case kF16: return run_typed<Portable, PortableKernel, f16_t>(a);
        case kBF16: return run_typed<Portable, PortableKernel, bf16_t>(a);
        default: unsupported_dtype(a.dtype);
    }
}

static bool env_is(const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v && !std::strcmp(v, value);
}

bool bf16dot_allowed() {
    static const bool allowed = !env_is("LLAISYS_CPU_LINEAR_BF16DOT", "0");
    return allowed;
}

int forced_path() {
    static const int path = env_is("LLAISYS_CPU_LINEAR_PATH", "gemv") ? 1
                            : env_is("LLAISYS_CPU_LINEAR_PATH", "gemm") ? 2 : 0;
    return path;
}

}  // namespace llaisys::cpu::linear

using namespace llaisys;

int LLAISYS_FN(linear)(int device, void* stream, int dtype, int64_t M, int64_t N, int64_t K,
                                      void* out, const void* x, const void* weight, const void* bias) {
    (void)device; (void)stream;
    return guard("linear", [&] {
        if (dtype != kF32 && dtype != kF16 && dtype != kBF16) unsupported_dtype(dtype);
        if (M < 0 || N < 0 || K < 0)
            throw InvalidArgument("negative size M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                  " K=" + std::to_string(K));
        if (M == 0 || N == 0) return;
        if (!out || (K > 0 && (!x || !weight))) throw InvalidArgument("null data pointer for out, x or weight");
        const cpu::linear::Args args{dtype, M, N, K, out, x, weight, bias};
        switch (cpu::simd_level()) {
            case cpu::Simd::kAvx512: return cpu::linear::run_avx512(args);
            case cpu::Simd::kAvx2: return cpu::linear::run_avx2(args);
            default: return cpu::linear::run_portable(args);
        }
    });
}
