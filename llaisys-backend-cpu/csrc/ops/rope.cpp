// rope: rotary position embedding (half-split layout) on x [seq, heads, head_dim] with int64 positions.
// This file holds the portable build of rope_kernel.h and the exported entry point: it computes HF's
// f32 inv_freq, gets the cos/sin table (see rope_kernel.h) and runs the rotation for the run-time SIMD
// level. The table depends only on (theta, head_dim, positions); a model applies rope to q and k of every
// layer with the same positions, so the last table is kept per thread and reused when those match
// (HF likewise computes cos/sin once per forward).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "rope_kernel.h"

namespace llaisys::cpu::portable {
void rope_table(int64_t seq, int64_t half, const float* inv_freq, const int64_t* pos_ids, float* table) {
    rope_table_kernel(seq, half, inv_freq, pos_ids, table);
}
void rope(int dtype, int64_t seq, int64_t heads, int64_t head_dim, const float* table, void* out, const void* x) {
    rope_kernel(dtype, seq, heads, head_dim, table, out, x);
}
}  // namespace llaisys::cpu::portable

namespace {

struct RopeTable {
    double theta = 0;
    int64_t head_dim = -1;
    std::vector<int64_t> positions;
    std::vector<float> table;  // [seq][2][head_dim / 2]

    bool matches(double t, int64_t d, int64_t seq, const int64_t* pos) const {
        return t == theta && d == head_dim && int64_t(positions.size()) == seq &&
               std::memcmp(positions.data(), pos, sizeof(int64_t) * size_t(seq)) == 0;
    }
};

// inv_freq = 1 / theta^(arange(0, d, 2) / d), each step rounded to f32 as torch does in HF's
// Qwen2RotaryEmbedding (the power is correctly rounded here; torch's Sleef powf may differ by 1 ulp
// for a few j, e.g. j = 37 of d = 128, theta = 1e6: an angle difference of ~3e-11 * pos).
std::vector<float> inverse_frequencies(int64_t head_dim, double theta) {
    const int64_t half = head_dim / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half));
    const float base = float(theta);  // theta ** tensor: the Python float becomes an f32 scalar
    for (int64_t j = 0; j < half; ++j) {
        const float exponent = float(2 * j) / float(head_dim);
        const float power = float(std::pow(double(base), double(exponent)));
        inv_freq[size_t(j)] = 1.0f / power;
    }
    return inv_freq;
}

const float* cos_sin_table(int64_t seq, int64_t head_dim, double theta, const int64_t* pos_ids) {
    thread_local RopeTable cache;
    if (!cache.matches(theta, head_dim, seq, pos_ids)) {
        const std::vector<float> inv_freq = inverse_frequencies(head_dim, theta);
        cache.head_dim = -1;  // invalid until filled (an exception below leaves it so)
        cache.table.resize(size_t(seq) * size_t(head_dim));
        LLAISYS_CALL_PER_ISA(rope_table, seq, head_dim / 2, inv_freq.data(), pos_ids, cache.table.data());
        cache.positions.assign(pos_ids, pos_ids + seq);
        cache.theta = theta;
        cache.head_dim = head_dim;
    }
    return cache.table.data();
}

}  // namespace

int LLAISYS_FN(rope)(int device, void* stream, int dtype, int numerics, int64_t seq, int64_t heads, int64_t head_dim,
                     double theta, void* out, const void* x, const void* pos_ids_ptr) {
    (void)device; (void)stream;
    const auto* pos_ids = static_cast<const int64_t*>(pos_ids_ptr);
    return llaisys::guard("rope", [&] {
        llaisys::require_exact_numerics(numerics);
        llaisys::cpu::require_float_dtype(dtype);
        if (seq < 0 || heads < 0 || head_dim < 0 || head_dim % 2)
            throw llaisys::InvalidArgument("bad shape [" + std::to_string(seq) + ", " + std::to_string(heads) + ", " +
                                           std::to_string(head_dim) + "]: the head dim must be even");
        if (!(theta > 0) || !std::isfinite(theta))
            throw llaisys::InvalidArgument("theta must be a positive finite number, got " + std::to_string(theta));
        if (seq == 0 || heads == 0 || head_dim == 0) return;
        const float* table = cos_sin_table(seq, head_dim, theta, pos_ids);
        LLAISYS_CALL_PER_ISA(rope, dtype, seq, heads, head_dim, table, out, x);
    });
}
