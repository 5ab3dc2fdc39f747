// rope: rotary position embedding, half-split (rotate_half) layout, on x [seq, heads, d] with int64 positions:
//     for j < d/2:  out[j]       = x[j] cos(a) - x[j + d/2] sin(a)
//                   out[j + d/2] = x[j + d/2] cos(a) + x[j] sin(a),      a = pos * inv_freq[j]
// The cos/sin table is built once per call for each (position, j), shared by all heads, with the angle
// computed the way HF transformers does (Qwen2RotaryEmbedding) so that models match HF: inv_freq is the
// caller's f32 table (1 / theta^((2j)/d), or a rope-scaling variant), a = float(pos) * inv_freq in f32.
// cos/sin of that f32 angle are evaluated in double, rounded to f32 (HF: Sleef f32, within 1 ulp) and
// multiplied by the f32 scale (YaRN's attention factor, else 1: HF's cos() * attention_scaling).
// The rotation is done in f32 with the two products rounded separately (no FMA, as torch's
// x * cos + rotate_half(x) * sin does in f32) and one final rounding to the dtype. For f16 / bf16, HF
// also rounds cos/sin and each product to the model dtype: LLAISYS_NUMERICS_HF does the same,
//     out = R(R(x cos') + R(rotate_half(x) sin')),   cos' = R(cos), sin' = R(sin),  R = round to the dtype
// (the negation in rotate_half is exact). The exact mode does not, because those roundings cost up to ~3
// ulp against the exact result, beyond the DESIGN §6 tolerance (measured: 0.031 abs in bf16 at Qwen2
// shapes), while a single rounding stays within it. For f32 both modes are the same.
//
// The table depends only on (inv_freq, scale, positions); a model applies rope to q and k of every layer
// with the same positions, so the entry point keeps the last table per thread and reuses it when those
// match (HF likewise computes cos/sin once per forward).
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../common/api.h"
#include "../common/thread_pool.h"
#include "../simd/simd.h"

// table: [seq][2][d/2] f32, cos then sin for each position.
LLAISYS_DECLARE_PER_ISA(void rope_table(int64_t seq, int64_t half, const float* inv_freq, float scale,
                                        const int64_t* pos_ids, float* table))
LLAISYS_DECLARE_PER_ISA(void rope(int dtype, bool hf, int64_t seq, int64_t heads, int64_t head_dim,
                                  const float* table, void* out, const void* x))

namespace llaisys::cpu::LLAISYS_ISA {

// |angle| below this is reduced exactly by the two-part pi/2 of sincos_row (|k| < 2^20).
constexpr double kRopeFastAngle = 1.6e6;

// cos and sin of the f32 angles p * inv_freq[j] (f32 product, as HF), evaluated in double and rounded
// to f32 (correctly rounded but for ~1e-9 of the cases), times scale in f32. Branch-free so that the compiler vectorises it
// (8 doubles per AVX-512 register): reduction by k * pi/2 with pi/2 split into a 33-bit head and a tail
// (exact for |angle| < kRopeFastAngle; rope_table redoes larger angles with the C library), then
// fdlibm's minimax polynomials on [-pi/4, pi/4].
static void sincos_row(float p, const float* inv_freq, float scale, int64_t half, float* cos_out, float* sin_out) {
#pragma omp simd
    for (int64_t j = 0; j < half; ++j) {
        const double x = double(p * inv_freq[j]);
        // t = x 2/pi + 1.5 * 2^52 holds k = rint(x 2/pi) in its low mantissa bits (two's complement)
        const double t = x * 6.36619772367581382433e-01 + 6755399441055744.0;
        const double k = t - 6755399441055744.0;
        const double r = (x - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11;
        uint64_t t_bits;
        std::memcpy(&t_bits, &t, sizeof(t_bits));
        const uint64_t q = t_bits & 3;  // k mod 4
        const double z = r * r;
        const double sin_r = r + r * z * (-1.66666666666666324348e-01 +
            z * (8.33333333332248946124e-03 + z * (-1.98412698298579493134e-04 + z * (2.75573137070700676789e-06 +
            z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10)))));
        const double cos_r = 1.0 - (0.5 * z - z * z * (4.16666666666666019037e-02 +
            z * (-1.38888888888741095749e-03 + z * (2.48015872894767294178e-05 + z * (-2.75573143513906633035e-07 +
            z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11))))));
        // quadrant q = k mod 4: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s)
        const double s = (q & 1) ? cos_r : sin_r, c = (q & 1) ? sin_r : cos_r;
        const double sin_sign = (q & 2) ? -1.0 : 1.0, cos_sign = ((q + 1) & 2) ? -1.0 : 1.0;
        sin_out[j] = float(s * sin_sign) * scale;
        cos_out[j] = float(c * cos_sign) * scale;
    }
}

void rope_table(int64_t seq, int64_t half, const float* inv_freq, float scale, const int64_t* pos_ids,
                float* table) {
    run_ranges(seq, [&](int64_t s_begin, int64_t s_end) {
        for (int64_t s = s_begin; s < s_end; ++s) {
            const float p = float(pos_ids[s]);  // position_ids.float()
            float* c = table + s * 2 * half;
            sincos_row(p, inv_freq, scale, half, c, c + half);
            for (int64_t j = 0; j < half; ++j) {
                const double x = double(p * inv_freq[j]);
                if (!(std::fabs(x) < kRopeFastAngle)) {  // huge, inf or NaN: the C library reduces exactly
                    c[j] = float(std::cos(x)) * scale;
                    c[half + j] = float(std::sin(x)) * scale;
                }
            }
        }
    }, seq > 1 && seq * half >= 8192);
}

// The rotated halves (o1, o2) of x1 = x[j..], x2 = x[half + j..] with cos / sin lanes c, s: the products
// rounded separately (torch: x * cos + rotate_half(x) * sin), and with kHf also cos, sin and each product
// rounded to T (the store rounds the sum).
template <class T, bool kHf>
static LLAISYS_ALWAYS_INLINE void rotate(Vec x1, Vec x2, Vec c, Vec s, Vec& o1, Vec& o2) {
    if constexpr (kHf) {
        c = c.template round_to<T>(), s = s.template round_to<T>();
        o1 = mul_unfused(x1, c).template round_to<T>() - mul_unfused(x2, s).template round_to<T>();
        o2 = mul_unfused(x2, c).template round_to<T>() + mul_unfused(x1, s).template round_to<T>();
    } else {
        o1 = mul_unfused(x1, c) - mul_unfused(x2, s), o2 = mul_unfused(x2, c) + mul_unfused(x1, s);
    }
}

template <class T, bool kHf>
static void rope_row(int64_t half, const float* cos_row, const float* sin_row, T* out, const T* x) {
    constexpr int W = Vec::W;
    int64_t j = 0;
    Vec o1, o2;
    for (; j + W <= half; j += W) {
        // both halves are read before either is written, so out may alias x
        rotate<T, kHf>(Vec::load(x + j), Vec::load(x + half + j), Vec::load(cos_row + j), Vec::load(sin_row + j),
                       o1, o2);
        o1.store(out + j);
        o2.store(out + half + j);
    }
    if (j < half) {
        const int rest = int(half - j);
        rotate<T, kHf>(Vec::load_partial(x + j, rest), Vec::load_partial(x + half + j, rest),
                       Vec::load_partial(cos_row + j, rest), Vec::load_partial(sin_row + j, rest), o1, o2);
        o1.store_partial(out + j, rest);
        o2.store_partial(out + half + j, rest);
    }
}

template <class T, bool kHf>
static void rope_rows(int64_t seq, int64_t heads, int64_t head_dim, const float* table, T* out, const T* x) {
    const int64_t half = head_dim / 2, rows = seq * heads;
    run_ranges(rows, [&](int64_t row_begin, int64_t row_end) {
        for (int64_t row = row_begin; row < row_end; ++row) {
            const float* cos_row = table + (row / heads) * 2 * half;
            rope_row<T, kHf>(half, cos_row, cos_row + half, out + row * head_dim, x + row * head_dim);
        }
    }, rows > 1 && rows * head_dim >= kParallelGrain);
}

void rope(int dtype, bool hf, int64_t seq, int64_t heads, int64_t head_dim, const float* table, void* out,
          const void* x) {
    with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        T* o = static_cast<T*>(out);
        const T* xs = static_cast<const T*>(x);
        if (hf && !std::is_same_v<T, float>)  // (in f32 the HF roundings are the f32 ones the exact mode does)
            rope_rows<T, true>(seq, heads, head_dim, table, o, xs);
        else
            rope_rows<T, false>(seq, heads, head_dim, table, o, xs);
    });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the table cache and the exported entry point, compiled once
namespace {

struct RopeTable {
    float scale = 0;
    std::vector<float> inv_freq;  // [head_dim / 2]; empty: no table yet
    std::vector<int64_t> positions;
    std::vector<float> table;  // [seq][2][head_dim / 2]

    bool matches(const float* freq, int64_t half, float s, int64_t seq, const int64_t* pos) const {
        return s == scale && int64_t(inv_freq.size()) == half && int64_t(positions.size()) == seq &&
               std::memcmp(inv_freq.data(), freq, sizeof(float) * size_t(half)) == 0 &&
               std::memcmp(positions.data(), pos, sizeof(int64_t) * size_t(seq)) == 0;
    }
};

const float* cos_sin_table(int64_t seq, int64_t head_dim, const float* inv_freq, float scale, const int64_t* pos_ids) {
    thread_local RopeTable cache;
    const int64_t half = head_dim / 2;
    if (!cache.matches(inv_freq, half, scale, seq, pos_ids)) {
        cache.inv_freq.clear();  // invalid until filled (an exception below leaves it so)
        cache.table.resize(size_t(seq) * size_t(head_dim));
        LLAISYS_PER_ISA(rope_table)(seq, half, inv_freq, scale, pos_ids, cache.table.data());
        cache.positions.assign(pos_ids, pos_ids + seq);
        cache.scale = scale;
        cache.inv_freq.assign(inv_freq, inv_freq + half);
    }
    return cache.table.data();
}

}  // namespace

int LLAISYS_FN(rope)(int device, void* stream, int dtype, int numerics, int64_t seq, int64_t heads, int64_t head_dim,
                     double scale, void* out, const void* x, const void* pos_ids, const void* inv_freq) {
    (void)device;
    return llaisys::launch("rope", stream, [=] {
        const bool hf = llaisys::hf_numerics(numerics);
        llaisys::require_float_dtype(dtype);
        if (seq == 0 || heads == 0 || head_dim == 0) return;  // nothing to rotate
        const float* table = cos_sin_table(seq, head_dim, static_cast<const float*>(inv_freq), float(scale),
                                           static_cast<const int64_t*>(pos_ids));
        LLAISYS_PER_ISA(rope)(dtype, hf, seq, heads, head_dim, table, out, x);
    });
}
#endif
