// rope: rotary embedding, half-split (rotate_half) layout, on x [seq, heads, d] with int64 positions:
//     out[j] = x[j] cos(a) - x[j + d/2] sin(a),  out[j + d/2] = x[j + d/2] cos(a) + x[j] sin(a)
// with a = float(pos) * inv_freq[j] in f32, inv_freq the caller's f32 table (1 / theta^(2j / d) or a
// rope-scaling variant), as HF transformers computes them (Qwen2RotaryEmbedding). One block per position:
// its threads first put cos/sin of the d/2 angles in shared memory (evaluated in double from the f32 angle
// and rounded, so they are the correctly rounded f32 values, then times the f32 scale: YaRN's attention
// factor, else 1), then rotate every head. The products are rounded separately (no FMA, as
// torch does in f32) and the result once to the dtype. LLAISYS_NUMERICS_HF rounds as HF does in f16 / bf16:
// cos and sin to the dtype, then each product, then the sum. out may be x (each pair is read, then
// written, by one thread).
#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"

namespace llaisys::cuda {
namespace {

template <class T, bool kHf>
__global__ void rope_kernel(int64_t seq, int64_t heads, int64_t d, float scale, T* out, const T* x,
                            const int64_t* pos_ids, const float* inv_freq) {
    LLAISYS_DYNAMIC_SHARED(float, table);  // [2][d/2]: cos, then sin
    const int64_t half = d / 2;
    float* cos_a = table;
    float* sin_a = table + half;
    for (int64_t s = blockIdx.x; s < seq; s += gridDim.x) {
        const float p = float(pos_ids[s]);  // position_ids.float()
        for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
            const double angle = double(__fmul_rn(p, inv_freq[j]));
            const float c = __fmul_rn(float(cos(angle)), scale), sn = __fmul_rn(float(sin(angle)), scale);
            cos_a[j] = kHf ? round_to<T>(c) : c;
            sin_a[j] = kHf ? round_to<T>(sn) : sn;
        }
        __syncthreads();
        const T* xs = x + s * heads * d;
        T* ys = out + s * heads * d;
        for (int64_t i = threadIdx.x; i < heads * half; i += blockDim.x) {
            const int64_t h = i / half, j = i % half;
            const float x1 = to_float(xs[h * d + j]), x2 = to_float(xs[h * d + j + half]);
            const float c = cos_a[j], sn = sin_a[j];
            float p1 = __fmul_rn(x1, c), p2 = __fmul_rn(x2, sn), p3 = __fmul_rn(x2, c), p4 = __fmul_rn(x1, sn);
            if (kHf) p1 = round_to<T>(p1), p2 = round_to<T>(p2), p3 = round_to<T>(p3), p4 = round_to<T>(p4);
            ys[h * d + j] = from_float<T>(__fsub_rn(p1, p2));
            ys[h * d + j + half] = from_float<T>(__fadd_rn(p3, p4));
        }
        __syncthreads();  // the table is rewritten for the next position
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(rope)(int device, void* stream, int dtype, int numerics, int64_t seq, int64_t heads, int64_t head_dim,
                     double scale, void* out, const void* x, const void* pos_ids, const void* inv_freq) {
    using namespace llaisys::cuda;
    return guard("rope", [&] {
        const bool hf = hf_numerics(numerics);
        StreamContext& s = stream_context(device, stream);
        if (seq <= 0 || heads <= 0 || head_dim <= 0) return;
        if (head_dim % 2) throw InvalidArgument("head_dim " + std::to_string(head_dim) + " is odd");
        const size_t table_bytes = size_t(head_dim) * sizeof(float);
        if (table_bytes > device_context(device).max_shared_per_block)
            throw NotSupported("head_dim " + std::to_string(head_dim) + " is too large for this kernel");
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            const unsigned blocks = blocks_for(seq, 1, int64_t(device_context(device).sm_count) * 16);
            auto kernel = hf ? &rope_kernel<T, true> : &rope_kernel<T, false>;
            LLAISYS_LAUNCH(kernel, blocks, 128, table_bytes, s.stream, seq, heads, head_dim, float(scale),
                           static_cast<T*>(out), static_cast<const T*>(x), static_cast<const int64_t*>(pos_ids),
                           static_cast<const float*>(inv_freq));
        });
    });
}
