// logprobs: log-probabilities of one row of logits [n] under softmax(logits / temperature) (backend.h):
// values[0] for the chosen token, values[1 + j] and top_ids[j] for the k most probable tokens (k <= 20),
// descending, the lower id first among equal logits. In f32 with a stable log-sum-exp: with
// m = max(logits), d_i = (logits_i - m) / t in f32 (t = temperature, 1 when temperature is 0) and
// S = sum exp(d_i) (f32 exps, block sums in double, as sample.cpp draws), log p_i = d_i - log(S) in double,
// rounded to f32. NaN or +inf logits, or logits that are all -inf, have no log-probabilities: an error
// naming the first such position.
//
// The widen and exp passes are sample.cpp's vector builds; the top-k is one scalar pass keeping the best k
// in a sorted array (a logit below the current k-th costs one compare).
#include "../simd/simd.h"

#if defined(LLAISYS_ISA_PORTABLE)  // the algorithm and the exported entry point, compiled once
#include <cmath>
#include <string>
#include <vector>

#include "../common/api.h"
#include "argmax.h"
#include "sample.h"

namespace {

using llaisys::InvalidArgument;

// Is (va, ia) before (vb, ib): larger logit first, the lower id among equals?
bool before(float va, int64_t ia, float vb, int64_t ib) { return va > vb || (va == vb && ia < ib); }

void logprobs(int dtype, int64_t n, const void* logits, int64_t chosen, double temperature, int64_t k,
              int64_t* top_ids, float* values) {
    thread_local std::vector<float> v, p;
    thread_local std::vector<double> sums;
    v.resize(size_t(n));
    p.resize(size_t(n));
    sums.resize(size_t((n + kSampleBlock - 1) / kSampleBlock));
    const int64_t best = LLAISYS_PER_ISA(argmax)(dtype, n, logits);  // NaN counts as the maximum
    LLAISYS_PER_ISA(sample_widen)(dtype, n, logits, v.data());
    const float m = v[size_t(best)];
    if (std::isnan(m) || std::isinf(m))
        throw InvalidArgument(std::isnan(m) ? "logits[" + std::to_string(best) + "] is NaN"
                              : m > 0   ? "logits[" + std::to_string(best) + "] is +inf: no finite log-probabilities"
                                        : std::string("every logit is -inf"));
    const float t = temperature > 0.0 ? float(temperature) : 1.0f;
    LLAISYS_PER_ISA(sample_exp)(n, v.data(), m, t, p.data(), sums.data());
    double total = 0.0;
    for (double s : sums) total += s;
    const double log_total = std::log(total);  // total >= 1: exp(d_best) = 1
    auto logprob = [&](int64_t i) { return float(double((v[size_t(i)] - m) / t) - log_total); };
    values[0] = logprob(chosen);
    // The best k by (logit descending, id ascending): ids in top_ids[0, count), kept sorted.
    int64_t count = 0;
    for (int64_t i = 0; i < n && k > 0; ++i) {
        const float x = v[size_t(i)];
        if (count == k && !before(x, i, v[size_t(top_ids[k - 1])], top_ids[k - 1])) continue;
        int64_t j = count < k ? count++ : k - 1;  // the slot to fill, moved up to its place
        for (; j > 0 && before(x, i, v[size_t(top_ids[j - 1])], top_ids[j - 1]); --j) top_ids[j] = top_ids[j - 1];
        top_ids[j] = i;
    }
    for (int64_t j = 0; j < k; ++j) values[1 + j] = logprob(top_ids[j]);
}

}  // namespace

int LLAISYS_FN(logprobs)(int device, void* stream, int dtype, int64_t n, const void* logits, int64_t chosen,
                         double temperature, int64_t k, void* top_ids, void* values) {
    (void)device;
    return llaisys::launch("logprobs", stream, [=] {
        llaisys::require_float_dtype(dtype);
        if (n <= 0) throw InvalidArgument("logits is empty");
        if (chosen < 0 || chosen >= n)
            throw InvalidArgument("chosen = " + std::to_string(chosen) + " is not a token id in [0, " +
                                  std::to_string(n) + ")");
        if (k < 0 || k > 20 || k > n) throw InvalidArgument("k = " + std::to_string(k) + " is not in [0, min(20, n)]");
        logprobs(dtype, n, logits, chosen, temperature, k, static_cast<int64_t*>(top_ids),
                 static_cast<float*>(values));
    });
}
#endif
