// mask_logits: logits [rows, vocab] = -inf (in place) wherever bitmask int32 [rows, ceil(vocab / 32)] has the
// token's bit clear (bit t % 32 of word t / 32, least significant first). Only the stored bits of -inf are
// written, so f32 / f16 / bf16 share one loop over element sizes; nothing is converted. A grammar usually
// allows few tokens, so a word of zeros (32 banned tokens) is the common case and takes a straight fill.

#include "../common/api.h"
#include "../simd/simd.h"  // LLAISYS_ISA_PORTABLE: which of the per-ISA builds exports the entry point

#if defined(LLAISYS_ISA_PORTABLE)  // scalar bit tests, compiled once: a row is one pass over ~600 KB at most
namespace {

template <class Bits>
void mask_rows(int64_t rows, int64_t vocab, Bits* logits, const uint32_t* bitmask, Bits neg_inf) {
    const int64_t words = (vocab + 31) / 32;
    for (int64_t r = 0; r < rows; ++r) {
        Bits* row = logits + r * vocab;
        const uint32_t* mask = bitmask + r * words;
        for (int64_t w = 0; w < words; ++w) {
            const int64_t base = w * 32;
            const int64_t n = vocab - base < 32 ? vocab - base : 32;
            uint32_t banned = ~mask[w];
            if (n < 32) banned &= (uint32_t(1) << n) - 1;  // bits past the vocabulary
            if (banned == 0xFFFFFFFFu) {
                for (int j = 0; j < 32; ++j) row[base + j] = neg_inf;
                continue;
            }
            while (banned) {
                row[base + __builtin_ctz(banned)] = neg_inf;
                banned &= banned - 1;
            }
        }
    }
}

}  // namespace

int LLAISYS_FN(mask_logits)(int device, void* stream, int dtype, int64_t rows, int64_t vocab, void* logits,
                            const void* bitmask) {
    (void)device;
    return llaisys::launch("mask_logits", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const auto* mask = static_cast<const uint32_t*>(bitmask);
        if (dtype == LLAISYS_F32)
            mask_rows<uint32_t>(rows, vocab, static_cast<uint32_t*>(logits), mask, 0xFF800000u);
        else  // f16 -inf is 0xFC00, bf16 -inf is 0xFF80
            mask_rows<uint16_t>(rows, vocab, static_cast<uint16_t*>(logits), mask,
                                dtype == LLAISYS_F16 ? uint16_t(0xFC00) : uint16_t(0xFF80));
    });
}
#endif
