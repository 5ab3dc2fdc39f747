// The mixture-of-experts ops around moe_linear (backend.h):
//   moe_router:  per row of logits [M, E], softmax in f32, the top k (by logit descending, equal logits by
//                ascending expert id), their probabilities (renormalised to sum 1 when asked), rounded once;
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

}  // namespace
}  // namespace llaisys::cpu::LLAISYS_ISA

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
