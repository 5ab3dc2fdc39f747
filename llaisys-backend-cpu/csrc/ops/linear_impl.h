// The linear algorithm, shared by every instruction-set path (see linear.h).
//
// Each ISA file defines a vector-traits struct `Isa` and instantiates run<Isa, Kernel...>() from here.
// Everything lives in an anonymous namespace: each translation unit (compiled with its own -m flags)
// gets a private copy, so no inline function compiled for AVX-512 can be picked by the linker for the
// portable path.
//
// Isa provides:
//   using vec; static constexpr int W;                   // lanes of f32
//   zero(), set1(f), load(const float*|bf16_t*|f16_t*) -> vec (f16/bf16 expanded to f32),
//   fma(a, b, c) = a*b+c, add(a, b), reduce(v) -> float (horizontal sum),
//   store(float*|bf16_t*|f16_t*, vec) (round to nearest even), f16_to_f32(bits), f32_to_f16(f) -> bits,
//   load_n(const T*, n) / store_n(T*, vec, n) for 0 < n < W (the first n lanes; the rest read as 0),
//   transpose(vec (&v)[W])                               // in-register W x W transpose
//
// Batch invariance: row m of out depends on row m of x only, never on M or on the other rows, so a
// sequence's logits are the same whether it runs alone or batched with others (continuous batching) and
// however a prompt is cut into chunks. Both algorithms below compute every output with the same
// arithmetic, that of the GEMM kernel family in use: one f32 chain per output over k in order (one FMA per
// k, or one vdpbf16ps per pair of k), restarted at every KC slice of k, the slices' sums added in order,
// then the bias added and the result rounded once. Tiles, M, threads and prefetching change nothing of it.
//
// Decode (GEMV, M <= 8): memory bound, so every weight row is read exactly once for all M rows of x:
// weight rows in the SIMD lanes, tiles transposed in registers (see gemv).
//
// Prefill (GEMM, M > 8): compute bound, Goto/BLIS blocking. x is packed once per block of rows into
// micro-panels of MR rows ([k][MR]); threads take (N-block, M-block) tiles, pack their weight block per
// KC slice into micro-panels of NR columns ([k][NR]) with in-register transposes (converting f16/bf16 to
// f32 once per slice, not once per use), prefetch the next slice's weights while the MR x NR register-tiled
// micro-kernel runs on this one, accumulate in an f32 tile buffer, and finally add the bias and round once
// to the output dtype. On CPUs with AVX512-BF16 the bf16 GEMM packs (k, k+1) pairs instead and uses
// vdpbf16ps (exact bf16 products, f32 sums): twice the f32 FMA rate.
//
// Numerics: f32 accumulation everywhere; the only rounding to f16/bf16 is the final store.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <type_traits>

#include "../common/api.h"
#include "../common/dtype.h"
#include "linear.h"

namespace llaisys::cpu::linear {
namespace {

#define LLAISYS_INLINE inline __attribute__((always_inline))
#define LLAISYS_ALWAYS_INLINE_LAMBDA __attribute__((always_inline))

// ---- scalar conversions (private copies, see above) -------------------------------------------------

LLAISYS_INLINE float bf16_bits_to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

LLAISYS_INLINE uint16_t f32_to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
    return uint16_t(u >> 16);
}

template <class Isa> LLAISYS_INLINE float scalar_load(const float* p) { return *p; }
template <class Isa> LLAISYS_INLINE float scalar_load(const bf16_t* p) { return bf16_bits_to_f32(p->bits); }
template <class Isa> LLAISYS_INLINE float scalar_load(const f16_t* p) { return Isa::f16_to_f32(p->bits); }
template <class Isa> LLAISYS_INLINE void scalar_store(float* p, float v) { *p = v; }
template <class Isa> LLAISYS_INLINE void scalar_store(bf16_t* p, float v) { p->bits = f32_to_bf16_bits(v); }
template <class Isa> LLAISYS_INLINE void scalar_store(f16_t* p, float v) { p->bits = Isa::f32_to_f16(v); }

// ---- partial vectors (tails) ---------------------------------------------------------------------------
// Isa::load_n / Isa::store_n handle n < W (masked where the ISA can; lanes >= n read as +0.0 and are not
// written). The generic fallback goes through a zeroed stack buffer (0 bits are +0.0 in every dtype).

template <class Isa, class T>
LLAISYS_INLINE typename Isa::vec load_n_via_stack(const T* p, int64_t n) {
    alignas(64) T tmp[Isa::W];
    std::memset(static_cast<void*>(tmp), 0, sizeof(tmp));
    std::memcpy(static_cast<void*>(tmp), p, size_t(n) * sizeof(T));
    return Isa::load(static_cast<const T*>(tmp));
}

template <class Isa, class T>
LLAISYS_INLINE void store_n_via_stack(T* p, typename Isa::vec v, int64_t n) {
    alignas(64) T tmp[Isa::W];
    Isa::store(tmp, v);
    std::memcpy(static_cast<void*>(p), tmp, size_t(n) * sizeof(T));
}

template <class Isa, class T>
LLAISYS_INLINE typename Isa::vec load_n(const T* p, int64_t n) {
    return n >= Isa::W ? Isa::load(p) : Isa::load_n(p, n);
}

template <class Isa, class T>
LLAISYS_INLINE void store_n(T* p, typename Isa::vec v, int64_t n) {
    if (n >= Isa::W) Isa::store(p, v);
    else Isa::store_n(p, v, n);
}

// dst[0, n) = f32(src[0, n))
template <class Isa, class T>
inline void convert_to_f32(const T* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + Isa::W <= n; i += Isa::W) Isa::store(dst + i, Isa::load(src + i));
    if (i < n) store_n<Isa>(dst + i, load_n<Isa>(src + i, n - i), n - i);
}

// out[0, n) = round(acc[0, n) + bias[0, n)); bias may be null
template <class Isa, class T>
inline void store_row(T* out, const float* acc, const T* bias, int64_t n) {
    using V = typename Isa::vec;
    int64_t j = 0;
    for (; j + Isa::W <= n; j += Isa::W) {
        V v = Isa::load(acc + j);
        if (bias) v = Isa::add(v, Isa::load(bias + j));
        Isa::store(out + j, v);
    }
    if (j < n) {
        V v = load_n<Isa>(acc + j, n - j);
        if (bias) v = Isa::add(v, load_n<Isa>(bias + j, n - j));
        store_n<Isa>(out + j, v, n - j);
    }
}

// ---- per-thread scratch, kept between calls (no page faults per call) ---------------------------------

struct Scratch {
    void* ptr = nullptr;
    size_t capacity = 0;
    Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() { std::free(ptr); }
    template <class P>
    P* get(size_t count) {
        size_t bytes = (count * sizeof(P) + 63) & ~size_t(63);
        if (bytes > capacity) {
            std::free(ptr);
            ptr = nullptr;
            capacity = 0;
            ptr = std::aligned_alloc(64, bytes);
            if (!ptr) throw std::bad_alloc();
            capacity = bytes;
        }
        return static_cast<P*>(ptr);
    }
};

// One scratch per (thread, purpose). Threads of the OpenMP pool persist, so this is allocated once.
// Not thread_local inside a template: one instance per TU and slot is what we want.
enum ScratchSlot { kSlotX = 0, kSlotA, kSlotB, kSlotC, kSlotCount };
inline Scratch& scratch(ScratchSlot slot) {
    static thread_local Scratch slots[kSlotCount];
    return slots[slot];
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Exceptions must not leave an OpenMP region: capture the first one and rethrow after it.
struct ErrorSlot {
    std::exception_ptr error;
    template <class F>
    void run(F&& body) noexcept {
        try {
            body();
        } catch (...) {
#pragma omp critical(llaisys_linear_error)
            if (!error) error = std::current_exception();
        }
    }
    void rethrow() {
        if (error) std::rethrow_exception(error);
    }
};

// ====================================== GEMV (decode) ================================================
// M <= kGemvMaxRows: memory bound, every weight row is read once for all M rows of x. Weight rows sit in the
// lanes (W rows per block, blocks shared among the threads); per chunk of W k-steps the W x W weight tile is
// transposed in registers, and each row of x adds x[m][k] * w[rows][k], k in order: exactly the GEMM
// micro-kernel's arithmetic (same chains, restarted at the same KC slices, slices added in the same order,
// bias added and rounded by the same vector code), so the result does not depend on M (see above).
// Kern provides: GemvX (the element type of x in the dot: f32, or bf16 pairs), gemv_x_stride(K),
// gemv_x(x, M, K, buf) -> x in that form, and gemv_block<MM>(w, K, rows, x, ldx, total[MM]).

// The F32 family's block: weights widened to f32, one k per step, Isa::fma(x, w, acc) as in F32Kernel::micro.
template <class Isa, int KC, int MM, class T>
LLAISYS_INLINE void gemv_block_f32(const T* __restrict w, int64_t K, int rows, const float* __restrict x, int64_t ldx,
                                   typename Isa::vec (&total)[MM]) {
    using V = typename Isa::vec;
    constexpr int W = Isa::W;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min<int64_t>(KC, K - k0);
        V acc[MM];
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) acc[m] = Isa::zero();
        for (int64_t kk = 0; kk < kc; kk += W) {
            const int64_t n = std::min<int64_t>(W, kc - kk), k = k0 + kk;
            V t[W];
#pragma GCC unroll 16
            for (int j = 0; j < W; ++j) {
                if (j < rows) {
                    __builtin_prefetch(w + j * K + k + 8 * W);
                    t[j] = load_n<Isa>(w + j * K + k, n);
                } else {
                    t[j] = Isa::zero();
                }
            }
            Isa::transpose(t);  // t[s]: the weights at k + s of the W rows
            auto step = [&](int s) LLAISYS_ALWAYS_INLINE_LAMBDA {
#pragma GCC unroll 8
                for (int m = 0; m < MM; ++m) acc[m] = Isa::fma(Isa::set1(x[m * ldx + k + s]), t[s], acc[m]);
            };
            if (n == W) {  // a whole tile: unrolled, so t stays in registers
#pragma GCC unroll 16
                for (int s = 0; s < W; ++s) step(s);
            } else {
                for (int s = 0; s < n; ++s) step(s);
            }
        }
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) total[m] = k0 == 0 ? acc[m] : Isa::add(acc[m], total[m]);
    }
}

template <class Isa, class Kern, class T>
void gemv(const Args& a) {
    using V = typename Isa::vec;
    using X = typename Kern::GemvX;
    constexpr int W = Isa::W;
    const int64_t M = a.M, N = a.N, K = a.K, ldx = Kern::gemv_x_stride(K);
    const X* xs = Kern::gemv_x(static_cast<const T*>(a.x), M, K, scratch(kSlotX).get<X>(size_t(M * ldx)));
    const T* w = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    const int64_t blocks = ceil_div(N, W);
    const int threads = omp_get_max_threads();
    // Chunks of blocks handed out dynamically (other processes share these cores), several per thread.
    const int64_t chunk = std::clamp<int64_t>(blocks / (int64_t(threads) * 8), 1, 64);
    const bool parallel = threads > 1 && N * K * M >= (int64_t(1) << 16) && blocks > 1;
#pragma omp parallel for schedule(dynamic, chunk) if (parallel)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t n0 = blk * W;
        const int rows = int(std::min<int64_t>(W, N - n0));
        const V b = bias ? load_n<Isa>(bias + n0, rows) : Isa::zero();
        for (int64_t m0 = 0; m0 < M; m0 += kGemvMaxRows) {
            auto group = [&](auto mm) {
                constexpr int MM = decltype(mm)::value;
                V total[MM];
                for (int m = 0; m < MM; ++m) total[m] = Isa::zero();  // (set by gemv_block; K > 0 here)
                Kern::template gemv_block<MM>(w + n0 * K, K, rows, xs + m0 * ldx, ldx, total);
                for (int m = 0; m < MM; ++m)
                    store_n<Isa>(out + (m0 + m) * N + n0, bias ? Isa::add(total[m], b) : total[m], rows);
            };
            switch (std::min<int64_t>(M - m0, kGemvMaxRows)) {
                case 1: group(std::integral_constant<int, 1>{}); break;
                case 2: group(std::integral_constant<int, 2>{}); break;
                case 3: group(std::integral_constant<int, 3>{}); break;
                case 4: group(std::integral_constant<int, 4>{}); break;
                case 5: group(std::integral_constant<int, 5>{}); break;
                case 6: group(std::integral_constant<int, 6>{}); break;
                case 7: group(std::integral_constant<int, 7>{}); break;
                default: group(std::integral_constant<int, 8>{}); break;
            }
        }
    }
}

// ====================================== GEMM (prefill) ===============================================

// dst[s][L] (s < steps) = value s of row j (j < rows; zero for j >= rows), through W x W in-register
// transposes. row(j, s0, n) returns values [s0, s0 + n) of row j as a vector (n <= W, zero beyond n).
// Values are 32-bit: f32, or (for the bf16 dot kernel) pairs of bf16 carried in f32 registers.
template <class Isa, int L, class Row>
LLAISYS_INLINE void pack_transposed(int rows, int64_t steps, void* dst_, Row&& row) {
    using V = typename Isa::vec;
    constexpr int W = Isa::W;
    float* dst = static_cast<float*>(dst_);
    for (int64_t s0 = 0; s0 < steps; s0 += W) {
        const int64_t n = std::min<int64_t>(W, steps - s0);
        for (int j0 = 0; j0 < L; j0 += W) {
            const int cols = std::min(W, L - j0);
            V v[W];
            for (int j = 0; j < W; ++j) v[j] = j0 + j < rows ? row(j0 + j, s0, n) : Isa::zero();
            Isa::transpose(v);
            float* d = dst + s0 * L + j0;
            if (cols == W) {
                for (int64_t i = 0; i < n; ++i) Isa::store(d + i * L, v[i]);
            } else {
                for (int64_t i = 0; i < n; ++i) store_n<Isa>(d + i * L, v[i], cols);
            }
        }
    }
}

// The f32 micro-kernel family: packed A [ks][MR] f32, packed B [ks][NR] f32, NR = NV vectors.
// c (ldc) receives the MR x NR tile: c = A*B (accumulate=false) or c += A*B.
template <class Isa, int MR_, int NV_, int KC_, int NC_>
struct F32Kernel {
    using P = float;
    static constexpr int MR = MR_, NR = NV_ * Isa::W, KU = 1, KC = KC_, NC = NC_;

    static void micro(int64_t ks, const P* __restrict a, const P* __restrict b, float* __restrict c, int64_t ldc,
                      bool accumulate) {
        using V = typename Isa::vec;
        constexpr int W = Isa::W;
        V acc[MR][NV_];
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int v = 0; v < NV_; ++v) acc[i][v] = Isa::zero();
        for (int64_t k = 0; k < ks; ++k) {
            V bv[NV_];
#pragma GCC unroll 4
            for (int v = 0; v < NV_; ++v) bv[v] = Isa::load(b + v * W);
#pragma GCC unroll 16
            for (int i = 0; i < MR; ++i) {
                V ai = Isa::set1(a[i]);
#pragma GCC unroll 4
                for (int v = 0; v < NV_; ++v) acc[i][v] = Isa::fma(ai, bv[v], acc[i][v]);
            }
            a += MR;
            b += NR;
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
            for (int v = 0; v < NV_; ++v) {
                float* p = c + i * ldc + v * W;
                Isa::store(p, accumulate ? Isa::add(acc[i][v], Isa::load(p)) : acc[i][v]);
            }
    }

    // The GEMV in this kernel's arithmetic (see gemv below): x as f32 rows.
    using GemvX = float;
    static int64_t gemv_x_stride(int64_t K) { return K; }
    template <class T>
    static const float* gemv_x(const T* x, int64_t M, int64_t K, float* buf) {
        if constexpr (std::is_same_v<T, float>) {
            return x;
        } else {
            convert_to_f32<Isa>(x, buf, M * K);
            return buf;
        }
    }
    template <int MM, class T>
    static void gemv_block(const T* w, int64_t K, int rows, const float* x, int64_t ldx,
                           typename Isa::vec (&total)[MM]) {
        gemv_block_f32<Isa, KC, MM>(w, K, rows, x, ldx, total);
    }

    // dst [kc][MR]: rows [0, rows) of src (stride ld), k in [0, kc), as f32; missing rows are zero.
    template <class T>
    static void pack_a(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_transposed<Isa, MR>(rows, kc, dst, [&](int j, int64_t k0, int64_t n) {
            return load_n<Isa>(src + j * ld + k0, n);
        });
    }
    // dst [kc][NR] from weight rows [0, rows) (stride ld), k in [0, kc); missing rows are zero.
    template <class T>
    static void pack_b(const T* src, int64_t ld, int rows, int64_t kc, P* dst) {
        pack_transposed<Isa, NR>(rows, kc, dst, [&](int j, int64_t k0, int64_t n) {
            const T* p = src + j * ld + k0;
            __builtin_prefetch(p + 8 * Isa::W);  // weights stream from memory: one row = one stream
            return load_n<Isa>(p, n);
        });
    }
};

// Prefetches `rows` rows of `row_bytes` bytes (stride ld_bytes) into L2, a share per step() over `steps` calls.
struct RowPrefetcher {
    const char* base = nullptr;
    int64_t ld = 0, rows = 0, row_bytes = 0, per_step = 0, r = 0, off = 0;
    RowPrefetcher() = default;
    RowPrefetcher(const void* p, int64_t ld_bytes, int64_t nrows, int64_t nbytes, int64_t steps)
        : base(static_cast<const char*>(p)), ld(ld_bytes), rows(nrows), row_bytes(nbytes) {
        per_step = ceil_div(rows * ceil_div(row_bytes, 64), std::max<int64_t>(steps, 1)) + 1;
    }
    LLAISYS_INLINE void step() {
        for (int64_t i = 0; i < per_step && r < rows; ++i) {
            __builtin_prefetch(base + r * ld + off, 0, 2);
            off += 64;
            if (off >= row_bytes) {
                off = 0;
                ++r;
            }
        }
    }
};

template <class Isa, class Kern, class T>
void gemm(const Args& a) {
    using P = typename Kern::P;
    constexpr int MR = Kern::MR, NR = Kern::NR, KU = Kern::KU;
    const int64_t M = a.M, N = a.N, K = a.K;
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.weight);
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);

    const int64_t Ks = ceil_div(K, KU);                    // packed k steps of the whole K
    const int64_t kc_steps = std::min<int64_t>(Ks, Kern::KC / KU);  // k steps per KC slice
    const int threads = omp_get_max_threads();
    // Rows of x packed at once (bounded memory: <= ~16 MiB of packed x), a multiple of MR.
    const int64_t ms_cap = std::max<int64_t>(MR * 4, ((int64_t(16) << 20) / (Ks * KU * int64_t(sizeof(P)) + 1)) / MR * MR);
    const bool parallel = threads > 1 && M * N * K >= (int64_t(1) << 18);

    for (int64_t m0 = 0; m0 < M; m0 += ms_cap) {
        const int64_t ms = std::min(ms_cap, M - m0);
        const int64_t panels = ceil_div(ms, MR);
        P* apack = scratch(kSlotA).get<P>(size_t(panels * Ks * MR));

        // Tiles: NC columns x MT panels of rows. Shrink until every thread gets a few tiles.
        int64_t nc = std::min<int64_t>(Kern::NC, round_up(N, NR));
        int64_t mt = panels;
        auto tiles = [&] { return ceil_div(N, nc) * ceil_div(panels, mt); };
        const int64_t want = parallel ? int64_t(threads) * 3 : 1;
        while (tiles() < want) {
            if (nc > 4 * NR && (nc >= mt * MR || mt <= 2)) nc = round_up(nc / 2, NR);
            else if (mt > 2) mt = ceil_div(mt, 2);
            else break;
        }
        const int64_t n_tiles = ceil_div(N, nc), m_tiles = ceil_div(panels, mt), total_tiles = n_tiles * m_tiles;
        std::atomic<int64_t> next_tile{0};

        ErrorSlot err;
#pragma omp parallel if (parallel)
        {
            // Allocate first; every thread then enters every worksharing loop (skipping the work if its
            // allocation failed), so an exception can never leave a thread waiting at a barrier.
            P* bpack = nullptr;
            float* cbuf = nullptr;
            const int64_t ldc = nc;
            err.run([&] {
                bpack = scratch(kSlotB).get<P>(size_t(nc * kc_steps));
                cbuf = scratch(kSlotC).get<float>(size_t(mt * MR * ldc));
            });
            const bool ok = bpack && cbuf;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; ++p) {
                if (!ok) continue;
                const int64_t r0 = m0 + p * MR;
                Kern::pack_a(x + r0 * K, K, int(std::min<int64_t>(MR, M - r0)), K, apack + p * Ks * MR);
            }
            // (implicit barrier: apack is complete)
            // Tiles are claimed one at a time from a shared counter (other processes may hold a core),
            // and the next one is claimed before the last slice of the current one, so that slice can
            // prefetch the next tile's first weight slice.
            int64_t t = ok ? next_tile.fetch_add(1, std::memory_order_relaxed) : total_tiles;
            while (t < total_tiles) {
                int64_t t_next = total_tiles;
                const int64_t jt = t / m_tiles, it = t % m_tiles;
                const int64_t n0 = jt * nc, ncols = std::min(nc, N - n0);
                const int64_t p0 = it * mt, np = std::min(mt, panels - p0);
                const int64_t jpanels = ceil_div(ncols, NR);
                for (int64_t s0 = 0; s0 < Ks; s0 += kc_steps) {
                    const int64_t ks = std::min(kc_steps, Ks - s0);
                    const int64_t k0 = s0 * KU, kc = std::min(ks * KU, K - k0);
                    for (int64_t jp = 0; jp < jpanels; ++jp) {
                        const int64_t r = n0 + jp * NR;
                        Kern::pack_b(w + r * K + k0, K, int(std::min<int64_t>(NR, N - r)), kc,
                                     bpack + jp * ks * NR);
                    }
                    // While this slice computes, pull the weights of the next slice (or of the next tile's
                    // first slice) towards L2, spread over the micro-kernel calls: packing then reads from
                    // cache instead of waiting on DRAM.
                    RowPrefetcher next;
                    if (s0 + ks < Ks) {
                        const int64_t next_k0 = k0 + kc, next_kc = std::min(kc_steps * KU, K - next_k0);
                        next = RowPrefetcher(w + n0 * K + next_k0, K * int64_t(sizeof(T)), ncols,
                                             next_kc * int64_t(sizeof(T)), np * jpanels);
                    } else {
                        t_next = next_tile.fetch_add(1, std::memory_order_relaxed);
                        if (t_next < total_tiles) {
                            const int64_t next_n0 = (t_next / m_tiles) * nc;
                            next = RowPrefetcher(w + next_n0 * K, K * int64_t(sizeof(T)), std::min(nc, N - next_n0),
                                                 std::min(kc_steps * KU, K) * int64_t(sizeof(T)), np * jpanels);
                        }
                    }
                    for (int64_t ip = 0; ip < np; ++ip) {
                        const P* ap = apack + ((p0 + ip) * Ks + s0) * MR;
                        for (int64_t jp = 0; jp < jpanels; ++jp) {
                            next.step();
                            Kern::micro(ks, ap, bpack + jp * ks * NR, cbuf + ip * MR * ldc + jp * NR, ldc, s0 > 0);
                        }
                    }
                }
                const int64_t rows = std::min(np * MR, ms - p0 * MR);
                for (int64_t i = 0; i < rows; ++i) {
                    const int64_t row = m0 + p0 * MR + i;
                    store_row<Isa>(out + row * N + n0, cbuf + i * ldc, bias ? bias + n0 : nullptr, ncols);
                }
                t = t_next;
            }
        }
        err.rethrow();
    }
}

// out = bias (or 0) when K == 0
template <class Isa, class T>
void empty_k(const Args& a) {
    const T* bias = static_cast<const T*>(a.bias);
    T* out = static_cast<T*>(a.out);
    for (int64_t m = 0; m < a.M; ++m)
        for (int64_t n = 0; n < a.N; ++n) scalar_store<Isa>(out + m * a.N + n, bias ? scalar_load<Isa>(bias + n) : 0.0f);
}

// The whole op for one dtype: picks GEMV or GEMM by M (or the forced path); both run Kern's arithmetic.
template <class Isa, class Kern, class T>
void run_typed(const Args& a) {
    if (a.K == 0) return empty_k<Isa, T>(a);
    const int forced = forced_path();
    const bool use_gemv = forced == 1 || (forced == 0 && a.M <= kGemvMaxRows);
    if (use_gemv) gemv<Isa, Kern, T>(a);
    else gemm<Isa, Kern, T>(a);
}

#undef LLAISYS_INLINE
#undef LLAISYS_ALWAYS_INLINE_LAMBDA

}  // namespace
}  // namespace llaisys::cpu::linear
