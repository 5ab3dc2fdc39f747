// paged_attention and paged_kv_write: the exported entry points. They check the index data the kernels
// read (offsets, lengths, block ids, slots) before touching memory; the attention itself is in
// paged_attention.h, instantiated per instruction set next to self_attention's.
#include "paged_attention.h"

#include <cmath>
#include <cstring>
#include <string>

#include "../common/api.h"
#include "../common/cpu_features.h"

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

}  // namespace

using namespace llaisys;

int LLAISYS_FN(paged_attention)(int device, void* stream, int dtype, int numerics, int64_t T, int64_t num_seqs,
                                int64_t H, int64_t Hkv, int64_t d, int64_t dv, int64_t num_blocks, int64_t block_size,
                                int64_t max_blocks, double scale, void* out, const void* q, const void* k_cache,
                                const void* v_cache, const void* block_tables, const void* seq_lens,
                                const void* query_start) {
    (void)device; (void)stream;
    return guard("paged_attention", [&] {
        require_exact_numerics(numerics);
        if (dtype != kF32 && dtype != kF16 && dtype != kBF16) unsupported_dtype(dtype);
        if (T == 0 || H == 0 || dv == 0) return;
        const cpu::attn::PagedProblem p{T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, float(scale),
                                        out, q, k_cache, v_cache, static_cast<const int32_t*>(block_tables),
                                        static_cast<const int32_t*>(seq_lens), static_cast<const int32_t*>(query_start)};
        check_batch(p);
        switch (cpu::simd_level()) {
            case cpu::Simd::kAvx512: cpu::attn::run_paged_avx512(dtype, p); break;
            case cpu::Simd::kAvx2: cpu::attn::run_paged_avx2(dtype, p); break;
            default: cpu::attn::run_paged_portable(dtype, p); break;
        }
    });
}

int LLAISYS_FN(paged_kv_write)(int device, void* stream, int dtype, int64_t T, int64_t Hkv, int64_t d, int64_t dv,
                               int64_t num_slots, void* k_cache, void* v_cache, const void* k, const void* v,
                               const void* slot_mapping) {
    (void)device; (void)stream;
    return guard("paged_kv_write", [&] {
        if (dtype != kF32 && dtype != kF16 && dtype != kBF16) unsupported_dtype(dtype);
        const int64_t* slots = static_cast<const int64_t*>(slot_mapping);
        for (int64_t t = 0; t < T; ++t)
            need(slots[t] < num_slots, "slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slots[t]) +
                                           " is past the cache's " + std::to_string(num_slots) + " slots");
        const size_t elem = dtype == kF32 ? 4 : 2;
        const size_t krow = size_t(Hkv * d) * elem, vrow = size_t(Hkv * dv) * elem;
        char* kc = static_cast<char*>(k_cache);
        char* vc = static_cast<char*>(v_cache);
        const char* ks = static_cast<const char*>(k);
        const char* vs = static_cast<const char*>(v);
#pragma omp parallel for schedule(static) if (T * int64_t(krow + vrow) >= (int64_t(1) << 20))
        for (int64_t t = 0; t < T; ++t) {
            if (slots[t] < 0) continue;
            std::memcpy(kc + size_t(slots[t]) * krow, ks + size_t(t) * krow, krow);
            std::memcpy(vc + size_t(slots[t]) * vrow, vs + size_t(t) * vrow, vrow);
        }
    });
}
