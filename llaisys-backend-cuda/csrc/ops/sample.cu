// sample: draw one token id from softmax(logits / temperature), restricted to the top_k largest logits
// (0 = all) and then to the nucleus top_p, with the semantics of the CPU kernel (llaisys-backend-cpu
// csrc/ops/sample.cpp): temperature 0 (below FLT_MIN) or top_k == 1 is argmax; candidates are ordered by
// logit descending, index ascending among equal logits (index order when every token stays); the nucleus
// is the shortest prefix holding >= top_p of the candidates' mass; the draw is u = splitmix64(seed) as 53
// bits, and the token is the first whose running sum exceeds u * kept mass. +inf logits share all the
// probability; NaN logits and all -inf logits are errors (reported at the next synchronizing call).
//
// On the GPU, in one block and without sorting or scratch memory: every probability p = exp((x - max)/T)
// (f32, as the CPU) is turned into a 62-bit fixed-point integer, so that every sum is exact and independent
// of the order of the threads (the same seed gives the same token on every run and GPU). Then three radix
// searches over the 32-bit order keys of the logits, each 3 histogram passes (11 + 11 + 10 bits):
//   1. the k-th largest key, by counts (top-k; ties at the k-th key keep the lowest indices),
//   2. the key where the candidates' mass, in candidate order, reaches top_p (the nucleus edge),
//   3. the key where it exceeds the drawn r (the token), then the token among the equal keys by index.
// "Among equal keys, lowest indices first" is settled by giving each thread a contiguous chunk of indices
// and a prefix sum of per-chunk counts. The fixed point rounds each probability down to a multiple of
// 2^-(62 - ceil(log2 n)) of the top one (~3e-14 for a 152k vocabulary); where the CPU's double sums and
// these exact ones disagree at an edge, the kernels may differ by one token, with probability ~1e-13.
#include <cfloat>

#include "../common/context.h"
#include "../common/launch.h"
#include "argmax.cuh"

namespace llaisys::cuda {
namespace {

using u64 = unsigned long long;
constexpr int kBins = 2048;  // radix histogram bins (11 bits)

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

struct SampleShared {
    u64 hist[kBins];
    BlockScratch<u64> scan;
    BlockScratch<ArgBest> arg;
    uint32_t key;   // a radix search's result
    u64 above;      // its weight strictly above the key
    long long token;
};

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

// Which tokens are in play at each stage, and the per-thread quotas that settle ties by index.
struct Stages {
    float max;           // the largest (transformed) logit
    float t;             // temperature
    bool inf_mode;       // +inf logits present: they become 0, everything else -inf
    double scale;        // fixed point: 2^bits
    bool top_k;          // stage 1 = candidates: key > kth, or key == kth within quota_k (index order)
    uint32_t kth;
    long long quota_k;
    bool nucleus;        // stage 2 = nucleus: a candidate with key > kp, or key == kp within quota_p
    uint32_t kp;
    long long quota_p;

    __device__ float value(float raw) const { return inf_mode ? (raw == INFINITY ? 0.0f : -INFINITY) : raw; }
    __device__ u64 mass(float x) const {
        if (x == -INFINITY) return 0;
        return u64(double(expf((x - max) / t)) * scale);
    }
};

// Calls f(index, key, value) for the tokens of `stage` (0 all, 1 candidates, 2 nucleus) in this thread's
// chunk [begin, end), in index order.
template <class T, class F>
__device__ void visit(const T* logits, int64_t begin, int64_t end, const Stages& st, int stage, F&& f) {
    long long equal_k = 0, equal_p = 0;
    for (int64_t i = begin; i < end; ++i) {
        const float x = st.value(to_float(logits[i]));
        const uint32_t key = order_key(x);
        if (stage >= 1 && st.top_k && (key < st.kth || (key == st.kth && equal_k++ >= st.quota_k))) continue;
        if (stage >= 2 && st.nucleus && (key < st.kp || (key == st.kp && equal_p++ >= st.quota_p))) continue;
        f(i, key, x);
    }
}

// The key kappa with W(key > kappa) < target <= W(key >= kappa) over the tokens of `stage`, W summing 1 per
// token (by_mass false) or its fixed-point probability. Needs 0 < target <= W(all). Result in sh.key,
// sh.above (= W(key > kappa)).
template <class T>
__device__ void radix_search(const T* logits, int64_t begin, int64_t end, const Stages& st, int stage, bool by_mass,
                             u64 target, SampleShared& sh) {
    const int tid = int(threadIdx.x), threads = int(blockDim.x);
    uint32_t prefix = 0;
    u64 above = 0;
    const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = shifts[pass], bins = 1 << widths[pass];
        const uint32_t high = shift + widths[pass] == 32 ? 0u : ~0u << (shift + widths[pass]);
        for (int b = tid; b < bins; b += threads) sh.hist[b] = 0;
        __syncthreads();
        visit(logits, begin, end, st, stage, [&](int64_t, uint32_t key, float x) {
            if ((key & high) == (prefix & high))
                atomicAdd(&sh.hist[(key >> shift) & uint32_t(bins - 1)], by_mass ? st.mass(x) : u64(1));
        });
        __syncthreads();
        // thread t owns `per` bins from the top: bins [bins - (t + 1) per, bins - t per)
        const int per = bins >= threads ? bins / threads : 1, owners = bins / per;
        const int top = bins - 1 - tid * per;
        u64 local = 0;
        if (tid < owners)
            for (int b = top; b > top - per; --b) local += sh.hist[b];
        const u64 inclusive = block_scan(local, sh.scan), exclusive = inclusive - local;
        const u64 wanted = target - above;
        if (tid < owners && exclusive < wanted && wanted <= inclusive) {
            u64 cum = exclusive;
            for (int b = top; b > top - per; --b) {
                if (cum + sh.hist[b] >= wanted) {
                    sh.key = prefix | (uint32_t(b) << shift);
                    sh.above = above + cum;
                    break;
                }
                cum += sh.hist[b];
            }
        }
        __syncthreads();
        prefix = sh.key;
        above = sh.above;
        __syncthreads();
    }
}

// This thread's share of `allowed` tokens of `stage` with key == `key`, lowest indices first.
template <class T>
__device__ long long tie_quota(const T* logits, int64_t begin, int64_t end, const Stages& st, int stage, uint32_t key,
                               long long allowed, SampleShared& sh) {
    u64 count = 0;
    visit(logits, begin, end, st, stage, [&](int64_t, uint32_t k, float) { count += k == key; });
    const u64 before = block_scan(count, sh.scan) - count;
    const long long quota = allowed - (long long)before;
    return quota < 0 ? 0 : (quota > (long long)count ? (long long)count : quota);
}

template <class T>
__global__ void __launch_bounds__(1024) sample_kernel(int64_t n, int64_t* out_idx, const T* logits, float temperature,
                                                      int64_t top_k, double top_p, u64 seed, int fixed_bits,
                                                      KernelErrorRecord* error) {
    __shared__ SampleShared sh;
    const int tid = int(threadIdx.x);
    const ArgBest best = block_argmax(logits, n, sh.arg);
    if (temperature < FLT_MIN || top_k == 1) {  // greedy
        if (tid == 0) *out_idx = best.index;
        return;
    }
    if (isnan(best.value)) {
        if (tid == 0) report_kernel_error(error, kSampleNaN, best.index, 0, 0);
        return;
    }
    if (best.value == -INFINITY) {
        if (tid == 0) report_kernel_error(error, kSampleAllNegInf, 0, 0, 0);
        return;
    }
    if (tid == 0) sh.token = best.index;  // (always overwritten below)
    Stages st{};
    st.inf_mode = best.value == INFINITY;
    st.max = st.inf_mode ? 0.0f : best.value;
    st.t = temperature;
    st.scale = double(1ull << fixed_bits);
    const int64_t chunk = (n + blockDim.x - 1) / blockDim.x;
    const int64_t begin = tid * chunk < n ? tid * chunk : n, end = begin + chunk < n ? begin + chunk : n;
    const int64_t k = (top_k <= 0 || top_k >= n) ? n : top_k;

    if (k < n) {  // candidates: the k best (the lowest indices among ties at the k-th key)
        radix_search(logits, begin, end, st, 0, false, u64(k), sh);
        st.kth = sh.key;
        st.quota_k = tie_quota(logits, begin, end, st, 0, st.kth, (long long)(u64(k) - sh.above), sh);
        st.top_k = true;
    }
    u64 mine = 0;
    visit(logits, begin, end, st, 1, [&](int64_t, uint32_t, float x) { mine += st.mass(x); });
    const u64 total = block_sum(mine, sh.scan);
    u64 kept = total;
    if (top_p < 1.0) {  // nucleus: candidates in order until their mass reaches top_p of the total
        double goal = ceil(top_p * double(total));
        const u64 target = goal < 1.0 ? 1 : (goal > double(total) ? total : u64(goal));
        radix_search(logits, begin, end, st, 1, true, target, sh);
        st.kp = sh.key;
        const u64 above = sh.above, each = st.mass(from_order_key(st.kp));  // > 0: the edge holds mass
        const u64 needed = (target - above + each - 1) / each;               // equal tokens taken, >= 1
        st.quota_p = tie_quota(logits, begin, end, st, 1, st.kp, (long long)needed, sh);
        st.nucleus = true;
        kept = above + needed * each;
    }
    // r = floor(u * kept) < kept, with u the 53-bit draw (exact 117-bit product)
    const u64 u = splitmix64(seed ^ splitmix64(0)) >> 11;
    const u64 r = (__umul64hi(u, kept) << 11) | ((u * kept) >> 53);

    if (k == n && top_p >= 1.0) {  // every token stays: index order
        u64 mass = 0;
        visit(logits, begin, end, st, 0, [&](int64_t, uint32_t, float x) { mass += st.mass(x); });
        const u64 inclusive = block_scan(mass, sh.scan), exclusive = inclusive - mass;
        if (exclusive <= r && r < inclusive) {
            u64 cum = exclusive;
            bool done = false;
            visit(logits, begin, end, st, 0, [&](int64_t i, uint32_t, float x) {
                cum += st.mass(x);
                if (!done && cum > r) {
                    sh.token = i;
                    done = true;
                }
            });
        }
    } else {  // candidate order: the key where the running mass passes r, then that key's tokens by index
        radix_search(logits, begin, end, st, 2, true, r + 1, sh);
        const uint32_t key = sh.key;
        const u64 each = st.mass(from_order_key(key));
        const u64 nth = (r - sh.above) / each;  // 0-based among the nucleus tokens with this key
        u64 count = 0;
        visit(logits, begin, end, st, 2, [&](int64_t, uint32_t k2, float) { count += k2 == key; });
        const u64 inclusive = block_scan(count, sh.scan), exclusive = inclusive - count;
        if (exclusive <= nth && nth < inclusive) {
            u64 seen = exclusive;
            visit(logits, begin, end, st, 2, [&](int64_t i, uint32_t k2, float) {
                if (k2 == key && seen++ == nth) sh.token = i;
            });
        }
    }
    __syncthreads();
    if (tid == 0) *out_idx = sh.token;
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
        // p <= 1 per token, so n tokens sum below 2^62 with this many fraction bits
        int log2n = 0;
        while ((int64_t(1) << log2n) < n) ++log2n;
        const int fixed_bits = 62 - log2n;
        const float t = float(temperature < double(FLT_MAX) ? temperature : double(FLT_MAX));
        // small vocabularies need few threads; the device's limit caps large ones (CoreX reports its own)
        int threads = n >= 8192 ? 1024 : (n >= 512 ? 256 : 64);
        while (threads > device_context(device).max_threads_per_block && threads > 64) threads /= 2;
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            auto kernel = &sample_kernel<T>;
            LLAISYS_LAUNCH(kernel, 1, threads, 0, s.stream, n, static_cast<int64_t*>(out_idx),
                           static_cast<const T*>(logits), temperature < double(FLT_MIN) ? 0.0f : t, top_k, top_p,
                           static_cast<unsigned long long>(seed), fixed_bits, device_context(device).error_device);
        });
    });
}
