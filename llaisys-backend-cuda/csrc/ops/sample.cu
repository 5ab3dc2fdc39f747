// sample: draw one token id from softmax(logits / temperature), restricted to the top_k largest logits
// (0 = all) and then to the nucleus top_p, with the semantics of the CPU kernel (llaisys-backend-cpu
// csrc/ops/sample.cpp): temperature 0 (below FLT_MIN) or top_k == 1 is argmax; candidates are ordered by
// logit descending, index ascending among equal logits (index order when every token stays); the nucleus
// is the shortest prefix holding >= top_p of the candidates' mass; the draw is u = splitmix64(seed) as 53
// bits, and the token is the first whose running sum exceeds u * kept mass. +inf logits share all the
// probability; NaN logits and all -inf logits are errors (reported at the next synchronizing call).
//
// Exact arithmetic, so that any split of the work gives the same token: every probability p = exp((x - max)/T)
// (f32, as the CPU) becomes a 62-bit fixed-point integer (u64(p * 2^(62 - ceil(log2 n)))), so every sum is exact
// and independent of the order it is taken in. The fixed point rounds each probability down to a multiple of
// 2^-(62 - ceil(log2 n)) of the top one (~3e-14 for a 152k vocabulary); where the CPU's double sums and these
// exact ones disagree at an edge, the two backends may differ by one token, with probability ~1e-13.
//
// Many blocks, few passes over the vocabulary. The vocabulary is cut into one contiguous chunk per block
// (block order = index order), and each pass is one kernel over all of it; the last block to finish a pass
// (a ticket from an atomic counter) does the pass's small serial part. Tokens are compared by their 32-bit
// order keys (order_key), and a key is found by a radix search over 16-bit digits, whose histograms of 65536
// u64 bins live in the stream's workspace (atomicAdd: exact, order-free; two of them, so that every pass's
// blocks clear the one the next pass counts into):
//   1. argmax_kernel: the maximum (and greedy draws, NaN / all -inf errors);
//   2. top-k (k < n): the k-th largest key by counts;            -> candidates: keys above it, and the first
//                                                                   (lowest index) of those equal to it;
//   3. top-p (< 1): the key where the candidates' mass, in candidate order, reaches top_p of their total;
//   4. the draw: the key where the running mass of the nucleus passes r = floor(u * kept), then
//   5. locate_kernel: that key's token at the right rank, in index order.
// Each search is one pass for bf16 logits (a bf16 key's low 16 bits follow from its high ones) and two
// otherwise. Ties at a search's edge never need index order in the histograms: tokens of equal keys have equal
// mass, so "the first q of them" adds q times that mass to its bin; only locate_kernel walks indices. When
// every token stays (k = n, top_p = 1) the order is the index order: index_order_kernel sums each chunk and
// walks the chunk where the draw falls. So a draw is 1 pass (greedy), 2 (temperature only), and 3 to 5 (bf16;
// up to 8 for f16 / f32) with top-k and top-p, against ~15 for the former one-block kernel; the result is the
// same token (the same exact integers).
//
// Capturable: the state is reset by a memset on the stream, the workspace is the stream's, nothing allocates
// or synchronizes.
#include <algorithm>
#include <cfloat>
#include <string>
#include <type_traits>

#include "../common/context.h"
#include "../common/launch.h"
#include "argmax.cuh"

namespace llaisys::cuda {
namespace {

using u64 = unsigned long long;
constexpr int kThreads = 256;        // per block (the most; a small vocabulary takes kSmallThreads)
constexpr int kSmallThreads = 64;
constexpr int64_t kSmallVocabulary = 4096;
constexpr int kMaxBlocks = 1024;     // chunks of the vocabulary
constexpr int kDigitBits = 16;       // radix digits: the high then the low 16 bits of a key
constexpr int kBins = 1 << kDigitBits;
constexpr int kMaxPasses = 8;        // kernels per draw after the argmax: 2 + 2 + 2 digit passes, then locate

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Floats -> unsigned keys of the same order (-0 and +0 alike; no NaN gets here).
__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f + 0.0f);
    const uint32_t negative = uint32_t(int32_t(u) >> 31);
    return u ^ (negative | 0x80000000u);
}

__device__ __forceinline__ float from_order_key(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// A set of tokens: every token with a key above `lo`, and the first `bulk` (in index order) with key == lo.
// All tokens: lo = 0, bulk = 0 (key 0 would be a NaN).
struct Stage {
    uint32_t lo;
    u64 bulk;
};

enum Search : int { kTopK = 0, kTopP = 1, kDraw = 2 };

// The draw's state in the stream's workspace, zeroed by a memset before the first kernel.
struct SampleState {
    unsigned tickets[1 + kMaxPasses];  // one arrival counter per kernel of the draw
    int done;                          // out_idx written or an error reported: later kernels do nothing
    float max;                         // the largest (transformed) logit
    int inf_mode;                      // +inf logits present: they become 0, everything else -inf
    Stage stage[3];                    // 0 all tokens, 1 candidates (top-k), 2 nucleus (top-p)
    uint32_t prefix;                   // the running radix search: the key's digits found so far,
    u64 above;                         //   the weight of the tokens above the key's bins so far,
    u64 target;                        //   the weight it must reach
    u64 kept, r;                       // the nucleus' mass and the drawn r in [0, kept)
    uint32_t draw_key;                 // the drawn token's key and its rank among that key's tokens
    u64 nth;
    ArgBest best_of[kMaxBlocks];       // per block
    u64 sum_of[kMaxBlocks];
};

struct Args {
    int64_t n, chunk;           // vocabulary, tokens per block
    float t;                    // temperature (0: greedy)
    int64_t k;                  // top_k as a count (n: all)
    double top_p;
    u64 seed;
    double scale;               // 2^fixed_bits
    int64_t* out_idx;
    KernelErrorRecord* error;
    SampleState* st;
    u64* hist;                  // 2 x kBins: digit pass j counts into half j % 2 and clears the other half
};

// What a token counts as, once the maximum is known.
struct Weights {
    float max, t;
    bool inf_mode;
    double scale;
    __device__ float value(float raw) const { return inf_mode ? (raw == INFINITY ? 0.0f : -INFINITY) : raw; }
    __device__ u64 mass(float x) const {
        if (x == -INFINITY) return 0;
        return u64(double(expf((x - max) / t)) * scale);
    }
};

__device__ Weights weights_of(const Args& a) {
    const SampleState* st = a.st;
    return Weights{st->max, a.t, st->inf_mode != 0, a.scale};
}

__device__ __forceinline__ bool in_stage(uint32_t key, const Stage& s) { return key > s.lo; }  // (+ bulk)

// Inclusive prefix sum over the threads of the block (thread 0 first).
__device__ u64 block_scan(u64 x, BlockScratch<u64>& scratch) {
    const int lane = lane_id(), warp = warp_id();
#pragma unroll
    for (int offset = 1; offset < WARP_SIZE; offset *= 2) {
        const u64 y = __shfl_up_sync(kFullMask, x, offset, WARP_SIZE);
        if (lane >= offset) x += y;
    }
    __syncthreads();
    if (lane == WARP_SIZE - 1) scratch.slot[warp] = x;
    __syncthreads();
    for (int w = 0; w < warp; ++w) x += scratch.slot[w];
    return x;
}

struct Chunk {
    int64_t begin, end;
};
__device__ Chunk chunk_of(const Args& a, int64_t block) {
    const int64_t begin = block * a.chunk < a.n ? block * a.chunk : a.n;
    return Chunk{begin, begin + a.chunk < a.n ? begin + a.chunk : a.n};
}

// Whether this block is the last of the grid to arrive here (after publishing its results): every thread gets
// the answer. The fences order each block's writes before its ticket, and the last block's reads after.
__device__ bool last_block(unsigned* ticket, int& flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) flag = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    __threadfence();
    return flag != 0;
}

// ---- 1. the maximum --------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads) argmax_kernel(Args a, T const* logits, int greedy) {
    __shared__ BlockScratch<ArgBest> scratch;
    __shared__ int last;
    const Chunk c = chunk_of(a, blockIdx.x);
    ArgBest best = block_argmax(logits + c.begin, c.end - c.begin, scratch);
    if (threadIdx.x == 0) a.st->best_of[blockIdx.x] = ArgBest{best.value, best.index + c.begin};
    if (!last_block(&a.st->tickets[0], last)) return;
    if (threadIdx.x != 0) return;
    const volatile ArgBest* parts = a.st->best_of;
    best = ArgBest{parts[0].value, parts[0].index};
    for (unsigned b = 1; b < gridDim.x; ++b)
        if (better(parts[b].value, parts[b].index, best.value, best.index)) best = ArgBest{parts[b].value, parts[b].index};
    SampleState* st = a.st;
    if (greedy) {
        *a.out_idx = best.index;
        st->done = 1;
    } else if (isnan(best.value)) {
        report_kernel_error(a.error, kSampleNaN, best.index, 0, 0);
        st->done = 1;
    } else if (best.value == -INFINITY) {
        report_kernel_error(a.error, kSampleAllNegInf, 0, 0, 0);
        st->done = 1;
    } else {
        st->inf_mode = best.value == INFINITY;
        st->max = st->inf_mode ? 0.0f : best.value;
    }
}

// ---- 2-4. radix searches -----------------------------------------------------------------------------------

struct Digit {
    int shift;  // 16: the high digit, 0: the low one
    int last;   // the search's last pass (bf16: the high digit already is)
};

// The u64 draw r = floor(u * kept), u the seed's 53-bit uniform (an exact 117-bit product).
__device__ u64 draw_r(u64 seed, u64 kept) {
    const u64 u = splitmix64(seed ^ splitmix64(0)) >> 11;
    return (__umul64hi(u, kept) << 11) | ((u * kept) >> 53);
}

// One digit pass of `search` over the tokens of stage `s` (weights: counts for top-k, masses otherwise). The
// last block then completes the histogram (the stage's bulk at its edge key), finds the digit (the bin where
// the weight, from the top, reaches the target), clears the histogram, and after the search's last digit
// turns the key into the next stage (top-k, top-p) or the drawn key and rank (draw).
template <class T>
__global__ void __launch_bounds__(kThreads) digit_kernel(Args a, const T* logits, int search, int s, int pass,
                                                         Digit d) {
    __shared__ BlockScratch<u64> scratch;
    __shared__ int last;
    __shared__ u64 found_above;
    __shared__ uint32_t found_bin;
    SampleState* st = a.st;
    if (st->done) return;
    const Weights wt = weights_of(a);
    const Stage stage = st->stage[s];
    const bool by_mass = search != kTopK;
    const uint32_t high = d.shift == kDigitBits ? 0u : ~0u << kDigitBits;  // the digits above this one
    const uint32_t prefix = st->prefix;
    u64* counts = a.hist + (pass & 1) * kBins;
    // the other half, counted into by the previous pass (finished), is cleared for the next one by all blocks
    u64* other = a.hist + ((pass + 1) & 1) * kBins;
    for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < kBins; b += int64_t(gridDim.x) * blockDim.x)
        other[b] = 0;
    const Chunk c = chunk_of(a, blockIdx.x);
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const float x = wt.value(to_float(logits[i]));
        const uint32_t key = order_key(x);
        if (!in_stage(key, stage) || (key & high) != (prefix & high)) continue;
        const u64 w = by_mass ? wt.mass(x) : 1;
        if (w) atomicAdd(&counts[(key >> d.shift) & (kBins - 1)], w);
    }
    if (!last_block(&st->tickets[pass], last)) return;

    volatile u64* hist = counts;
    const int tid = int(threadIdx.x);
    if (tid == 0 && stage.bulk && (stage.lo & high) == (prefix & high)) {  // the first `bulk` tokens at the edge key
        const uint32_t bin = (stage.lo >> d.shift) & (kBins - 1);
        hist[bin] = hist[bin] + stage.bulk * (by_mass ? wt.mass(from_order_key(stage.lo)) : 1);
    }
    __syncthreads();
    // thread t owns `per` bins from the top: [kBins - (t + 1) per, kBins - t per)
    const int per = kBins / int(blockDim.x), top = kBins - 1 - tid * per;
    u64 mine = 0;
    for (int b = top; b > top - per; --b) mine += hist[b];
    const u64 inclusive = block_scan(mine, scratch), exclusive = inclusive - mine;
    if (d.shift == kDigitBits && tid == int(blockDim.x) - 1) {  // a search starts: its target
        const u64 total = inclusive;                              // the stage's whole weight
        u64 target = 0;
        if (search == kTopK) {
            target = u64(a.k);
        } else if (search == kTopP) {
            const double goal = ceil(a.top_p * double(total));
            target = goal < 1.0 ? 1 : (goal > double(total) ? total : u64(goal));
        } else {
            st->kept = s == 2 ? st->kept : total;
            st->r = draw_r(a.seed, st->kept);
            target = st->r + 1;
        }
        st->target = target;
        st->above = 0;
    }
    __syncthreads();
    const u64 wanted = st->target - st->above;
    if (exclusive < wanted && wanted <= inclusive) {
        u64 cum = exclusive;
        for (int b = top; b > top - per; --b) {
            if (cum + hist[b] >= wanted) {
                found_bin = uint32_t(b);
                found_above = cum;
                break;
            }
            cum += hist[b];
        }
    }
    __syncthreads();
    if (tid != 0) return;
    const uint32_t key_high = (prefix & high) | (found_bin << d.shift);
    st->above += found_above;
    if (!d.last) {
        st->prefix = key_high;
        return;
    }
    // the low bits a bf16 key does not have: 0 for keys of non-negative values, all ones below them
    const uint32_t low = d.shift ? (key_high & 0x80000000u ? 0u : (1u << d.shift) - 1u) : 0u;
    const uint32_t key = key_high | low;
    st->prefix = 0;
    if (search == kTopK) {
        st->stage[1] = Stage{key, st->target - st->above};
    } else {
        const u64 each = wt.mass(from_order_key(key));  // > 0: the edge holds mass
        if (search == kTopP) {
            const u64 needed = (st->target - st->above + each - 1) / each;  // equal tokens taken, >= 1
            st->stage[2] = Stage{key, needed};
            st->kept = st->above + needed * each;
        } else {
            st->draw_key = key;
            st->nth = (st->r - st->above) / each;  // 0-based among the tokens with this key, in index order
        }
    }
}

// ---- 5. the drawn token --------------------------------------------------------------------------------------

// In the last block: the token of chunk [c.begin, c.end) where the running sum of weight(i) (in index order,
// starting from `before`) first exceeds `target`; written to out_idx by the thread that finds it.
template <class F>
__device__ void find_in_chunk(const Args& a, Chunk c, u64 before, u64 target, BlockScratch<u64>& scratch, F&& weight) {
    __shared__ u64 round_total;
    for (int64_t base = c.begin; base < c.end; base += blockDim.x) {  // rounds of one token per thread
        const int64_t i = base + threadIdx.x;
        const u64 w = i < c.end ? weight(i) : 0;
        const u64 inclusive = block_scan(w, scratch);
        if (w && before + inclusive - w <= target && target < before + inclusive) *a.out_idx = i;
        if (threadIdx.x == blockDim.x - 1) round_total = inclusive;
        __syncthreads();
        before += round_total;
        __syncthreads();  // read by every thread before the next round writes it
        if (before > target) return;
    }
}

// Counts the drawn key's tokens per chunk; the last block finds the chunk and the token of rank nth.
template <class T>
__global__ void __launch_bounds__(kThreads) locate_kernel(Args a, const T* logits, int pass) {
    __shared__ BlockScratch<u64> scratch;
    __shared__ int last;
    SampleState* st = a.st;
    if (st->done) return;
    const Weights wt = weights_of(a);
    const uint32_t key = st->draw_key;
    const Chunk c = chunk_of(a, blockIdx.x);
    u64 count = 0;
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) count += order_key(wt.value(to_float(logits[i]))) == key;
    count = block_sum(count, scratch);
    if (threadIdx.x == 0) st->sum_of[blockIdx.x] = count;
    if (!last_block(&st->tickets[pass], last)) return;
    const volatile u64* counts = st->sum_of;
    u64 before = 0;
    unsigned b = 0;
    for (; b + 1 < gridDim.x && before + counts[b] <= st->nth; ++b) before += counts[b];  // (same in every thread)
    find_in_chunk(a, chunk_of(a, b), before, st->nth, scratch,
                  [&](int64_t i) { return u64(order_key(wt.value(to_float(logits[i]))) == key); });
}

// Every token stays: the draw in index order. Sums each chunk's mass; the last block finds the chunk and token.
template <class T>
__global__ void __launch_bounds__(kThreads) index_order_kernel(Args a, const T* logits, int pass) {
    __shared__ BlockScratch<u64> scratch;
    __shared__ int last;
    SampleState* st = a.st;
    if (st->done) return;
    const Weights wt = weights_of(a);
    const Chunk c = chunk_of(a, blockIdx.x);
    u64 mass = 0;
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) mass += wt.mass(wt.value(to_float(logits[i])));
    mass = block_sum(mass, scratch);
    if (threadIdx.x == 0) st->sum_of[blockIdx.x] = mass;
    if (!last_block(&st->tickets[pass], last)) return;
    const volatile u64* sums = st->sum_of;
    u64 kept = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) kept += sums[b];
    const u64 r = draw_r(a.seed, kept);
    u64 before = 0;
    unsigned b = 0;
    for (; b + 1 < gridDim.x && before + sums[b] <= r; ++b) before += sums[b];
    find_in_chunk(a, chunk_of(a, b), before, r, scratch,
                  [&](int64_t i) { return wt.mass(wt.value(to_float(logits[i]))); });
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(sample)(int device, void* stream, int dtype, int64_t n, void* out_idx, const void* logits,
                       double temperature, int64_t top_k, double top_p, uint64_t seed) {
    using namespace llaisys::cuda;
    return guard("sample", [&] {
        StreamContext& s = stream_context(device, stream);
        if (n <= 0) throw InvalidArgument("sample from an empty vocabulary");
        if (!(top_p > 0.0)) throw InvalidArgument("top_p must be > 0");
        const size_t state_bytes = (sizeof(SampleState) + 255) / 256 * 256, needed = state_bytes + 2 * kBins * sizeof(u64);
        if (s.workspace_bytes < needed)
            throw NotSupported("sample needs " + std::to_string(needed) + " bytes of the stream's workspace, which has " +
                               std::to_string(s.workspace_bytes) + " (LLAISYS_CUDA_WORKSPACE_BYTES)");
        // p <= 1 per token, so n tokens sum below 2^62 with this many fraction bits
        int log2n = 0;
        while ((int64_t(1) << log2n) < n) ++log2n;
        const int sm_count = device_context(device).sm_count;
        const int threads = n <= kSmallVocabulary ? kSmallThreads : kThreads;
        const int64_t by_size = (n + threads - 1) / threads, by_sms = int64_t(sm_count) * 2;
        const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>({by_size, by_sms, kMaxBlocks}));
        Args a{};
        a.n = n;
        a.chunk = (n + blocks - 1) / blocks;
        const bool greedy = temperature < double(FLT_MIN) || top_k == 1;
        a.t = greedy ? 0.0f : float(temperature < double(FLT_MAX) ? temperature : double(FLT_MAX));
        a.k = (top_k <= 0 || top_k >= n) ? n : top_k;
        a.top_p = top_p;
        a.seed = static_cast<unsigned long long>(seed);
        a.scale = double(1ull << (62 - log2n));
        a.out_idx = static_cast<int64_t*>(out_idx);
        a.error = device_context(device).error_device;
        a.st = static_cast<SampleState*>(s.workspace);
        a.hist = reinterpret_cast<u64*>(static_cast<char*>(s.workspace) + state_bytes);
        const unsigned grid = unsigned((n + a.chunk - 1) / a.chunk);
        CUDA_CHECK(cudaMemsetAsync(s.workspace, 0, needed, s.stream));
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            const T* x = static_cast<const T*>(logits);
            auto argmax = &argmax_kernel<T>;
            LLAISYS_LAUNCH(argmax, grid, threads, 0, s.stream, a, x, int(greedy));
            if (greedy) return;
            int pass = 1;
            if (a.k == n && top_p >= 1.0) {  // every token stays: index order
                auto kernel = &index_order_kernel<T>;
                LLAISYS_LAUNCH(kernel, grid, threads, 0, s.stream, a, x, pass);
                return;
            }
            // a bf16 key is known from its high 16 bits: one digit per search
            const bool one_digit = std::is_same_v<T, bf16>;
            auto digit = &digit_kernel<T>;
            auto search = [&](Search what, int stage) {
                LLAISYS_LAUNCH(digit, grid, threads, 0, s.stream, a, x, int(what), stage, pass++,
                               Digit{kDigitBits, int(one_digit)});
                if (!one_digit) LLAISYS_LAUNCH(digit, grid, threads, 0, s.stream, a, x, int(what), stage, pass++, Digit{0, 1});
            };
            if (a.k < n) search(kTopK, 0);
            if (top_p < 1.0) search(kTopP, 1);
            search(kDraw, top_p < 1.0 ? 2 : 1);
            auto locate = &locate_kernel<T>;
            LLAISYS_LAUNCH(locate, grid, threads, 0, s.stream, a, x, pass);
        });
    });
}
