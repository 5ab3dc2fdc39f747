// argmax: max_idx (int64 [1]) and max_val ([1], the element itself) of a 1-D f32 / f16 / bf16 array, with
// torch.argmax's rules (see argmax.h). Two vector passes: the maximum (and whether any NaN), then the first
// index holding it.
#include "argmax.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "../common/api.h"
#include "../common/thread_pool.h"

namespace llaisys::cpu::LLAISYS_ISA {

struct MaxScan {
    float max;
    bool nan;
};

template <class T>
static MaxScan max_scan(const T* v, int64_t begin, int64_t end) {
    constexpr int W = Vec::W;
    const Vec neg_inf = Vec::set1(-INFINITY);
    Vec m0 = neg_inf, m1 = neg_inf;
    Vec::Mask nan{};
    int64_t i = begin;
    for (; i + 2 * W <= end; i += 2 * W) {
        Vec a = Vec::load(v + i), b = Vec::load(v + i + W);
        nan |= isnan_mask(a) | isnan_mask(b);
        m0 = vmax(a, m0);  // a NaN lane keeps m0 (the second operand)
        m1 = vmax(b, m1);
    }
    for (; i + W <= end; i += W) {
        Vec a = Vec::load(v + i);
        nan |= isnan_mask(a);
        m0 = vmax(a, m0);
    }
    if (i < end) {
        const int rest = int(end - i);
        Vec a = select(Vec::first(rest), Vec::load_partial(v + i, rest), neg_inf);
        nan |= isnan_mask(a);
        m0 = vmax(a, m0);
    }
    return MaxScan{reduce_max(vmax(m0, m1)), bits(nan) != 0};
}

// First i in [0, n) with v[i] == target, or (target_nan) v[i] NaN; n if none.
template <class T>
static int64_t first_match(const T* v, int64_t n, float target, bool target_nan) {
    constexpr int W = Vec::W;
    const Vec t = Vec::set1(target);
    auto hits = [&](Vec a) { return target_nan ? isnan_mask(a) : eq_mask(a, t); };
    int64_t i = 0;
    for (; i + W <= n; i += W) {
        const uint32_t h = bits(hits(Vec::load(v + i)));
        if (h) return i + __builtin_ctz(h);
    }
    if (i < n) {
        const int rest = int(n - i);
        const uint32_t h = bits(hits(Vec::load_partial(v + i, rest)) & Vec::first(rest));
        if (h) return i + __builtin_ctz(h);
    }
    return n;
}

template <class T>
static int64_t argmax_of(const T* v, int64_t n) {
    constexpr int64_t kChunk = 1 << 16;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    MaxScan scan;
    if (chunks >= 16) {  // >= 1M elements: the max pass in parallel (a vocabulary row is far below)
        std::vector<MaxScan> parts(static_cast<size_t>(chunks));
        run_tasks(chunks, [&](int64_t c) { parts[c] = max_scan(v, c * kChunk, std::min(n, (c + 1) * kChunk)); });
        float best = -INFINITY;
        bool any_nan = false;
        for (const MaxScan& part : parts) {
            best = part.max > best ? part.max : best;
            any_nan = any_nan || part.nan;
        }
        scan = MaxScan{best, any_nan};
    } else {
        scan = max_scan(v, 0, n);
    }
    const int64_t i = first_match(v, n, scan.max, scan.nan);
    return i < n ? i : 0;  // not reached: n >= 1 and the maximum is in the array
}

int64_t argmax(int dtype, int64_t n, const void* vals) {
    int64_t index = 0;
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        index = argmax_of(static_cast<const T*>(vals), n);
    });
    return index;
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry point, compiled once
int LLAISYS_FN(argmax)(int device, void* stream, int dtype, int64_t n, void* max_idx, void* max_val,
                       const void* vals) {
    (void)device;
    return llaisys::launch("argmax", stream, [=] {
        llaisys::require_float_dtype(dtype);
        const int64_t index = LLAISYS_PER_ISA(argmax)(dtype, n, vals);
        const size_t elem = dtype == LLAISYS_F32 ? 4 : 2;
        std::memcpy(max_val, static_cast<const char*>(vals) + size_t(index) * elem, elem);
        std::memcpy(max_idx, &index, sizeof(index));
    });
}
#endif
