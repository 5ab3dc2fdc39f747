// mask_logits: logits [rows, vocab] = -inf (in place) where bitmask int32 [rows, words] (32 tokens a word) has
// the token's bit clear (backend.h gives the packing). One thread per logit over a
// grid-stride loop; only the stored bits of -inf are written (f32 0xFF800000, f16 0xFC00, bf16 0xFF80), so one
// kernel per element size serves every dtype and no value is converted. Neighbouring threads read the same
// mask word (one broadcast load per 32 logits).
#include "../common/context.h"
#include "../common/launch.h"

namespace {

constexpr int64_t kWordBits = 32;  // tokens per bitmask word (the mask's packing, not a warp width)

template <class Bits>
__global__ void mask_logits_kernel(int64_t rows, int64_t vocab, Bits* logits, const uint32_t* bitmask,
                                   Bits neg_inf) {
    const int64_t words = (vocab + kWordBits - 1) / kWordBits;
    const int64_t n = rows * vocab;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t r = i / vocab, t = i - r * vocab;
        if (!((bitmask[r * words + t / kWordBits] >> (t % kWordBits)) & 1u)) logits[i] = neg_inf;
    }
}

}  // namespace

int LLAISYS_FN(mask_logits)(int device, void* stream, int dtype, int64_t rows, int64_t vocab, void* logits,
                            const void* bitmask) {
    using namespace llaisys::cuda;
    return guard("mask_logits", [&] {
        StreamContext& s = stream_context(device, stream);
        if (dtype != LLAISYS_F32 && dtype != LLAISYS_F16 && dtype != LLAISYS_BF16) unsupported_dtype(dtype);
        if (rows <= 0 || vocab <= 0) return;
        constexpr int kThreads = 256;
        const unsigned blocks = blocks_for(rows * vocab, kThreads, int64_t(device_context(s.device).sm_count) * 8);
        const auto* mask = static_cast<const uint32_t*>(bitmask);
        if (dtype == LLAISYS_F32) {
            auto kernel = &mask_logits_kernel<uint32_t>;
            LLAISYS_LAUNCH(kernel, blocks, kThreads, 0, s.stream, rows, vocab, static_cast<uint32_t*>(logits), mask,
                           0xFF800000u);
        } else {
            auto kernel = &mask_logits_kernel<uint16_t>;
            const uint16_t neg_inf = dtype == LLAISYS_F16 ? uint16_t(0xFC00) : uint16_t(0xFF80);
            LLAISYS_LAUNCH(kernel, blocks, kThreads, 0, s.stream, rows, vocab, static_cast<uint16_t*>(logits), mask,
                           neg_inf);
        }
    });
}
