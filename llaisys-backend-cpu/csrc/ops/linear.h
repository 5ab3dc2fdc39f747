// linear: out[M, N] = x[M, K] @ weight[N, K]^T + bias[N] (f32 / f16 / bf16, f32 accumulation).
//
// linear.cpp: each build's configuration (vector type, register tiles) and the exported entry point;
// linear_dot.h: the algorithm (every output a dot product of two contiguous rows, in one fixed order, so a
// row of out never depends on the other rows of x). Shared pieces (also used by linear_i8) are below.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "../simd/simd.h"

namespace llaisys::cpu {

struct LinearArgs {
    int dtype;                 // LLAISYS_F32 / _F16 / _BF16
    int64_t M, N, K;
    void* out;                 // [M, N]
    const void* x;             // [M, K]
    const void* weight;        // [N, K]
    const void* bias;          // [N] or nullptr
};

// linear_i8 runs up to this many rows of x against each block of weight rows at once.
constexpr int64_t kGemvMaxRows = 8;

// Knob read once per process from the environment (tests use it to reach every path):
//   LLAISYS_CPU_LINEAR_BF16DOT=0   bf16 without AVX512-BF16 (vdpbf16ps) even where the CPU has it: the f32
//                                  chain on widened values, as on older CPUs
bool linear_bf16dot_allowed();

}  // namespace llaisys::cpu

LLAISYS_DECLARE_PER_ISA(void linear(const LinearArgs& args))

namespace llaisys::cpu::LLAISYS_ISA {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// K == 0: every row of out [M, N] is the bias, or 0 (all-zero bits in every dtype).
template <class T>
void fill_rows_with_bias(T* out, const T* bias, int64_t M, int64_t N) {
    for (int64_t m = 0; m < M; ++m) {
        if (bias) std::memcpy(out + m * N, bias, sizeof(T) * size_t(N));
        else std::memset(out + m * N, 0, sizeof(T) * size_t(N));
    }
}

// ---- per-thread scratch, kept between calls (no page faults per call) ---------------------------------

class Scratch {
  public:
    Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() { std::free(ptr_); }
    template <class P>
    P* get(size_t count) {
        const size_t bytes = (count * sizeof(P) + 63) & ~size_t(63);
        if (bytes > capacity_) {
            std::free(ptr_);
            capacity_ = 0;
            ptr_ = std::aligned_alloc(64, bytes);
            if (!ptr_) throw std::bad_alloc();
            capacity_ = bytes;
        }
        return static_cast<P*>(ptr_);
    }

  private:
    void* ptr_ = nullptr;
    size_t capacity_ = 0;
};

// One scratch per (thread, purpose). The thread team's threads persist, so this is allocated once.
enum ScratchSlot { kSlotX = 0, kSlotCarry, kSlotMoeRows, kSlotMoeOut, kSlotMoeIndex, kSlotLora, kSlotCount };
inline Scratch& scratch(ScratchSlot slot) {
    static thread_local Scratch slots[kSlotCount];
    return slots[slot];
}

}  // namespace llaisys::cpu::LLAISYS_ISA
