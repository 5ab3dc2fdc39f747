// penalize_logits: logits [vocab] adjusted in place at n token ids (backend.h): the logit bias, then HF's
// repetition penalty (prompt + generated tokens), then OpenAI's frequency and presence penalties (generated
// tokens), in f32 and rounded once to the dtype. The ids and counts are checked before anything is written
// (the one check a kernel keeps: core cannot see the data). n is a sequence's distinct tokens (thousands at
// most), so one scalar pass, compiled once: no SIMD build of it.
#include "../simd/simd.h"

#if defined(LLAISYS_ISA_PORTABLE)  // scalar code and the exported entry point, compiled once
#include <string>

#include "../common/api.h"

namespace llaisys::cpu::LLAISYS_ISA {

static void check_entries(int64_t vocab, int64_t n, const int64_t* ids, const int64_t* counts) {
    for (int64_t i = 0; i < n; ++i) {
        const bool in_range = ids[i] >= 0 && ids[i] < vocab, increasing = i == 0 || ids[i] > ids[i - 1];
        if (in_range && increasing && counts[2 * i] >= 0 && counts[2 * i + 1] >= 0) continue;
        const std::string at = "[" + std::to_string(i) + "]";  // the message, for the first bad entry only
        if (!in_range)
            throw InvalidArgument("ids" + at + " = " + std::to_string(ids[i]) + " is not a token id in [0, " +
                                  std::to_string(vocab) + ") (nothing was written)");
        if (!increasing)
            throw InvalidArgument("ids" + at + " = " + std::to_string(ids[i]) + " is not above ids[" +
                                  std::to_string(i - 1) + "] = " + std::to_string(ids[i - 1]) +
                                  ": ids must be strictly increasing, each id once (nothing was written)");
        throw InvalidArgument("counts" + at + " = (" + std::to_string(counts[2 * i]) + ", " +
                              std::to_string(counts[2 * i + 1]) + ") is negative (nothing was written)");
    }
}

template <class T>
static void penalize(int64_t n, T* logits, const int64_t* ids, const int64_t* counts, const float* bias,
                     float repetition, float frequency, float presence) {
    for (int64_t i = 0; i < n; ++i) {
        const int64_t prompt = counts[2 * i], generated = counts[2 * i + 1];
        float x = to_f32(logits[ids[i]]);
        if (bias != nullptr) x += bias[i];
        if (prompt + generated > 0) x = x < 0.0f ? x * repetition : x / repetition;
        x -= float(generated) * frequency;
        if (generated > 0) x -= presence;
        logits[ids[i]] = from_f32<T>(x);
    }
}

}  // namespace llaisys::cpu::LLAISYS_ISA

int LLAISYS_FN(penalize_logits)(int device, void* stream, int dtype, int64_t vocab, int64_t n, void* logits,
                                const void* ids, const void* counts, const void* bias, double repetition,
                                double frequency, double presence) {
    (void)device;
    return llaisys::launch("penalize_logits", stream, [=] {
        using namespace llaisys::cpu::LLAISYS_ISA;
        llaisys::require_float_dtype(dtype);
        const auto* id = static_cast<const int64_t*>(ids);
        const auto* count = static_cast<const int64_t*>(counts);
        check_entries(vocab, n, id, count);
        with_float_type(dtype, [&](auto tag) {
            using T = decltype(tag);
            penalize(n, static_cast<T*>(logits), id, count, static_cast<const float*>(bias), float(repetition),
                     float(frequency), float(presence));
        });
    });
}
#endif
