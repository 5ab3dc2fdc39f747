// The paged KV cache of continuous batching (see llaisys/backend.h): paged_kv_write stores a step's keys
// and values in their slots; paged_attention is causal GQA attention of several sequences at once, each
// reading its keys and values through its row of the block tables.
//
// paged_attention: one block per (query row t, kv head g), or per (t, hb of g's G heads) where the G heads do
// not fit shared memory at once. The block finds t's sequence s in query_start, holds its query heads of g (they
// share every K / V tile it loads) and walks its keys, [0, p] for the query
// at position p = i + S - L (its causal end), or with a sliding window [p - window + 1, p] (the keys before
// are never read), in tiles of BC from its first key through the block table: K tile to shared memory, scores (one thread per
// (head, key)), an online softmax per head (one warp per head), V tile, acc += P V (threads over (head,
// column)). Everything is f32; the output is rounded once. A row's result depends only on its own query,
// its position, its sequence's keys and BC (fixed by G, d, dv and the device), never on the other rows of
// the batch.
// Rows outside every sequence are set to 0.
//
// The index data (query_start, seq_lens, block ids) is read by the kernel only, so the kernel checks it:
// every block checks what it reads before reading through it, and a bad value is a kernel error (the next
// synchronizing call reports it as LLAISYS_INVALID_ARGUMENT); nothing is read outside the caches.
// paged_kv_write: one block per token; every block first checks every slot, so a slot past the cache
// writes nothing at all. No allocation, no synchronisation.
//
// The quantized caches (6.3, kv_quant.cuh: a byte per value and an f16 scale per (token, kv head) row):
// paged_attention_q is the same kernel body reading its keys and values through a cache reader (QuantCache:
// decode(byte) * scale, in f32, where PlainCache widens T), so the masks, the window, the checks and the
// arithmetic after the read are paged_attention's. paged_kv_write_q: one warp per (token, kv head), the k row
// then the v row: one warp max of |x| (as integers), the scale, then each lane encodes its values.
//
// paged_latent_attention (6.4, DeepSeek's MLA in its absorbed form) is the same kernel body again, with one kv
// head, no window and a third reader (LatentCache): key row j = concat(c[j], r[j]) (d = dc + dr), value row j
// = c[j] (dv = dc), which the K tile already holds, so no V tile is loaded. Its H query heads all share the one
// kv head: when they do not fit shared memory in one block, they are split over several blocks (a block holds
// hb heads, hb a divisor of G; each head's arithmetic is the same whatever hb, so the bits depend on BC only).
#include <algorithm>
#include <climits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"
#include "kv_quant.cuh"

namespace llaisys::cuda {
namespace {

constexpr int kThreads = 128;

// ---- paged_kv_write -----------------------------------------------------------------------------------------

// Every block checks every slot first (all threads call it): false if one is past the cache, which block 0
// reports (code: paged_kv_write's or paged_kv_write_q's), and then no block writes anything.
__device__ bool slots_in_range(int64_t n_tokens, int64_t num_slots, const int64_t* slots, KernelErrorRecord* error,
                               int code) {
    __shared__ BlockScratch<int> scratch;
    int bad = 0;
    for (int64_t t = threadIdx.x; t < n_tokens; t += blockDim.x) bad += slots[t] >= num_slots;
    if (block_sum(bad, scratch) == 0) return true;
    if (blockIdx.x == 0 && threadIdx.x == 0) {  // the first bad slot
        int64_t t = 0;
        while (slots[t] < num_slots) ++t;
        report_kernel_error(error, code, slots[t], t, num_slots);
    }
    return false;
}

template <class T>
__global__ void __launch_bounds__(kThreads) kv_write_kernel(int64_t n_tokens, int64_t k_row, int64_t v_row,
                                                           int64_t num_slots, T* k_cache, T* v_cache, const T* k,
                                                           const T* v, const int64_t* slots,
                                                           KernelErrorRecord* error) {
    if (!slots_in_range(n_tokens, num_slots, slots, error, kPagedSlotOutOfRange)) return;
    for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;  // a skipped token
        for (int64_t c = threadIdx.x; c < k_row; c += blockDim.x) k_cache[slot * k_row + c] = k[t * k_row + c];
        for (int64_t c = threadIdx.x; c < v_row; c += blockDim.x) v_cache[slot * v_row + c] = v[t * v_row + c];
    }
}

// ---- paged_kv_write_q ---------------------------------------------------------------------------------------

// One warp quantizes one row of n values (x [n] -> bytes [n], *scale), every lane of the warp calling it.
// Each lane takes the values lane, lane + WARP_SIZE, ...; the amax is exact (an integer max) whatever the order.
template <class Format, class T>
__device__ void quantize_row(int64_t n, const T* x, uint8_t* bytes, f16* scale) {
    uint32_t amax_bits = 0;
    for (int64_t c = lane_id(); c < n; c += WARP_SIZE) {
        const uint32_t bits = abs_bits(to_float(x[c]));
        amax_bits = bits > amax_bits ? bits : amax_bits;
    }
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        const uint32_t other = __shfl_xor_sync(kFullMask, amax_bits, offset, WARP_SIZE);
        amax_bits = other > amax_bits ? other : amax_bits;
    }
    const f16 s = kv_scale(__uint_as_float(amax_bits), Format::kQmax);
    const float s32 = to_float(s);
    if (lane_id() == 0) *scale = s;
    for (int64_t c = lane_id(); c < n; c += WARP_SIZE)  // a zero (or NaN) scale stores zero bytes
        bytes[c] = s32 > 0.0f ? kv_encode<Format>(to_float(x[c]), s32) : uint8_t(0);
}

// A warp per (token t, kv head h): the warps of the grid stride over the T * Hkv rows; skipped tokens (slot < 0)
// are left alone. k [T, Hkv, d] -> k_cache [num_slots, Hkv, d] + k_scale [num_slots, Hkv]; v likewise with dv.
template <class Format, class T>
__global__ void __launch_bounds__(kThreads) kv_write_q_kernel(int64_t n_tokens, int64_t Hkv, int64_t d, int64_t dv,
                                                             int64_t num_slots, uint8_t* k_cache, uint8_t* v_cache,
                                                             f16* k_scale, f16* v_scale, const T* k, const T* v,
                                                             const int64_t* slots, KernelErrorRecord* error) {
    if (!slots_in_range(n_tokens, num_slots, slots, error, kPagedQSlotOutOfRange)) return;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / WARP_SIZE);
    for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / WARP_SIZE) + warp_id(); row < n_tokens * Hkv;
         row += warps) {
        const int64_t t = row / Hkv, h = row % Hkv, slot = slots[t];  // (the same in every lane of the warp)
        if (slot < 0) continue;
        const int64_t dst = slot * Hkv + h;
        quantize_row<Format>(d, k + row * d, k_cache + dst * d, k_scale + dst);
        quantize_row<Format>(dv, v + row * dv, v_cache + dst * dv, v_scale + dst);
    }
}

// ---- paged_attention ------------------------------------------------------------------------------------------

// The error codes a kernel reports about the index data (context.cu names the op by them).
template <int QueryStart, int SeqLen, int BlockId>
struct PagedErrorCodes {
    static constexpr int kQueryStart = QueryStart, kSeqLen = SeqLen, kBlockId = BlockId;
};

// The cache readers: key(i, c) / value(i, c) is element c of cache row i = slot * Hkv + kv head, in f32.
// kValueInKey: value(i, c) is key(i, c) for c < dv (the K tile holds the values: no V tile is loaded).
// paged_attention's caches hold T [num_slots, Hkv, d | dv] (widened exactly).
template <class T>
struct PlainCache {
    using Errors = PagedErrorCodes<kPagedQueryStart, kPagedSeqLen, kPagedBlockId>;
    static constexpr bool kValueInKey = false;
    const T *k, *v;
    int64_t d, dv;
    __device__ float key(int64_t i, int64_t c) const { return to_float(k[i * d + c]); }
    __device__ float value(int64_t i, int64_t c) const { return to_float(v[i * dv + c]); }
};

// paged_attention_q's: bytes [num_slots, Hkv, d | dv] and f16 scales [num_slots, Hkv], read as decode(b) * scale.
template <class Format>
struct QuantCache {
    using Errors = PagedErrorCodes<kPagedQQueryStart, kPagedQSeqLen, kPagedQBlockId>;
    static constexpr bool kValueInKey = false;
    const uint8_t *k, *v;
    const f16 *k_scale, *v_scale;
    int64_t d, dv;
    __device__ float key(int64_t i, int64_t c) const { return kv_decode<Format>(k[i * d + c], k_scale[i]); }
    __device__ float value(int64_t i, int64_t c) const { return kv_decode<Format>(v[i * dv + c], v_scale[i]); }
};

// paged_latent_attention's: c T [num_slots, dc] and r T [num_slots, dr] (one kv head); key row i = concat(c[i],
// r[i]), value row i = c[i].
template <class T>
struct LatentCache {
    using Errors = PagedErrorCodes<kPagedLatentQueryStart, kPagedLatentSeqLen, kPagedLatentBlockId>;
    static constexpr bool kValueInKey = true;
    const T *c, *r;
    int64_t dc, dr;
    __device__ float key(int64_t i, int64_t col) const {
        return to_float(col < dc ? c[i * dc + col] : r[i * dr + (col - dc)]);
    }
    __device__ float value(int64_t i, int64_t col) const { return to_float(c[i * dc + col]); }
};

template <class T, class Cache>
struct PagedArgs {
    int64_t T_rows, num_seqs, H, Hkv, G, d, dv, num_blocks, block_size, max_blocks;
    int64_t hb;      // query heads per block: a divisor of G (the G heads of a kv head may span G / hb blocks)
    int64_t window;  // sliding window (0: none)
    int bc;  // keys per tile
    float scale;
    const T* q;
    Cache cache;  // the keys and values (PlainCache or QuantCache)
    T* out;
    const int32_t *block_tables, *seq_lens, *query_start;
    KernelErrorRecord* error;
};

// Floats of dynamic shared memory for a block of hb heads: q [hb][d], the K / V tile [bc][max(d, dv) + 1]
// (padded: threads reading different keys hit different banks), scores [hb][bc], acc [hb][dv], m / l / rescale
// [hb].
inline size_t paged_shared_bytes(int64_t hb, int64_t d, int64_t dv, int bc) {
    return size_t(hb * d + bc * (std::max(d, dv) + 1) + hb * bc + hb * dv + 3 * hb) * sizeof(float);
}

// The number of this block's threads that see a bad value, summed over the block (every thread calls it).
template <class Bad>
__device__ int count_bad(int64_t n, Bad bad, BlockScratch<int>& scratch) {
    int count = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) count += bad(i) ? 1 : 0;
    return block_sum(count, scratch);
}

template <class T, class Cache>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(PagedArgs<T, Cache> a) {
    using Errors = typename Cache::Errors;
    __shared__ BlockScratch<int> scratch;
    LLAISYS_DYNAMIC_SHARED(float, shared);
    const int tid = int(threadIdx.x);
    // this block: query row t, its heads [h0, h0 + G) (G = hb of them), all of kv head g
    const int64_t t = blockIdx.x, h0 = int64_t(blockIdx.y) * a.hb, g = h0 / a.G, G = a.hb, d = a.d, dv = a.dv;
    const bool reporter = t == 0 && blockIdx.y == 0 && tid == 0;  // one block reports errors about the whole batch
    const int32_t* qs = a.query_start;
    const int64_t capacity = a.max_blocks * a.block_size;

    // The batch's offsets and lengths (every block reads them to find its sequence).
    auto bad_offset = [&](int64_t s) { return qs[s] < (s == 0 ? 0 : qs[s - 1]) || qs[s] > a.T_rows; };
    if (count_bad(a.num_seqs + 1, bad_offset, scratch)) {
        if (reporter) {
            int64_t s = 0;
            while (!bad_offset(s)) ++s;
            report_kernel_error(a.error, Errors::kQueryStart, qs[s], s, a.T_rows);
        }
        return;
    }
    auto bad_length = [&](int64_t s) { return a.seq_lens[s] < qs[s + 1] - qs[s] || a.seq_lens[s] > capacity; };
    if (count_bad(a.num_seqs, bad_length, scratch)) {
        if (reporter) {
            int64_t s = 0;
            while (!bad_length(s)) ++s;
            report_kernel_error(a.error, Errors::kSeqLen, a.seq_lens[s], s, capacity);
        }
        return;
    }

    // Row t's sequence: the last s with qs[s] <= t (rows of empty sequences belong to the next one).
    int64_t lo = 0, hi = a.num_seqs;  // qs[lo] <= t < qs[hi] once t is inside [qs[0], qs[num_seqs])
    T* out = a.out + (t * a.H + h0) * dv;
    if (t < qs[0] || t >= qs[a.num_seqs]) {
        for (int64_t p = tid; p < G * dv; p += blockDim.x) out[p] = from_float<T>(0.0f);
        return;
    }
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (qs[mid] <= t) lo = mid;
        else hi = mid;
    }
    const int64_t s = lo, L = qs[s + 1] - qs[s], S = a.seq_lens[s];
    const int32_t* table = a.block_tables + s * a.max_blocks;
    const int64_t n_table = (S + a.block_size - 1) / a.block_size;
    auto bad_block = [&](int64_t b) { return table[b] < 0 || table[b] >= a.num_blocks; };
    if (count_bad(n_table, bad_block, scratch)) {  // (every block of the sequence: one report wins)
        if (tid == 0) {
            int64_t b = 0;
            while (!bad_block(b)) ++b;
            report_kernel_error(a.error, Errors::kBlockId, table[b], s * a.max_blocks + b, a.num_blocks);
        }
        return;
    }

    const int dmax = int(d > dv ? d : dv), stride = dmax + 1, bc = a.bc;
    float* q_s = shared;
    float* kv_s = q_s + G * d;
    float* s_s = kv_s + bc * stride;
    float* acc_s = s_s + G * bc;
    float* m_s = acc_s + G * dv;
    float* l_s = m_s + G;
    float* rescale_s = l_s + G;

    const T* q = a.q + (t * a.H + h0) * d;  // the heads of kv head g are consecutive
    for (int64_t p = tid; p < G * d; p += blockDim.x) q_s[p] = to_float(q[p]);
    for (int64_t p = tid; p < G * dv; p += blockDim.x) acc_s[p] = 0.0f;
    for (int64_t r = tid; r < G; r += blockDim.x) {
        m_s[r] = -INFINITY;
        l_s[r] = 0.0f;
    }
    const int64_t pos = (t - qs[s]) + S - L, n_keys = pos + 1;  // query i sees keys j <= i + S - L
    const int64_t first = a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;  // and j > pos - window
    auto row_of = [&](int64_t j) { return int64_t(table[j / a.block_size]) * a.block_size + j % a.block_size; };
    __syncthreads();

    for (int64_t k0 = first; k0 < n_keys; k0 += bc) {
        const int nk = int(n_keys - k0 < bc ? n_keys - k0 : bc);
        for (int64_t p = tid; p < int64_t(nk) * d; p += blockDim.x) {
            const int64_t j = p / d, c = p % d;
            kv_s[j * stride + c] = a.cache.key(row_of(k0 + j) * a.Hkv + g, c);
        }
        __syncthreads();
        for (int64_t p = tid; p < G * bc; p += blockDim.x) {  // scores; keys past the tile's end are -inf
            const int64_t r = p / bc, j = p % bc;
            float score = -INFINITY;
            if (j < nk) {
                const float* qr = q_s + r * d;
                const float* kr = kv_s + j * stride;
                float dot = 0.0f;
                for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
                score = dot * a.scale;
            }
            s_s[p] = score;
        }
        __syncthreads();
        for (int64_t r = warp_id(); r < G; r += blockDim.x / WARP_SIZE) {  // online softmax, one warp per head
            float* sr = s_s + r * bc;
            float tile_max = -INFINITY;
            for (int j = lane_id(); j < bc; j += WARP_SIZE) tile_max = fmaxf(tile_max, sr[j]);
            tile_max = warp_max(tile_max);
            const float m_old = m_s[r], m_new = fmaxf(m_old, tile_max);  // finite: every tile has a key
            float sum = 0.0f;
            for (int j = lane_id(); j < bc; j += WARP_SIZE) {
                const float p = expf(sr[j] - m_new);
                sr[j] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            __syncwarp(kFullMask);  // every lane has read m_s[r] before lane 0 changes it
            if (lane_id() == 0) {
                const float rescale = expf(m_old - m_new);  // 0 for the first tile (m_old = -inf)
                rescale_s[r] = rescale;
                l_s[r] = l_s[r] * rescale + sum;
                m_s[r] = m_new;
            }
        }
        __syncthreads();
        if constexpr (!Cache::kValueInKey) {
            for (int64_t p = tid; p < int64_t(nk) * dv; p += blockDim.x) {  // V replaces K in shared memory
                const int64_t j = p / dv, c = p % dv;
                kv_s[j * stride + c] = a.cache.value(row_of(k0 + j) * a.Hkv + g, c);
            }
            __syncthreads();
        }
        for (int64_t p = tid; p < G * dv; p += blockDim.x) {  // acc += P V, keys in order
            const int64_t r = p / dv, c = p % dv;
            const float* pr = s_s + r * bc;
            float acc = acc_s[p] * rescale_s[r];
            for (int j = 0; j < nk; ++j) acc += pr[j] * kv_s[j * stride + c];
            acc_s[p] = acc;
        }
        __syncthreads();  // the next tile overwrites kv_s and s_s
    }
    for (int64_t p = tid; p < G * dv; p += blockDim.x) out[p] = from_float<T>(acc_s[p] / l_s[p / dv]);
}

template <class T, class Cache>
void paged_attention(StreamContext& s, PagedArgs<T, Cache> a) {
    DeviceContext& dev = device_context(s.device);
    size_t bytes = 0;
    // all G heads of a kv head in one block with the largest key tile that fits shared memory, else the most
    // heads (a divisor of G) that fit with some tile: fixed by G, d, dv and the device, never by the batch
    for (int64_t hb = a.G; hb >= 1 && !a.bc; --hb) {
        if (a.G % hb) continue;
        for (int bc = 64; bc >= 8 && !a.bc; bc /= 2) {
            bytes = paged_shared_bytes(hb, a.d, a.dv, bc);
            if (bytes <= dev.max_shared_per_block_optin) a.bc = bc, a.hb = hb;
        }
    }
    if (!a.bc)
        throw NotSupported("a query head with d=" + std::to_string(a.d) + ", dv=" + std::to_string(a.dv) +
                           " needs more shared memory than the device has");
    if (a.H / a.hb > 65535)
        throw NotSupported("more than 65535 blocks of " + std::to_string(a.hb) + " query heads per query row");
    auto kernel = &paged_attention_kernel<T, Cache>;
    if (bytes > dev.max_shared_per_block)
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    const dim3 grid(unsigned(a.T_rows), unsigned(a.H / a.hb), 1);
    LLAISYS_LAUNCH(kernel, grid, kThreads, bytes, s.stream, a);
}

// Checks the sizes the attention exports share and fills everything but q, out and the caches.
template <class T, class Cache>
bool paged_args(const char* op, int64_t T_rows, int64_t num_seqs, int64_t H, int64_t Hkv, int64_t d, int64_t dv,
                int64_t num_blocks, int64_t block_size, int64_t max_blocks, int64_t window, double scale,
                const void* block_tables, const void* seq_lens, const void* query_start, int device,
                PagedArgs<T, Cache>& a) {
    if (T_rows <= 0 || H <= 0 || dv <= 0) return false;  // nothing to compute
    if (Hkv <= 0 || H % Hkv || d < 0 || num_seqs < 0 || block_size <= 0 || max_blocks < 0 || window < 0)
        throw InvalidArgument(std::string(op) + ": inconsistent shapes T=" + std::to_string(T_rows) + " H=" +
                              std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " block_size=" +
                              std::to_string(block_size) + " window=" + std::to_string(window));
    if (T_rows > INT32_MAX) throw NotSupported(std::string(op) + ": more than 2^31 - 1 query rows");
    a.T_rows = T_rows, a.num_seqs = num_seqs, a.H = H, a.Hkv = Hkv, a.G = H / Hkv, a.d = d, a.dv = dv;
    a.num_blocks = num_blocks, a.block_size = block_size, a.max_blocks = max_blocks, a.window = window;
    a.scale = float(scale);
    a.block_tables = static_cast<const int32_t*>(block_tables);
    a.seq_lens = static_cast<const int32_t*>(seq_lens);
    a.query_start = static_cast<const int32_t*>(query_start);
    a.error = device_context(device).error_device;
    return true;
}

// Calls f(Format{}) with the format struct of kv_format (kv_quant.cuh).
template <class F>
void dispatch_kv_format(int kv_format, F&& f) {
    switch (kv_format) {
        case LLAISYS_KV_INT8: f(KvInt8{}); break;
        case LLAISYS_KV_FP8_E4M3: f(KvFp8E4M3{}); break;
        default:
            throw InvalidArgument("kv_format " + std::to_string(kv_format) +
                                  " is not a llaisys_kv_format (1: int8, 2: fp8 e4m3)");
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(paged_attention)(int device, void* stream, int dtype, int numerics, int64_t T, int64_t num_seqs,
                                int64_t H, int64_t Hkv, int64_t d, int64_t dv, int64_t num_blocks, int64_t block_size,
                                int64_t max_blocks, int64_t window, double scale, void* out, const void* q,
                                const void* k_cache,
                                const void* v_cache, const void* block_tables, const void* seq_lens,
                                const void* query_start) {
    using namespace llaisys::cuda;
    return guard("paged_attention", [&] {
        // as self_attention: where HF's GPU attention rounds is not measured; in f32 hf is the exact mode
        if (hf_numerics(numerics) && dtype != LLAISYS_F32)
            throw NotSupported("numerics=hf attention in f16 / bf16 is not implemented by this backend (where "
                               "HF's GPU attention kernels round is not measured yet); use numerics=exact");
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using E = decltype(tag);
            PagedArgs<E, PlainCache<E>> a{};
            if (!paged_args("paged_attention", T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks, window,
                            scale, block_tables, seq_lens, query_start, s.device, a))
                return;
            a.q = static_cast<const E*>(q), a.out = static_cast<E*>(out);
            a.cache = {static_cast<const E*>(k_cache), static_cast<const E*>(v_cache), d, dv};
            paged_attention(s, a);
        });
    });
}

int LLAISYS_FN(paged_attention_q)(int device, void* stream, int dtype, int kv_format, int64_t T, int64_t num_seqs,
                                  int64_t H, int64_t Hkv, int64_t d, int64_t dv, int64_t num_blocks,
                                  int64_t block_size, int64_t max_blocks, int64_t window, double scale, void* out,
                                  const void* q, const void* k_cache, const void* v_cache, const void* k_scale,
                                  const void* v_scale, const void* block_tables, const void* seq_lens,
                                  const void* query_start) {
    using namespace llaisys::cuda;
    return guard("paged_attention_q", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using E = decltype(tag);
            dispatch_kv_format(kv_format, [&](auto format) {
                using Cache = QuantCache<decltype(format)>;
                PagedArgs<E, Cache> a{};
                if (!paged_args("paged_attention_q", T, num_seqs, H, Hkv, d, dv, num_blocks, block_size, max_blocks,
                                window, scale, block_tables, seq_lens, query_start, s.device, a))
                    return;
                a.q = static_cast<const E*>(q), a.out = static_cast<E*>(out);
                a.cache = {static_cast<const uint8_t*>(k_cache), static_cast<const uint8_t*>(v_cache),
                           static_cast<const f16*>(k_scale), static_cast<const f16*>(v_scale), d, dv};
                paged_attention(s, a);
            });
        });
    });
}

int LLAISYS_FN(paged_latent_attention)(int device, void* stream, int dtype, int64_t T, int64_t num_seqs, int64_t H,
                                       int64_t dc, int64_t dr, int64_t num_blocks, int64_t block_size,
                                       int64_t max_blocks, double scale, void* out, const void* q,
                                       const void* c_cache, const void* r_cache, const void* block_tables,
                                       const void* seq_lens, const void* query_start) {
    using namespace llaisys::cuda;
    return guard("paged_latent_attention", [&] {
        if (dc < 0 || dr < 0)
            throw InvalidArgument("negative latent sizes dc=" + std::to_string(dc) + " dr=" + std::to_string(dr));
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using E = decltype(tag);
            PagedArgs<E, LatentCache<E>> a{};  // one kv head, keys of dc + dr, values of dc, no window
            if (!paged_args("paged_latent_attention", T, num_seqs, H, 1, dc + dr, dc, num_blocks, block_size,
                            max_blocks, 0, scale, block_tables, seq_lens, query_start, s.device, a))
                return;
            a.q = static_cast<const E*>(q), a.out = static_cast<E*>(out);
            a.cache = {static_cast<const E*>(c_cache), static_cast<const E*>(r_cache), dc, dr};
            paged_attention(s, a);
        });
    });
}

int LLAISYS_FN(paged_kv_write)(int device, void* stream, int dtype, int64_t T, int64_t Hkv, int64_t d, int64_t dv,
                               int64_t num_slots, void* k_cache, void* v_cache, const void* k, const void* v,
                               const void* slot_mapping) {
    using namespace llaisys::cuda;
    return guard("paged_kv_write", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using E = decltype(tag);
            if (T <= 0 || Hkv <= 0 || (d <= 0 && dv <= 0)) return;
            const unsigned blocks = blocks_for(T, 1, int64_t(device_context(s.device).sm_count) * 16);
            auto kernel = &kv_write_kernel<E>;
            LLAISYS_LAUNCH(kernel, blocks, kThreads, 0, s.stream, T, Hkv * d, Hkv * dv, num_slots,
                           static_cast<E*>(k_cache), static_cast<E*>(v_cache), static_cast<const E*>(k),
                           static_cast<const E*>(v), static_cast<const int64_t*>(slot_mapping),
                           device_context(s.device).error_device);
        });
    });
}

int LLAISYS_FN(paged_kv_write_q)(int device, void* stream, int dtype, int kv_format, int64_t T, int64_t Hkv,
                                 int64_t d, int64_t dv, int64_t num_slots, void* k_cache, void* v_cache,
                                 void* k_scale, void* v_scale, const void* k, const void* v,
                                 const void* slot_mapping) {
    using namespace llaisys::cuda;
    return guard("paged_kv_write_q", [&] {
        StreamContext& s = stream_context(device, stream);
        dispatch_float(dtype, [&](auto tag) {
            using E = decltype(tag);
            dispatch_kv_format(kv_format, [&](auto format) {
                if (T <= 0 || Hkv <= 0) return;  // (d = dv = 0 still checks the slots and writes zero scales)
                const DeviceContext& dev = device_context(s.device);
                const unsigned blocks = blocks_for(T * Hkv, kThreads / WARP_SIZE, int64_t(dev.sm_count) * 16);
                auto kernel = &kv_write_q_kernel<decltype(format), E>;
                LLAISYS_LAUNCH(kernel, blocks, kThreads, 0, s.stream, T, Hkv, d, dv, num_slots,
                               static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache),
                               static_cast<f16*>(k_scale), static_cast<f16*>(v_scale), static_cast<const E*>(k),
                               static_cast<const E*>(v), static_cast<const int64_t*>(slot_mapping), dev.error_device);
            });
        });
    });
}
