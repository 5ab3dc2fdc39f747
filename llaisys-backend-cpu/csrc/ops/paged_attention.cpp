// paged_attention and paged_kv_write, their quantized-cache forms paged_attention_q and paged_kv_write_q
// (kv_quant.h; the same kernel with another cache reader) and paged_latent_attention (MLA's latent cache: the
// same kernel with the LatentKV reader). Each build instantiates paged_attention.h with its
// tile shapes (8-lane vectors everywhere: one vector type keeps results batch-invariant, and on Zen 4 ymm lanes
// give as many FLOPs per cycle as zmm); the portable build also holds the exported entry points, which check the index
// data the kernels read (offsets, lengths, block ids, slots) before touching memory.
#include "paged_attention.h"

#include <cstring>
#include <string>
#include <vector>

#include "../common/api.h"
#include "../common/cpu_features.h"
#include "../common/thread_pool.h"

namespace llaisys::cpu::LLAISYS_ISA {

namespace {
// Register tiles for MB = 1, 2, 4 vectors of queries (index log2 MB): KR keys x MB for the scores, R value
// columns x MB for P V (see qk_tile / pv_tile in self_attention.h).
struct PagedShapes {
#if defined(LLAISYS_ISA_AVX512)
    static constexpr int kMaxMB = 4;  // 32 registers: 24 accumulators + 4 query vectors + 1 broadcast
    static constexpr int kr[3] = {16, 12, 6}, r[3] = {24, 12, 6};
#elif defined(LLAISYS_ISA_AVX2)
    static constexpr int kMaxMB = 2;  // 16 registers
    static constexpr int kr[3] = {12, 6, 6}, r[3] = {12, 6, 6};
#else
    static constexpr int kMaxMB = 1;
    static constexpr int kr[3] = {4, 4, 4}, r[3] = {4, 4, 4};
#endif
};
}  // namespace

void paged_attention(int dtype, const PagedProblem& p) {
    with_float_type(dtype, [&](auto tag) { paged_attention_any_cache<Vec8, PagedShapes, decltype(tag)>(p); });
}

}  // namespace llaisys::cpu::LLAISYS_ISA

#if defined(LLAISYS_ISA_PORTABLE)  // the exported entry points, compiled once
namespace {

using llaisys::InvalidArgument;

void need(bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument(what);
}

// The data contract of backend.h: sequences' rows in order inside [0, T), lengths within the block
// tables, and in-range block ids wherever a sequence with queries reads.
void check_batch(const llaisys::cpu::attn::PagedProblem& p) {
    const int32_t* qs = p.query_start;
    need(qs[0] >= 0, "query_start[0] = " + std::to_string(qs[0]) + " is negative");
    const int64_t capacity = p.max_blocks * p.block_size;
    for (int64_t s = 0; s < p.num_seqs; ++s) {
        const int64_t L = int64_t(qs[s + 1]) - qs[s], S = p.seq_lens[s];
        need(L >= 0, "query_start is not ascending at sequence " + std::to_string(s) + " (" + std::to_string(qs[s]) +
                         " then " + std::to_string(qs[s + 1]) + ")");
        need(S >= 0 && S <= capacity, "seq_lens[" + std::to_string(s) + "] = " + std::to_string(S) +
                                          " is outside [0, max_blocks * block_size = " + std::to_string(capacity) + "]");
        need(L <= S, "sequence " + std::to_string(s) + " has " + std::to_string(L) + " query rows but only " +
                         std::to_string(S) + " keys (seq_lens)");
        need(S <= (int64_t(1) << 24), "seq_lens[" + std::to_string(s) + "] = " + std::to_string(S) +
                                          " exceeds the supported 16777216 keys");
        if (L == 0) continue;
        const int32_t* bt = p.block_tables + s * p.max_blocks;
        for (int64_t b = 0, nb = (S + p.block_size - 1) / p.block_size; b < nb; ++b)
            need(bt[b] >= 0 && bt[b] < p.num_blocks, "block_tables[" + std::to_string(s) + ", " + std::to_string(b) +
                                                         "] = " + std::to_string(bt[b]) + " is not a block in [0, " +
                                                         std::to_string(p.num_blocks) + ")");
    }
    need(qs[p.num_seqs] <= p.T, "query_start[num_seqs] = " + std::to_string(qs[p.num_seqs]) + " exceeds the " +
                                    std::to_string(p.T) + " query rows");
}

// numerics=hf: HF's attention rounding (self_attention.h, kHf) over each sequence's keys gathered into one
// contiguous run. The hf kernel's result for a query depends only on its row and its keys (key blocks
// counted from key 0, no key split), so the batch stays invisible here too; the gather costs one more pass
// over the keys, which only this opt-in mode pays. With a window the run starts at the block of 512 keys
// (kHfBlockKeys, counted from key 0) that holds the first query's first key, so that the blocks keep their
// bounds; the blocks before it hold no key of any query of the sequence, and the keys of that block before
// the first query's window are zeros (masked for every query: they are not read from the cache).
void paged_attention_hf(int dtype, const llaisys::cpu::attn::PagedProblem& p) {
    const size_t elem = dtype == LLAISYS_F32 ? 4 : 2;
    const size_t krow = size_t(p.Hkv * p.d) * elem, vrow = size_t(p.Hkv * p.dv) * elem;
    constexpr int64_t kBlock = 512;  // self_attention.h's kHfBlockKeys
    std::vector<char> keys, values;
    for (int64_t s = 0; s < p.num_seqs; ++s) {
        const int64_t q0 = p.query_start[s], L = int64_t(p.query_start[s + 1]) - q0, S = p.seq_lens[s];
        if (L == 0) continue;
        const int64_t first_pos = S - L;  // the first query's position
        const int64_t first = p.window > 0 && first_pos >= p.window ? first_pos - p.window + 1 : 0;
        const int64_t k0 = first / kBlock * kBlock;
        keys.assign(size_t(S - k0) * krow, 0);
        values.assign(size_t(S - k0) * vrow, 0);
        const int32_t* bt = p.block_tables + s * p.max_blocks;
        for (int64_t j = first; j < S; ++j) {
            const size_t row = size_t(bt[j / p.block_size]) * size_t(p.block_size) + size_t(j % p.block_size);
            std::memcpy(keys.data() + size_t(j - k0) * krow, static_cast<const char*>(p.k_cache) + row * krow, krow);
            std::memcpy(values.data() + size_t(j - k0) * vrow, static_cast<const char*>(p.v_cache) + row * vrow, vrow);
        }
        // (positions shift by k0 on both sides: the window's bounds p - window < j <= p shift with them)
        LLAISYS_PER_ISA(self_attention)(
            dtype, true, llaisys::cpu::attn::Problem{L, S - k0, p.H, p.Hkv, p.d, p.dv, p.scale,
                                                     static_cast<char*>(p.out) + size_t(q0 * p.H * p.dv) * elem,
                                                     static_cast<const char*>(p.q) + size_t(q0 * p.H * p.d) * elem,
                                                     keys.data(), values.data(), p.window});
    }
}

// The value-lanes decode form (paged_attention.h), read at each call so that one process can time or test the
// two forms side by side: LLAISYS_CPU_PAGED_VALUE_LANES=0 keeps every tile in the query-lanes form (same bits).
bool value_lanes() { return llaisys::cpu::env_switch_on("LLAISYS_CPU_PAGED_VALUE_LANES"); }

}  // namespace

using namespace llaisys;

int LLAISYS_FN(paged_attention)(int device, void* stream, int dtype, int numerics, int64_t T, int64_t num_seqs,
                                int64_t H, int64_t Hkv, int64_t d, int64_t dv, int64_t num_blocks, int64_t block_size,
                                int64_t max_blocks, int64_t window, double scale, void* out, const void* q,
                                const void* k_cache,
                                const void* v_cache, const void* block_tables, const void* seq_lens,
                                const void* query_start) {
    (void)device;
    return launch("paged_attention", stream, [=] {
        const bool hf = hf_numerics(numerics) && dtype != LLAISYS_F32;  // f32: nothing to round, the exact mode
        require_float_dtype(dtype);
        if (T == 0 || H == 0 || dv == 0) return;
        if (window < 0) throw InvalidArgument("window = " + std::to_string(window) + " is negative");
        const cpu::attn::PagedProblem p{T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window,
                                        float(scale), out, q, k_cache, v_cache,
                                        static_cast<const int32_t*>(block_tables),
                                        static_cast<const int32_t*>(seq_lens),
                                        static_cast<const int32_t*>(query_start), 0, nullptr, nullptr, value_lanes()};
        check_batch(p);
        if (hf) {
            // rows outside every sequence are 0, as the exact kernel leaves them
            const size_t elem = dtype == LLAISYS_F32 ? 4 : 2, row = size_t(H * dv) * elem;
            std::memset(out, 0, size_t(p.query_start[0]) * row);
            std::memset(static_cast<char*>(out) + size_t(p.query_start[num_seqs]) * row, 0,
                        size_t(T - p.query_start[num_seqs]) * row);
            paged_attention_hf(dtype, p);
        } else {
            LLAISYS_PER_ISA(paged_attention)(dtype, p);
        }
    });
}

int LLAISYS_FN(paged_kv_write)(int device, void* stream, int dtype, int64_t T, int64_t Hkv, int64_t d, int64_t dv,
                               int64_t num_slots, void* k_cache, void* v_cache, const void* k, const void* v,
                               const void* slot_mapping) {
    (void)device;
    return launch("paged_kv_write", stream, [=] {
        require_float_dtype(dtype);
        const int64_t* slots = static_cast<const int64_t*>(slot_mapping);
        for (int64_t t = 0; t < T; ++t)
            need(slots[t] < num_slots, "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slots[t]) +
                                           " is past the cache's " + std::to_string(num_slots) + " slots");
        const size_t elem = dtype == LLAISYS_F32 ? 4 : 2;
        const size_t krow = size_t(Hkv * d) * elem, vrow = size_t(Hkv * dv) * elem;
        char* kc = static_cast<char*>(k_cache);
        char* vc = static_cast<char*>(v_cache);
        const char* ks = static_cast<const char*>(k);
        const char* vs = static_cast<const char*>(v);
        llaisys::cpu::LLAISYS_ISA::run_ranges(T, [&](int64_t t_begin, int64_t t_end) {
            for (int64_t t = t_begin; t < t_end; ++t) {
                if (slots[t] < 0) continue;
                std::memcpy(kc + size_t(slots[t]) * krow, ks + size_t(t) * krow, krow);
                std::memcpy(vc + size_t(slots[t]) * vrow, vs + size_t(t) * vrow, vrow);
            }
        }, T * int64_t(krow + vrow) >= (int64_t(1) << 20));
    });
}

namespace {

void require_kv_format(int kv_format) {
    if (kv_format != LLAISYS_KV_INT8 && kv_format != LLAISYS_KV_FP8_E4M3)
        throw NotSupported("kv_format " + std::to_string(kv_format) + " is not supported");
}

// Quantizes token t's rows of k [T, Hkv, d] and v [T, Hkv, dv] (element type X) into slot `slot` of the byte
// caches and their scales [num_slots, Hkv].
template <int Fmt, class X>
void quantize_token(int64_t t, int64_t slot, int64_t Hkv, int64_t d, int64_t dv, uint8_t* kc, uint8_t* vc,
                    f16_t* ks, f16_t* vs, const X* k, const X* v) {
    using llaisys::cpu::LLAISYS_ISA::kvq::quantize_row;
    for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t src = t * Hkv + g, dst = slot * Hkv + g;
        quantize_row<Fmt>(k + src * d, d, kc + dst * d, ks + dst);
        quantize_row<Fmt>(v + src * dv, dv, vc + dst * dv, vs + dst);
    }
}

}  // namespace

int LLAISYS_FN(paged_kv_write_q)(int device, void* stream, int dtype, int kv_format, int64_t T, int64_t Hkv,
                                 int64_t d, int64_t dv, int64_t num_slots, void* k_cache, void* v_cache,
                                 void* k_scale, void* v_scale, const void* k, const void* v,
                                 const void* slot_mapping) {
    (void)device;
    return launch("paged_kv_write_q", stream, [=] {
        require_float_dtype(dtype);
        require_kv_format(kv_format);
        const int64_t* slots = static_cast<const int64_t*>(slot_mapping);
        for (int64_t t = 0; t < T; ++t)  // (all checked before anything is written)
            need(slots[t] < num_slots, "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slots[t]) +
                                           " is past the cache's " + std::to_string(num_slots) + " slots");
        auto* kc = static_cast<uint8_t*>(k_cache);
        auto* vc = static_cast<uint8_t*>(v_cache);
        auto* ks = static_cast<f16_t*>(k_scale);
        auto* vs = static_cast<f16_t*>(v_scale);
        const bool parallel = T * Hkv * (d + dv) >= (int64_t(1) << 18);
        cpu::LLAISYS_ISA::with_float_type(dtype, [&](auto tag) {
            using X = decltype(tag);
            const X* kx = static_cast<const X*>(k);
            const X* vx = static_cast<const X*>(v);
            auto write = [&](auto fmt) {
                cpu::LLAISYS_ISA::run_ranges(T, [&](int64_t t_begin, int64_t t_end) {
                    for (int64_t t = t_begin; t < t_end; ++t)
                        if (slots[t] >= 0)
                            quantize_token<decltype(fmt)::value>(t, slots[t], Hkv, d, dv, kc, vc, ks, vs, kx, vx);
                }, parallel);
            };
            if (kv_format == LLAISYS_KV_INT8) write(std::integral_constant<int, LLAISYS_KV_INT8>{});
            else write(std::integral_constant<int, LLAISYS_KV_FP8_E4M3>{});
        });
    });
}

int LLAISYS_FN(paged_attention_q)(int device, void* stream, int dtype, int kv_format, int64_t T, int64_t num_seqs,
                                  int64_t H, int64_t Hkv, int64_t d, int64_t dv, int64_t num_blocks,
                                  int64_t block_size, int64_t max_blocks, int64_t window, double scale, void* out,
                                  const void* q, const void* k_cache, const void* v_cache, const void* k_scale,
                                  const void* v_scale, const void* block_tables, const void* seq_lens,
                                  const void* query_start) {
    (void)device;
    return launch("paged_attention_q", stream, [=] {
        require_float_dtype(dtype);
        require_kv_format(kv_format);
        if (T == 0 || H == 0 || dv == 0) return;
        if (window < 0) throw InvalidArgument("window = " + std::to_string(window) + " is negative");
        const cpu::attn::PagedProblem p{T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window,
                                        float(scale), out, q, k_cache, v_cache,
                                        static_cast<const int32_t*>(block_tables),
                                        static_cast<const int32_t*>(seq_lens),
                                        static_cast<const int32_t*>(query_start), kv_format, k_scale, v_scale,
                                        value_lanes()};
        check_batch(p);
        LLAISYS_PER_ISA(paged_attention)(dtype, p);
    });
}
int LLAISYS_FN(paged_latent_attention)(int device, void* stream, int dtype, int64_t T, int64_t num_seqs, int64_t H,
                                       int64_t dc, int64_t dr, int64_t num_blocks, int64_t block_size,
                                       int64_t max_blocks, double scale, void* out, const void* q,
                                       const void* c_cache, const void* r_cache, const void* block_tables,
                                       const void* seq_lens, const void* query_start) {
    (void)device;
    return launch("paged_latent_attention", stream, [=] {
        require_float_dtype(dtype);
        if (T == 0 || H == 0 || dc == 0) return;
        cpu::attn::PagedProblem p{T, num_seqs, H, 1, dc + dr, dc, num_blocks, block_size, max_blocks, 0,
                                  float(scale), out, q, c_cache, r_cache,
                                  static_cast<const int32_t*>(block_tables), static_cast<const int32_t*>(seq_lens),
                                  static_cast<const int32_t*>(query_start), 0, nullptr, nullptr, value_lanes()};
        p.latent = true;
        check_batch(p);
        LLAISYS_PER_ISA(paged_attention)(dtype, p);
    });
}
#endif
