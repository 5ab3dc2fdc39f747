// sample: draw one token id from softmax(logits / temperature), restricted to the top_k largest logits
// (0 = all) and then to the nucleus top_p: the smallest set of most probable tokens whose probability
// sums to >= top_p (at least one token). temperature == 0 or top_k == 1 is argmax (first index on ties).
//
// Probabilities are exp((logit - max) / temperature) in f32 (softmax without the division; the sums are
// accumulated in double). The draw is counter based: u = splitmix64(seed) as a double in [0, 1), and the
// token is the first, in candidate order, whose running sum exceeds u * total: the same seed gives the
// same token on every run and thread count. Order of candidates: index order when all tokens stay,
// otherwise by logit descending (index ascending among equal logits).
//
// Cost for a 151936-token vocabulary: top_k <= 1024 keeps a heap of the best k while a vector pass
// skips every logit below the current k-th; a larger k finds the k-th value by radix selection (three
// histograms). Without top_k, top_p sorts only the tokens above a probability threshold that is lowered
// (by 2^-8 steps) until they hold top_p of the mass: a peaked distribution sorts a few hundred tokens,
// not the vocabulary.
// NaN logits are an error (InvalidArgument naming the position), as are logits that are all -inf; +inf
// logits share all the probability.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../common/api.h"
#include "../common/thread_pool.h"
#include "../simd/simd.h"
#include "argmax.h"
#include "sample.h"

// Writes base + i for every i in [0, n) with v[i] > threshold (>= if inclusive), in order; returns the count.
LLAISYS_DECLARE_PER_ISA(int64_t sample_select(int64_t n, const float* v, float threshold, bool inclusive,
                                              int64_t base, int64_t* out))
// Sum of the p[i] >= threshold.
LLAISYS_DECLARE_PER_ISA(double sample_sum_at_least(int64_t n, const float* p, float threshold))

// ---- the vector passes, one build per instruction set -------------------------------------------------

namespace llaisys::cpu::LLAISYS_ISA {

void sample_widen(int dtype, int64_t n, const void* src, float* dst) {
    with_float_type(dtype, [&](auto tag) { convert(static_cast<const decltype(tag)*>(src), dst, n); });
}

void sample_exp(int64_t n, const float* v, float max, float temperature, float* p, double* block_sums) {
    const int64_t blocks = (n + kSampleBlock - 1) / kSampleBlock;
    const Vec m = Vec::set1(max), t = Vec::set1(temperature);
    run_ranges(blocks, [&](int64_t b_begin, int64_t b_end) {
        for (int64_t b = b_begin; b < b_end; ++b) {
            const int64_t begin = b * kSampleBlock, end = begin + kSampleBlock < n ? begin + kSampleBlock : n;
            Vec acc = Vec::zero();
            int64_t i = begin;
            for (; i + Vec::W <= end; i += Vec::W) {
                Vec e = vexp((Vec::load(v + i) - m) / t);
                e.store(p + i);
                acc = acc + e;
            }
            if (i < end) {
                const int rest = int(end - i);
                Vec e = select(Vec::first(rest), vexp((Vec::load_partial(v + i, rest) - m) / t), Vec::zero());
                e.store_partial(p + i, rest);
                acc = acc + e;
            }
            block_sums[b] = double(reduce_add(acc));
        }
    }, n >= 4 * kParallelGrain);
}

int64_t sample_select(int64_t n, const float* v, float threshold, bool inclusive, int64_t base, int64_t* out) {
    const Vec t = Vec::set1(threshold);
    int64_t count = 0, i = 0;
    for (; i + Vec::W <= n; i += Vec::W) {
        const Vec a = Vec::load(v + i);
        for (uint32_t m = bits(inclusive ? ge_mask(a, t) : gt_mask(a, t)); m; m &= m - 1)
            out[count++] = base + i + __builtin_ctz(m);
    }
    for (; i < n; ++i)
        if (inclusive ? v[i] >= threshold : v[i] > threshold) out[count++] = base + i;
    return count;
}

double sample_sum_at_least(int64_t n, const float* p, float threshold) {
    const Vec t = Vec::set1(threshold);
    double total = 0.0;
    for (int64_t begin = 0; begin < n; begin += kSampleBlock) {
        const int64_t end = begin + kSampleBlock < n ? begin + kSampleBlock : n;
        Vec acc = Vec::zero();
        int64_t i = begin;
        for (; i + Vec::W <= end; i += Vec::W) {
            const Vec a = Vec::load(p + i);
            acc = acc + select(ge_mask(a, t), a, Vec::zero());
        }
        float tail = 0.0f;
        for (; i < end; ++i) tail += p[i] >= threshold ? p[i] : 0.0f;
        total += double(reduce_add(acc)) + double(tail);
    }
    return total;
}

}  // namespace llaisys::cpu::LLAISYS_ISA

// ---- the algorithm and the exported entry point, compiled once --------------------------------------------
#if defined(LLAISYS_ISA_PORTABLE)
namespace {

using llaisys::InvalidArgument;

constexpr int64_t kHeapTopK = 1024;  // above this top_k, a radix selection of the k-th value instead of a heap

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Uniform double in [0, 1) for draw `counter` of stream `seed` (53 random bits).
double uniform(uint64_t seed, uint64_t counter) {
    return double(splitmix64(seed ^ splitmix64(counter)) >> 11) * 0x1.0p-53;
}

struct Workspace {
    std::vector<float> values, probs, cand_values, cand_probs;
    std::vector<double> block_sums;
    std::vector<int64_t> cand, scratch;
    std::vector<uint32_t> keys;
    std::vector<uint64_t> packed;
};

// Maps floats to unsigned keys of the same order (-0 and +0 alike; no NaN reaches here). Branch-free:
// the signs of logits are random, so a branch here would mispredict half the time.
uint32_t order_key(float f) {
    f = f + 0.0f;  // -0 becomes +0 (and nothing else changes)
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    const uint32_t negative = uint32_t(int32_t(u) >> 31);  // all ones for negative floats
    return u ^ (negative | 0x80000000u);
}

float from_order_key(uint32_t key) {
    const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

// The k-th largest of v[0, n) (1 <= k <= n) by radix selection on order keys: a histogram of the top
// 11 bits over all of v, then of the next 11 and the last 10 over the keys left in the chosen bucket.
float kth_largest(const float* v, int64_t n, int64_t k, Workspace& ws) {
    int64_t rank = k;  // rank among the keys still in the running, from the top
    // the bucket (of `buckets`) holding the rank-th largest, given its histogram; updates rank
    auto choose = [&rank](const uint32_t* hist, uint32_t buckets) {
        uint32_t bucket = buckets - 1;
        for (; bucket > 0 && int64_t(hist[bucket]) < rank; --bucket) rank -= hist[bucket];
        return bucket;
    };
    uint32_t hist[2048] = {};
    for (int64_t i = 0; i < n; ++i) ++hist[order_key(v[i]) >> 21];
    uint32_t prefix = choose(hist, 2048) << 21;
    std::vector<uint32_t>& keys = ws.keys;
    keys.resize(size_t(n));
    size_t live = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t key = order_key(v[i]);
        if ((key >> 21) == (prefix >> 21)) keys[live++] = key;
    }
    for (int shift : {10, 0}) {
        const uint32_t buckets = shift == 0 ? 1024u : 2048u;
        std::fill(hist, hist + 2048, 0u);
        for (size_t i = 0; i < live; ++i) ++hist[(keys[i] >> shift) & (buckets - 1)];
        const uint32_t bucket = choose(hist, buckets);
        prefix |= bucket << shift;
        size_t kept = 0;
        for (size_t i = 0; i < live; ++i)
            if (((keys[i] >> shift) & (buckets - 1)) == bucket) keys[kept++] = keys[i];
        live = kept;
    }
    return from_order_key(prefix);
}

// Sorts indices best first: larger logit first, lower index first among equal logits (the Better
// order), through one 64-bit key per index (logit order key, then the complement of the index).
void sort_best_first(std::vector<int64_t>& idx, const float* v, Workspace& ws) {
    std::vector<uint64_t>& packed = ws.packed;
    packed.resize(idx.size());
    for (size_t c = 0; c < idx.size(); ++c)
        packed[c] = (uint64_t(order_key(v[idx[c]])) << 32) | uint64_t(0xffffffffu - uint32_t(idx[c]));
    std::sort(packed.begin(), packed.end(), std::greater<uint64_t>());
    for (size_t c = 0; c < idx.size(); ++c) idx[c] = int64_t(0xffffffffu - uint32_t(packed[c]));
}

// Candidate order: larger logit first, lower index first among equal logits.
struct Better {
    const float* v;
    bool operator()(int64_t a, int64_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// The vector passes of the build this process runs.
void widen(int dtype, int64_t n, const void* src, float* dst) { LLAISYS_PER_ISA(sample_widen)(dtype, n, src, dst); }
void exp_pass(int64_t n, const float* v, float max, float t, float* p, double* sums) {
    LLAISYS_PER_ISA(sample_exp)(n, v, max, t, p, sums);
}
int64_t select_pass(int64_t n, const float* v, float threshold, bool inclusive, int64_t base, int64_t* out) {
    return LLAISYS_PER_ISA(sample_select)(n, v, threshold, inclusive, base, out);
}
double sum_at_least(int64_t n, const float* p, float threshold) {
    return LLAISYS_PER_ISA(sample_sum_at_least)(n, p, threshold);
}

// The k best indices (Better order) into ws.cand, sorted best first if `sorted`. 0 < k < n.
void top_k_candidates(const float* v, int64_t n, int64_t k, bool sorted, Workspace& ws) {
    const Better better{v};
    std::vector<int64_t>& heap = ws.cand;  // a heap whose front is the worst kept index
    heap.clear();
    if (k <= kHeapTopK) {
        ws.scratch.resize(size_t(kSampleBlock));
        for (int64_t begin = 0; begin < n; begin += kSampleBlock) {
            const int64_t len = std::min<int64_t>(kSampleBlock, n - begin);
            const bool full = int64_t(heap.size()) == k;
            // once k are kept, only logits above the worst kept one can enter (later indices lose ties)
            const int64_t hits = full ? select_pass(len, v + begin, v[heap.front()], false, begin, ws.scratch.data())
                                      : select_pass(len, v + begin, -INFINITY, true, begin, ws.scratch.data());
            for (int64_t h = 0; h < hits; ++h) {
                const int64_t i = ws.scratch[size_t(h)];
                if (int64_t(heap.size()) < k) {
                    heap.push_back(i);
                    std::push_heap(heap.begin(), heap.end(), better);
                } else if (better(i, heap.front())) {
                    std::pop_heap(heap.begin(), heap.end(), better);
                    heap.back() = i;
                    std::push_heap(heap.begin(), heap.end(), better);
                }
            }
        }
    } else {
        // the k-th largest value; everything above it and, in index order, as many equal to it as fit
        const float kth = kth_largest(v, n, k, ws);
        heap.resize(size_t(n));
        heap.resize(size_t(select_pass(n, v, kth, true, 0, heap.data())));
        int64_t above = 0;
        for (int64_t i : heap) above += v[i] > kth;
        int64_t equal_room = k - above;
        size_t kept = 0;
        for (int64_t i : heap)
            if (v[i] > kth || (v[i] == kth && equal_room-- > 0)) heap[kept++] = i;
        heap.resize(kept);
    }
    if (sorted) sort_best_first(heap, v, ws);
}

// Probabilities of the candidates ws.cand (gathered), into ws.cand_probs; returns their sum.
double candidate_probs(const float* v, float max, float temperature, Workspace& ws) {
    const int64_t k = int64_t(ws.cand.size());
    ws.cand_values.resize(size_t(k));
    for (int64_t c = 0; c < k; ++c) ws.cand_values[size_t(c)] = v[ws.cand[size_t(c)]];
    ws.cand_probs.resize(size_t(k));
    ws.block_sums.resize(size_t((k + kSampleBlock - 1) / kSampleBlock));
    exp_pass(k, ws.cand_values.data(), max, temperature, ws.cand_probs.data(), ws.block_sums.data());
    double total = 0;
    for (double s : ws.block_sums) total += s;
    return total;
}

// Among candidates sorted best first with probabilities p: how many form the nucleus for mass target.
int64_t nucleus_size(const float* p, int64_t k, double target) {
    double cum = 0;
    for (int64_t c = 0; c < k; ++c) {
        cum += double(p[c]);
        if (cum >= target) return c + 1;
    }
    return k;
}

// The first candidate whose running sum exceeds r (the last with nonzero probability if rounding
// leaves r beyond the sum).
int64_t draw(const float* p, int64_t k, double r) {
    double cum = 0;
    int64_t last_positive = 0;
    for (int64_t c = 0; c < k; ++c) {
        if (p[c] > 0) last_positive = c;
        cum += double(p[c]);
        if (cum > r) return c;
    }
    return last_positive;
}

int64_t sample_token(int dtype, int64_t n, const void* logits, double temperature, int64_t top_k, double top_p,
                     uint64_t seed) {
    const int64_t arg = LLAISYS_PER_ISA(argmax)(dtype, n, logits);
    // temperature 0 (or one that underflows f32: the distribution is a point mass) is greedy
    if (temperature < double(FLT_MIN) || top_k == 1) return arg;

    thread_local Workspace ws;
    const float* v = static_cast<const float*>(logits);
    if (dtype != LLAISYS_F32) {
        ws.values.resize(size_t(n));
        widen(dtype, n, logits, ws.values.data());
        v = ws.values.data();
    }
    float max = v[arg];
    if (std::isnan(max)) throw InvalidArgument("logits[" + std::to_string(arg) + "] is NaN");
    if (max == -INFINITY) throw InvalidArgument("every logit is -inf: nothing can be sampled");
    if (max == INFINITY) {  // the +inf logits share all the probability, uniformly
        ws.values.resize(size_t(n));
        for (int64_t i = 0; i < n; ++i) ws.values[size_t(i)] = v[i] == INFINITY ? 0.0f : -INFINITY;
        v = ws.values.data();
        max = 0.0f;
    }
    const float t = float(std::min(temperature, double(FLT_MAX)));  // huge: uniform (and -inf stays -inf)
    const double u = uniform(seed, 0);
    const int64_t k = (top_k <= 0 || top_k >= n) ? n : top_k;

    if (k < n) {  // top-k candidates, sorted best first: the draw walks them in that order (the contract)
        top_k_candidates(v, n, k, true, ws);
        const double total = candidate_probs(v, max, t, ws);
        const float* p = ws.cand_probs.data();
        int64_t kept = k;
        double kept_sum = total;
        if (top_p < 1.0) {
            kept = nucleus_size(p, k, top_p * total);
            kept_sum = 0;
            for (int64_t c = 0; c < kept; ++c) kept_sum += double(p[c]);
        }
        return ws.cand[size_t(draw(p, kept, u * kept_sum))];
    }

    // every token: probabilities for the whole vocabulary
    ws.probs.resize(size_t(n));
    const int64_t blocks = (n + kSampleBlock - 1) / kSampleBlock;
    ws.block_sums.resize(size_t(blocks));
    exp_pass(n, v, max, t, ws.probs.data(), ws.block_sums.data());
    double total = 0;
    for (double s : ws.block_sums) total += s;

    if (top_p >= 1.0) {  // draw in index order, skipping whole blocks by their sums
        const double r = u * total;
        double cum = 0;
        int64_t b = 0;
        for (; b + 1 < blocks && cum + ws.block_sums[size_t(b)] <= r; ++b) cum += ws.block_sums[size_t(b)];
        const int64_t begin = b * kSampleBlock, len = std::min<int64_t>(kSampleBlock, n - begin);
        const float* p = ws.probs.data() + begin;
        double in_block = cum;
        for (int64_t i = 0; i < len; ++i) {
            in_block += double(p[i]);
            if (in_block > r) return begin + i;
        }
        // rounding left r beyond the running sum: the last token with nonzero probability
        for (int64_t i = n - 1; i >= 0; --i)
            if (ws.probs[size_t(i)] > 0) return i;
        return arg;
    }

    // nucleus: lower a probability threshold until the tokens at or above it hold top_p of the mass,
    // then sort only those (the nucleus is a prefix of them)
    const double target = top_p * total;
    float threshold = 1.0f / 256.0f;  // probabilities are relative to the max token's 1
    while (threshold > 0.0f && sum_at_least(n, ws.probs.data(), threshold) < target) {
        threshold *= 1.0f / 256.0f;
        if (threshold < 1e-30f) threshold = 0.0f;
    }
    ws.cand.resize(size_t(n));
    const int64_t count = select_pass(n, ws.probs.data(), threshold, true, 0, ws.cand.data());
    ws.cand.resize(size_t(count));
    sort_best_first(ws.cand, v, ws);
    ws.cand_probs.resize(size_t(count));
    for (int64_t c = 0; c < count; ++c) ws.cand_probs[size_t(c)] = ws.probs[size_t(ws.cand[size_t(c)])];
    const int64_t kept = nucleus_size(ws.cand_probs.data(), count, target);
    double kept_sum = 0;
    for (int64_t c = 0; c < kept; ++c) kept_sum += double(ws.cand_probs[size_t(c)]);
    return ws.cand[size_t(draw(ws.cand_probs.data(), kept, u * kept_sum))];
}

}  // namespace

int LLAISYS_FN(sample)(int device, void* stream, int dtype, int64_t n, void* out_idx, const void* logits,
                       double temperature, int64_t top_k, double top_p, uint64_t seed) {
    (void)device;
    return llaisys::launch("sample", stream, [=] {
        llaisys::require_float_dtype(dtype);
        // candidates are sorted by 64-bit keys of (logit, 32-bit index)
        if (n >= (int64_t(1) << 32))
            throw llaisys::NotSupported("more than 2^32 - 1 logits (" + std::to_string(n) + ")");
        const int64_t token = sample_token(dtype, n, logits, temperature, top_k, top_p, seed);
        std::memcpy(out_idx, &token, sizeof(token));
    });
}
#endif
