// rms_norm: per row of x [rows, dim], out = x * weight / sqrt(mean(x^2) + eps).
//
// Numerics follow HF transformers' Qwen2RMSNorm / LlamaRMSNorm exactly, so models match HF token for token:
//     h = x.to(f32); var = h.pow(2).mean(-1); h = h * rsqrt(var + eps); return weight * h.to(input_dtype)
// i.e. in f32: sum of squares, divided by dim, plus (float)eps, r = 1 / sqrt(.), y = x * r ROUNDED TO THE
// INPUT DTYPE, and only then out = weight * y, rounded again (for f32 both roundings are no-ops, and
// the two products stay separate multiplies, no FMA). The double rounding costs at most ~1 ulp against
// the exact result, well inside the DESIGN §6 tolerances. Only the summation order of the squares
// differs from torch (4 x W f32 lanes here), i.e. ~1 f32 ulp in the variance. Both numerics modes run this
// code: the exact mode keeps HF's rounding of the normalised row because it is what models were trained with
// and stays within the tolerances.
//
// An f32 weight with f16 / bf16 x is HF's Gemma3RMSNorm instead, (x.float() * r) * (1 + w.float()) rounded
// once: the model keeps 1 + w in f32, and y = x * r is not rounded before it.
#include <cmath>
#include <string>
#include <type_traits>

#include "../common/api.h"
#include "../common/thread_pool.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void rms_norm(int dtype, bool f32_weight, int64_t rows, int64_t dim, double eps, void* out,
                                      const void* x, const void* weight))

namespace llaisys::cpu::LLAISYS_ISA {

// The squares rounded to f32 and summed (x.pow(2).sum() in torch), in 4 x W lanes.
template <class T>
static float sum_of_squares(const T* x, int64_t dim) {
    constexpr int W = Vec::W;
    Vec a0 = Vec::zero(), a1 = Vec::zero(), a2 = Vec::zero(), a3 = Vec::zero();
    int64_t i = 0;
    for (; i + 4 * W <= dim; i += 4 * W) {
        Vec v0 = Vec::load(x + i), v1 = Vec::load(x + i + W), v2 = Vec::load(x + i + 2 * W), v3 = Vec::load(x + i + 3 * W);
        a0 = a0 + mul_unfused(v0, v0);
        a1 = a1 + mul_unfused(v1, v1);
        a2 = a2 + mul_unfused(v2, v2);
        a3 = a3 + mul_unfused(v3, v3);
    }
    for (; i + W <= dim; i += W) {
        Vec v = Vec::load(x + i);
        a0 = a0 + mul_unfused(v, v);
    }
    if (i < dim) {
        Vec v = Vec::load_partial(x + i, int(dim - i));
        a1 = a1 + mul_unfused(v, v);
    }
    return reduce_add((a0 + a1) + (a2 + a3));
}

// TW: the weight's type, T (y rounded to T before the weight) or float (not rounded: Gemma's norm).
template <class T, class TW>
static void rms_norm_row(int64_t dim, float eps, T* out, const T* x, const TW* weight) {
    constexpr int W = Vec::W;
    const float variance = sum_of_squares(x, dim) / float(dim);
    const Vec r = Vec::set1(1.0f / std::sqrt(variance + eps));
    auto normed = [&](Vec y) {
        if constexpr (std::is_same_v<T, TW>) return y.template round_to<T>();
        else return y;
    };
    int64_t i = 0;
    for (; i + W <= dim; i += W) {
        Vec y = normed(Vec::load(x + i) * r);
        (Vec::load(weight + i) * y).store(out + i);
    }
    if (i < dim) {
        const int rest = int(dim - i);
        Vec y = normed(Vec::load_partial(x + i, rest) * r);
        (Vec::load_partial(weight + i, rest) * y).store_partial(out + i, rest);
    }
}

void rms_norm(int dtype, bool f32_weight, int64_t rows, int64_t dim, double eps, void* out, const void* x,
              const void* weight) {
    const float eps_f = float(eps);  // torch adds the Python float to an f32 tensor in f32
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(out);
        const T* xs = static_cast<const T*>(x);
        auto rows_with = [&](auto* w) {
            run_ranges(rows, [&](int64_t row_begin, int64_t row_end) {
                for (int64_t row = row_begin; row < row_end; ++row)
                    rms_norm_row(dim, eps_f, o + row * dim, xs + row * dim, w);
            }, rows > 1 && rows * dim >= kParallelGrain);
        };
        if (f32_weight && !std::is_same_v<T, float>) rows_with(static_cast<const float*>(weight));
        else rows_with(static_cast<const T*>(weight));
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(rms_norm)(int device, void* stream, int dtype, int numerics, int weight_dtype, int64_t rows,
                         int64_t dim, double eps, void* out, const void* x, const void* weight) {
    (void)device;
    return llaisys::launch("rms_norm", stream, [=] {
        (void)llaisys::hf_numerics(numerics);  // LLAISYS_NUMERICS_HF: the same rounding (see the top)
        llaisys::require_float_dtype(dtype);
        if (weight_dtype != dtype && weight_dtype != LLAISYS_F32)
            throw llaisys::NotSupported("rms_norm: weight dtype code " + std::to_string(weight_dtype) +
                                        " is neither the dtype of x nor f32");
        LLAISYS_PER_ISA(rms_norm)(dtype, weight_dtype == LLAISYS_F32, rows, dim, eps, out, x, weight);
    });
}
#endif
