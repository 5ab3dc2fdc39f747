// The mixture-of-experts ops around moe_linear (backend.h):
//   moe_router:  per row of logits [M, E], softmax in f32, the top k (by logit descending, equal logits by
//                ascending expert id), their probabilities (renormalised to sum 1 when asked), rounded once;
//   moe_router_grouped: DeepSeek's group-limited form of it (softmax or sigmoid, a choice bias, groups);
//   moe_combine: out[m] = sum_j weights[m, j] * y[m, j] in f32, j in order (one fused multiply-add a step).
// Each row is computed alone: its result never depends on the other rows.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../common/api.h"
#include "../common/thread_pool.h"
#include "../simd/simd.h"

LLAISYS_DECLARE_PER_ISA(void moe_combine(int dtype, int64_t M, int64_t k, int64_t N, void* out, const void* y,
                                         const void* weights))

namespace llaisys::cpu::LLAISYS_ISA {

void moe_combine(int dtype, int64_t M, int64_t k, int64_t N, void* out, const void* y, const void* weights) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(out);
        const T *ys = static_cast<const T*>(y), *w = static_cast<const T*>(weights);
        run_ranges(M, [&](int64_t m0, int64_t m1) {
            for (int64_t m = m0; m < m1; ++m) {
                auto row = [&](int64_t n, auto load, auto store) {  // Vec::W (or fewer) columns of row m
                    Vec acc = Vec::zero();
                    for (int64_t j = 0; j < k; ++j)
                        acc = fmadd(Vec::set1(to_f32(w[m * k + j])), load(ys + (m * k + j) * N + n), acc);
                    store(acc, o + m * N + n);
                };
                int64_t n = 0;
                for (; n + Vec::W <= N; n += Vec::W)
                    row(n, [](const T* p) { return Vec::load(p); }, [](Vec v, T* p) { v.store(p); });
                if (n < N) {
                    const int rest = int(N - n);
                    row(n, [rest](const T* p) { return Vec::load_partial(p, rest); },
                        [rest](Vec v, T* p) { v.store_partial(p, rest); });
                }
            }
        }, M * N * k >= kParallelGrain);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the router (a few dozen scalars a row) and the entry points, compiled once
namespace llaisys::cpu::LLAISYS_ISA {
namespace {

// Row m: softmax of E logits, the top k, their (renormalised) probabilities.
template <class T>
void route_row(const T* logits, int64_t E, int64_t k, bool normalize, T* weights, int64_t* experts,
               std::vector<float>& p, std::vector<int64_t>& ids) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < E; ++e) max = std::max(max, to_f32(logits[e]));
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(to_f32(logits[e]) - max));
    for (int64_t e = 0; e < E; ++e) p[size_t(e)] /= sum;
    // the order: larger logit first, equal logits by smaller id (NaN as -inf, so that the order stays strict);
    // softmax keeps it, and unlike p it is the same on every backend, whatever its exp rounds to
    auto key = [&](int64_t e) { const float l = to_f32(logits[e]); return std::isnan(l) ? -INFINITY : l; };
    std::iota(ids.begin(), ids.end(), int64_t(0));
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int64_t a, int64_t b) {
        return key(a) > key(b) || (key(a) == key(b) && a < b);
    });
    float top = 0.0f;
    for (int64_t j = 0; j < k; ++j) top += p[size_t(ids[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
        const float v = p[size_t(ids[size_t(j)])];
        experts[j] = ids[size_t(j)];
        weights[j] = from_f32<T>(normalize ? v / top : v);
    }
}

// Row m of the group-limited router (DeepSeek-V2 / V3, backend.h's moe_router_grouped): s = softmax or sigmoid of
// the logits, c = s + bias; the topk_group groups whose group_top largest c sum highest keep their experts, the
// others' c become -inf; the k largest c (descending, equal c by ascending id, NaN as -inf) are the experts, and
// their s (normalised, scaled) the weights.
struct GroupedRoute {
    int64_t E, k, n_group, topk_group, group_top;
    bool sigmoid, normalize;
    float scale;
    const float* bias;  // [E] or null
};

template <class T>
void route_grouped_row(const GroupedRoute& r, const float* logits, T* weights, int64_t* experts, std::vector<float>& s,
                       std::vector<float>& c, std::vector<int64_t>& ids, std::vector<float>& group_score) {
    const int64_t E = r.E;
    if (r.sigmoid) {
        for (int64_t e = 0; e < E; ++e) s[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
    } else {
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t e = 0; e < E; ++e) max = std::max(max, logits[e]);
        float sum = 0.0f;
        for (int64_t e = 0; e < E; ++e) sum += (s[size_t(e)] = std::exp(logits[e] - max));
        for (int64_t e = 0; e < E; ++e) s[size_t(e)] /= sum;
    }
    for (int64_t e = 0; e < E; ++e) {
        const float v = r.bias ? s[size_t(e)] + r.bias[e] : s[size_t(e)];
        c[size_t(e)] = std::isnan(v) ? -INFINITY : v;
    }
    auto before = [&](int64_t a, int64_t b) { return c[size_t(a)] > c[size_t(b)] || (c[size_t(a)] == c[size_t(b)] && a < b); };
    if (r.topk_group < r.n_group) {
        const int64_t per = E / r.n_group;
        for (int64_t g = 0; g < r.n_group; ++g) {  // the sum of the group's group_top largest c, largest first
            std::iota(ids.begin(), ids.begin() + per, g * per);
            std::partial_sort(ids.begin(), ids.begin() + r.group_top, ids.begin() + per, before);
            float sum = 0.0f;
            for (int64_t j = 0; j < r.group_top; ++j) sum += c[size_t(ids[size_t(j)])];
            group_score[size_t(g)] = std::isnan(sum) ? -INFINITY : sum;
        }
        std::iota(ids.begin(), ids.begin() + r.n_group, int64_t(0));
        std::partial_sort(ids.begin(), ids.begin() + r.topk_group, ids.begin() + r.n_group, [&](int64_t a, int64_t b) {
            return group_score[size_t(a)] > group_score[size_t(b)] ||
                   (group_score[size_t(a)] == group_score[size_t(b)] && a < b);
        });
        std::vector<char> kept(size_t(r.n_group), 0);  // (n_group is small: a few dozen)
        for (int64_t j = 0; j < r.topk_group; ++j) kept[size_t(ids[size_t(j)])] = 1;
        for (int64_t e = 0; e < E; ++e)
            if (!kept[size_t(e / per)]) c[size_t(e)] = -INFINITY;
    }
    std::iota(ids.begin(), ids.end(), int64_t(0));
    std::partial_sort(ids.begin(), ids.begin() + r.k, ids.end(), before);
    float top = 0.0f;
    for (int64_t j = 0; j < r.k; ++j) top += s[size_t(ids[size_t(j)])];
    for (int64_t j = 0; j < r.k; ++j) {
        const float v = s[size_t(ids[size_t(j)])];
        experts[j] = ids[size_t(j)];
        weights[j] = from_f32<T>((r.normalize ? v / (top + 1e-20f) : v) * r.scale);
    }
}

}  // namespace
}  // namespace llaisys::cpu::LLAISYS_ISA

int LLAISYS_FN(moe_router_grouped)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k, int scoring,
                                   int64_t n_group, int64_t topk_group, int64_t group_top, int normalize,
                                   double route_scale, void* weights, void* experts, const void* logits,
                                   const void* bias) {
    (void)device;
    return llaisys::launch("moe_router_grouped", stream, [=] {
        using llaisys::InvalidArgument;
        llaisys::require_float_dtype(dtype);
        const auto str = [](int64_t v) { return std::to_string(v); };
        if (scoring != 0 && scoring != 1) throw InvalidArgument("scoring = " + str(scoring) + " is not 0 or 1");
        if (n_group < 1 || E % n_group)
            throw InvalidArgument("n_group = " + str(n_group) + " does not divide E = " + str(E));
        if (topk_group < 1 || topk_group > n_group)
            throw InvalidArgument("topk_group = " + str(topk_group) + " must be in [1, n_group = " + str(n_group) + "]");
        if (group_top < 1 || group_top > E / n_group)
            throw InvalidArgument("group_top = " + str(group_top) + " must be in [1, E / n_group = " +
                                  str(E / n_group) + "]");
        if (k < 1 || k > topk_group * (E / n_group))
            throw InvalidArgument("k = " + str(k) + " must be in [1, topk_group * E / n_group = " +
                                  str(topk_group * (E / n_group)) + "]");
        const llaisys::cpu::LLAISYS_ISA::GroupedRoute r{E, k, n_group, topk_group, group_top, scoring == 1,
                                                       normalize != 0, float(route_scale),
                                                       static_cast<const float*>(bias)};
        llaisys::cpu::LLAISYS_ISA::with_float_type(dtype, [&](auto tag) {
            using T = decltype(tag);
            std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E)),
                groups(static_cast<size_t>(n_group));
            std::vector<int64_t> ids(static_cast<size_t>(E));
            for (int64_t m = 0; m < M; ++m)
                llaisys::cpu::LLAISYS_ISA::route_grouped_row(r, static_cast<const float*>(logits) + m * E,
                                                             static_cast<T*>(weights) + m * k,
                                                             static_cast<int64_t*>(experts) + m * k, s, c, ids,
                                                             groups);
        });
    });
}

int LLAISYS_FN(moe_router)(int device, void* stream, int dtype, int64_t M, int64_t E, int64_t k, int normalize,
                           void* weights, void* experts, const void* logits) {
    (void)device;
    return llaisys::launch("moe_router", stream, [=] {
        llaisys::require_float_dtype(dtype);
        if (k < 1 || k > E) throw llaisys::InvalidArgument("k = " + std::to_string(k) + " must be in [1, E = " +
                                                          std::to_string(E) + "]");
        llaisys::cpu::LLAISYS_ISA::with_float_type(dtype, [&](auto tag) {
            using T = decltype(tag);
            std::vector<float> p(static_cast<size_t>(E));
            std::vector<int64_t> ids(static_cast<size_t>(E));
            for (int64_t m = 0; m < M; ++m)
                llaisys::cpu::LLAISYS_ISA::route_row(static_cast<const T*>(logits) + m * E, E, k, normalize != 0,
                                        static_cast<T*>(weights) + m * k, static_cast<int64_t*>(experts) + m * k,
                                        p, ids);
        });
    });
}

int LLAISYS_FN(moe_combine)(int device, void* stream, int dtype, int64_t M, int64_t k, int64_t N, void* out,
                            const void* y, const void* weights) {
    (void)device;
    return llaisys::launch("moe_combine", stream, [=] {
        llaisys::require_float_dtype(dtype);
        LLAISYS_PER_ISA(moe_combine)(dtype, M, k, N, out, y, weights);
    });
}
#endif
