// self_attention: causal GQA attention, q [L, H, d], k [S, Hkv, d], v [S, Hkv, dv] -> out [L, H, dv];
// query i sees key j iff j <= i + S - L; head h reads kv head h / G (G = H / Hkv).
//
// One kernel family, flash-attention style: a block owns R "query rows" of one kv head (row = (i, g),
// g fastest, so the G query heads that share a kv head share every K / V tile the block loads) and one
// split of the key range. It walks its keys in tiles of BC: K tile to shared memory, scores S = q k^T
// (one thread per (row, key)), an online softmax per row (running max m, sum l; earlier partial sums are
// rescaled by exp(m_old - m_new)), V tile to the same shared memory, acc += P V (one thread per (row,
// column)). Everything is f32; the output is rounded once.
//   * decode (few rows per kv head, e.g. L = 1): R = 8, 128 threads, and the keys split across blocks
//     (flash-decoding) so that a long cache keeps every SM busy: each split writes its unnormalised acc
//     with (m, l) to the stream's workspace and a combine kernel merges the splits.
//   * prefill (many rows): R = 32, 256 threads; K / V tiles are shared by 32 rows. Blocks stop at the last
//     key their rows can see (causal), and also split keys when there are too few row tiles to fill the GPU.
// out may be q (a block reads its q rows before writing them, and no other block reads them) or v (then
// the rows go through the workspace in chunks from the last query down: a chunk reads only values of
// earlier positions, which later chunks have not yet overwritten). No allocation, no synchronisation.
#include <algorithm>
#include <climits>

#include "../common/context.h"
#include "../common/dtype.cuh"
#include "../common/launch.h"
#include "../common/reduce.cuh"

namespace llaisys::cuda {
namespace {

template <class T>
struct AttentionArgs {
    int64_t L, S, H, Hkv, G, d, dv;
    int64_t row_begin, n_rows;  // this launch's query positions [row_begin, row_begin + n_rows)
    int64_t keys_per_split;     // a multiple of bc
    int bc;                     // keys per tile
    float scale;
    const T *q, *k, *v;
    T* out;           // written directly when part_acc is null
    float* part_acc;  // [splits][n_rows * H][dv], unnormalised
    float* part_ml;   // [splits][n_rows * H][2]: running max m and sum l
};

// Floats of dynamic shared memory for R rows: q [R][d], the K / V tile [bc][max(d, dv) + 1] (padded so
// that threads reading different keys hit different banks), scores [R][bc], m / l / rescale [R].
inline size_t attention_shared_bytes(int R, int64_t d, int64_t dv, int bc) {
    const int64_t dmax = std::max(d, dv);
    return size_t(R * d + bc * (dmax + 1) + int64_t(R) * bc + 3 * R) * sizeof(float);
}

template <class T, int R, int THREADS, int DV_MAX>
__global__ void __launch_bounds__(THREADS) attention_kernel(AttentionArgs<T> a) {
    constexpr int kAcc = R * DV_MAX / THREADS;  // (row, column) pairs per thread
    static_assert(R * DV_MAX % THREADS == 0 && THREADS % WARP_SIZE == 0, "tile shape");
    LLAISYS_DYNAMIC_SHARED(float, shared);
    // shared-memory index arithmetic in int (tiles are far below 2^31 elements); global offsets in int64
    const int d = int(a.d), dv = int(a.dv), dmax = d > dv ? d : dv, stride = dmax + 1;
    const int64_t G = a.G;
    const int bc = a.bc;
    float* q_s = shared;
    float* kv_s = q_s + R * d;
    float* s_s = kv_s + bc * stride;
    float* m_s = s_s + R * bc;
    float* l_s = m_s + R;
    float* rescale_s = l_s + R;

    const int tid = int(threadIdx.x);
    const int64_t kvh = blockIdx.y, split = blockIdx.z;
    const int64_t rows_total = a.n_rows * G, first_row = int64_t(blockIdx.x) * R;
    const int64_t causal_shift = a.S - a.L;  // query i sees keys j <= i + causal_shift

    for (int idx = tid; idx < R * d; idx += THREADS) {
        const int t = idx / d, c = idx % d;
        const int64_t rr = first_row + t;
        const int64_t i = a.row_begin + rr / G, h = kvh * G + rr % G;
        q_s[idx] = rr < rows_total ? to_float(a.q[(i * a.H + h) * d + c]) : 0.0f;
    }
    if (tid < R) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    // this split's keys, ending at the last key that the tile's last row can see
    const int64_t last_row = (first_row + R < rows_total ? first_row + R : rows_total) - 1;
    const int64_t last_visible = a.row_begin + last_row / G + causal_shift;
    const int64_t key_begin = split * a.keys_per_split;
    int64_t key_end = key_begin + a.keys_per_split;
    if (key_end > a.S) key_end = a.S;
    if (key_end > last_visible + 1) key_end = last_visible + 1;

    float acc[kAcc];
#pragma unroll
    for (int n = 0; n < kAcc; ++n) acc[n] = 0.0f;
    __syncthreads();

    for (int64_t k0 = key_begin; k0 < key_end; k0 += bc) {
        const int n_keys = int(key_end - k0 < bc ? key_end - k0 : bc);
        for (int idx = tid; idx < bc * d; idx += THREADS) {
            const int j = idx / d, c = idx % d;
            kv_s[j * stride + c] = j < n_keys ? to_float(a.k[((k0 + j) * a.Hkv + kvh) * d + c]) : 0.0f;
        }
        __syncthreads();
        for (int p = tid; p < R * bc; p += THREADS) {  // scores, masked to -inf
            const int t = p / bc, j = p % bc;
            const int64_t rr = first_row + t;
            float score = -INFINITY;
            if (rr < rows_total && j < n_keys && k0 + j <= a.row_begin + rr / G + causal_shift) {
                const float* qr = q_s + t * d;
                const float* kr = kv_s + j * stride;
                float dot = 0.0f;
                for (int c = 0; c < d; ++c) dot += qr[c] * kr[c];
                score = dot * a.scale;
            }
            s_s[p] = score;
        }
        __syncthreads();
        for (int t = warp_id(); t < R; t += THREADS / WARP_SIZE) {  // online softmax, one warp per row
            float* sr = s_s + t * bc;
            float tile_max = -INFINITY;
            for (int j = lane_id(); j < bc; j += WARP_SIZE) tile_max = fmaxf(tile_max, sr[j]);
            tile_max = warp_max(tile_max);
            const float m_old = m_s[t], m_new = fmaxf(m_old, tile_max);
            float sum = 0.0f;
            for (int j = lane_id(); j < bc; j += WARP_SIZE) {
                const float p = m_new == -INFINITY ? 0.0f : expf(sr[j] - m_new);
                sr[j] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            __syncwarp(kFullMask);  // every lane has read m_s[t] before lane 0 changes it
            if (lane_id() == 0) {
                const float rescale = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
                rescale_s[t] = rescale;
                l_s[t] = l_s[t] * rescale + sum;
                m_s[t] = m_new;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < bc * dv; idx += THREADS) {  // V replaces K in shared memory
            const int j = idx / dv, c = idx % dv;
            kv_s[j * stride + c] = j < n_keys ? to_float(a.v[((k0 + j) * a.Hkv + kvh) * dv + c]) : 0.0f;
        }
        __syncthreads();
        // acc += P V: the thread's (row, column) pairs are fixed, so each key's value row is read once per
        // column (columns beyond dv read column dv - 1, in bounds, and are never written out)
#pragma unroll
        for (int n = 0; n < kAcc; ++n) acc[n] *= rescale_s[(tid + n * THREADS) / DV_MAX];
        for (int j = 0; j < n_keys; ++j) {
            const float* vr = kv_s + j * stride;
#pragma unroll
            for (int n = 0; n < kAcc; ++n) {
                const int p = tid + n * THREADS, t = p / DV_MAX, c = p % DV_MAX;
                acc[n] += s_s[t * bc + j] * vr[c < dv ? c : dv - 1];
            }
        }
        __syncthreads();  // the next tile overwrites kv_s and s_s
    }

#pragma unroll
    for (int n = 0; n < kAcc; ++n) {
        const int p = tid + n * THREADS, t = p / DV_MAX, c = p % DV_MAX;
        const int64_t rr = first_row + t;
        if (c >= dv || rr >= rows_total) continue;
        const int64_t local = (rr / G) * a.H + kvh * G + rr % G;  // (i - row_begin) * H + h
        if (a.part_acc) {
            const int64_t slot = split * a.n_rows * a.H + local;
            a.part_acc[slot * dv + c] = acc[n];
            if (c == 0) {
                a.part_ml[slot * 2] = m_s[t];
                a.part_ml[slot * 2 + 1] = l_s[t];
            }
        } else {
            a.out[(a.row_begin * a.H + local) * dv + c] = from_float<T>(acc[n] / l_s[t]);
        }
    }
}

// out = the splits' partial results merged, one thread per output element (row, column): a running merge
// over the splits in order, sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), where a split that saw no
// key (l_s = 0) contributes nothing. (An earlier two-pass form, one block per row, was miscompiled by nvcc
// 13.0 for sm_90 once its split loops were unrolled: wrong from 4 splits on; see the README's H200 run.)
template <class T>
__global__ void attention_combine_kernel(int64_t rows, int64_t dv, int splits, T* out, const float* part_acc,
                                         const float* part_ml) {
    const int64_t n = rows * dv;
    for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r = idx / dv, c = idx % dv;
        float m = -INFINITY, l = 0.0f, acc = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const int64_t slot = int64_t(s) * rows + r;
            const float ls = part_ml[slot * 2 + 1];
            if (!(ls > 0.0f)) continue;
            const float ms = part_ml[slot * 2], m_new = fmaxf(m, ms);
            const float keep = expf(m - m_new), take = expf(ms - m_new);  // keep = 0 at the first split
            l = l * keep + ls * take;
            acc = acc * keep + part_acc[slot * dv + c] * take;
            m = m_new;
        }
        out[idx] = from_float<T>(acc / l);
    }
}

struct Plan {
    int bc = 0;
    size_t shared_bytes = 0;
    int64_t splits = 1, keys_per_split = 0;
};

template <class T, int R, int THREADS, int DV_MAX>
void run_attention(StreamContext& s, AttentionArgs<T> a, bool out_overlaps_v) {
    DeviceContext& dev = device_context(s.device);
    Plan plan;
    for (int bc = R == 8 ? 64 : 32; bc >= 8; bc /= 2) {  // the largest key tile that fits shared memory
        const size_t bytes = attention_shared_bytes(R, a.d, a.dv, bc);
        if (bytes <= dev.max_shared_per_block_optin) {
            plan.bc = bc;
            plan.shared_bytes = bytes;
            break;
        }
    }
    if (!plan.bc)
        throw NotSupported("head dims d=" + std::to_string(a.d) + ", dv=" + std::to_string(a.dv) +
                           " need more shared memory than the device has");
    auto kernel = &attention_kernel<T, R, THREADS, DV_MAX>;
    if (plan.shared_bytes > dev.max_shared_per_block)
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(plan.shared_bytes)));

    // Split the keys when the row tiles alone leave SMs idle (about two blocks per SM), down to one key
    // tile per split (decoding one token: a cache of 1024 keys is 16 tiles, so 16 blocks per kv head).
    const int64_t row_tiles = (a.L * a.G + R - 1) / R, key_tiles = (a.S + plan.bc - 1) / plan.bc;
    const int64_t blocks = row_tiles * a.Hkv, wanted = (2 * int64_t(dev.sm_count) + blocks - 1) / blocks;
    plan.splits = std::max<int64_t>(1, std::min<int64_t>({wanted, key_tiles, 65535}));
    const size_t row_bytes = size_t(a.H) * size_t(a.dv + 2) * sizeof(float);  // partials of one position, one split
    while (plan.splits > 1 && size_t(plan.splits) * row_bytes > s.workspace_bytes) --plan.splits;
    if (size_t(plan.splits) * row_bytes > s.workspace_bytes)
        throw NotSupported("H * dv = " + std::to_string(a.H * a.dv) + " is too large for the attention workspace");
    plan.keys_per_split = (key_tiles + plan.splits - 1) / plan.splits * plan.bc;
    a.keys_per_split = plan.keys_per_split;
    a.bc = plan.bc;

    const dim3 threads(THREADS);
    if (plan.splits == 1 && !out_overlaps_v) {  // the common prefill case: straight to out
        a.row_begin = 0;
        a.n_rows = a.L;
        a.part_acc = a.part_ml = nullptr;
        const dim3 grid(unsigned(row_tiles), unsigned(a.Hkv), 1);
        LLAISYS_LAUNCH(kernel, grid, threads, plan.shared_bytes, s.stream, a);
        return;
    }
    // Through the workspace, as many query positions per launch as fit, the last positions first.
    const int64_t chunk = std::max<int64_t>(1, int64_t(s.workspace_bytes / (size_t(plan.splits) * row_bytes)));
    auto combine = &attention_combine_kernel<T>;
    for (int64_t end = a.L; end > 0; end -= chunk) {
        a.row_begin = std::max<int64_t>(0, end - chunk);
        a.n_rows = end - a.row_begin;
        a.part_acc = static_cast<float*>(s.workspace);
        a.part_ml = a.part_acc + plan.splits * a.n_rows * a.H * a.dv;
        const dim3 grid(unsigned((a.n_rows * a.G + R - 1) / R), unsigned(a.Hkv), unsigned(plan.splits));
        LLAISYS_LAUNCH(kernel, grid, threads, plan.shared_bytes, s.stream, a);
        const int64_t rows = a.n_rows * a.H;
        const unsigned combine_blocks = blocks_for(rows * a.dv, 128, int64_t(dev.sm_count) * 16);
        LLAISYS_LAUNCH(combine, combine_blocks, 128, 0, s.stream, rows, a.dv, int(plan.splits),
                       a.out + a.row_begin * a.H * a.dv, a.part_acc, a.part_ml);
    }
}

template <class T>
void attention(StreamContext& s, AttentionArgs<T> a, bool out_overlaps_v) {
    const bool decode = a.L * a.G <= 8;
    if (a.dv <= 128) {
        if (decode) run_attention<T, 8, 128, 128>(s, a, out_overlaps_v);
        else run_attention<T, 32, 256, 128>(s, a, out_overlaps_v);
    } else if (a.dv <= 256) {
        if (decode) run_attention<T, 8, 128, 256>(s, a, out_overlaps_v);
        else run_attention<T, 32, 256, 256>(s, a, out_overlaps_v);
    } else {
        throw NotSupported("value head dim " + std::to_string(a.dv) + " > 256 is not implemented");
    }
}

}  // namespace
}  // namespace llaisys::cuda

int LLAISYS_FN(self_attention)(int device, void* stream, int dtype, int numerics, int64_t L, int64_t S, int64_t H,
                               int64_t Hkv, int64_t d, int64_t dv, double scale, void* out, const void* q,
                               const void* k, const void* v) {
    using namespace llaisys::cuda;
    return guard("self_attention", [&] {
        // HF's GPU attention (sdpa's flash / memory-efficient / cuDNN kernels) rounds P in its own tiles,
        // which nobody has measured yet; in f32 there is nothing to round, so the hf mode is the exact one
        if (hf_numerics(numerics) && dtype != LLAISYS_F32)
            throw NotSupported("numerics=hf attention in f16 / bf16 is not implemented by this backend (where "
                               "HF's GPU attention kernels round is not measured yet); use numerics=exact");
        StreamContext& s = stream_context(device, stream);
        if (L <= 0 || H <= 0 || dv <= 0) return;
        if (Hkv <= 0 || H % Hkv || S < L || d <= 0)
            throw InvalidArgument("inconsistent shapes L=" + std::to_string(L) + " S=" + std::to_string(S) +
                                  " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv));
        if (Hkv > 65535) throw NotSupported("more than 65535 kv heads");
        dispatch_float(dtype, [&](auto tag) {
            using T = decltype(tag);
            AttentionArgs<T> a{};
            a.L = L, a.S = S, a.H = H, a.Hkv = Hkv, a.G = H / Hkv, a.d = d, a.dv = dv;
            a.scale = float(scale);
            a.q = static_cast<const T*>(q), a.k = static_cast<const T*>(k), a.v = static_cast<const T*>(v);
            a.out = static_cast<T*>(out);
            const auto* o = static_cast<const char*>(out);
            const auto* vb = static_cast<const char*>(v);
            const bool overlaps_v = o < vb + S * Hkv * dv * int64_t(sizeof(T)) && vb < o + L * H * dv * int64_t(sizeof(T));
            attention(s, a, overlaps_v);
        });
    });
}
