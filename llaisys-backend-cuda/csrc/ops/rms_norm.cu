// rms_norm: per row of x [rows, dim], out = x * weight / sqrt(mean(x^2) + eps). One block per row: the
// squares are summed in f32 (per thread, then a block reduction), r = 1 / sqrt(sum / dim + (float)eps)
// as HF computes it, y = x * r rounded to the dtype, and out = y * weight rounded again: HF's Qwen2RMSNorm
// (weight * h.to(input_dtype)). Both numerics modes compute this, as the CPU backend does: the op's
// contract is HF's rounding of the normalised row (what models were trained with; ~1 ulp from the
// exactly rounded result). An f32 weight with f16 / bf16 x is HF's Gemma3RMSNorm instead: (x * r) * weight
// in f32, rounded once (the model keeps 1 + w in f32). out may be x: every element is read and written by the
// same thread.
#include <string>
#include <type_traits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"

namespace llaisys::cuda {
namespace {

// TW: the weight's type, T (x * r rounded to T before the weight) or float (not rounded: Gemma's norm).
template <class T, class TW>
__global__ void rms_norm_kernel(int64_t rows, int64_t dim, float eps, T* out, const T* x, const TW* weight) {
    __shared__ BlockScratch<float> scratch;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * dim;
        T* yr = out + row * dim;
        float squares = 0.0f;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            const float v = to_float(xr[c]);
            squares += v * v;
        }
        const float total = block_sum(squares, scratch);
        const float r = 1.0f / sqrtf(total / float(dim) + eps);
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            const float normed = to_float(xr[c]) * r;
            yr[c] = from_float<T>((std::is_same<T, TW>::value ? round_to<T>(normed) : normed) * to_float(weight[c]));
        }
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(rms_norm)(int device, void* stream, int dtype, int numerics, int weight_dtype, int64_t rows,
                         int64_t dim, double eps, void* out, const void* x, const void* weight) {
    using namespace llaisys::cuda;
    return guard("rms_norm", [&] {
        (void)hf_numerics(numerics);  // validates the code: both modes round where HF does (above)
        if (weight_dtype != dtype && weight_dtype != LLAISYS_F32)
            throw NotSupported("rms_norm: weight dtype code " + std::to_string(weight_dtype) +
                               " is neither the dtype of x nor f32");
        StreamContext& s = stream_context(device, stream);
        if (rows <= 0 || dim <= 0) return;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            const int threads = dim >= 1024 ? 256 : 128;
            const unsigned blocks = blocks_for(rows, 1, int64_t(device_context(device).sm_count) * 16);
            auto launch = [&](auto* w) {
                using TW = std::remove_const_t<std::remove_pointer_t<decltype(w)>>;
                auto kernel = &rms_norm_kernel<T, TW>;
                LLAISYS_LAUNCH(kernel, blocks, threads, 0, s.stream, rows, dim, float(eps), static_cast<T*>(out),
                               static_cast<const T*>(x), w);
            };
            if (weight_dtype == LLAISYS_F32) launch(static_cast<const float*>(weight));
            else launch(static_cast<const T*>(weight));
        });
    });
}
