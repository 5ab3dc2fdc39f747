// The vector passes of sample.cpp that logprobs.cpp shares (one build per instruction set).
#pragma once

#include <cstdint>

#include "../simd/simd.h"

// Elements per block of sample_exp's partial sums (fixed, so the sums do not depend on the thread count).
constexpr int64_t kSampleBlock = 2048;

// dst[i] = float(src[i]) for an f32 / f16 / bf16 src.
LLAISYS_DECLARE_PER_ISA(void sample_widen(int dtype, int64_t n, const void* src, float* dst))
// p[i] = exp((v[i] - max) / temperature) in f32; block_sums[b] = sum of p over block b (ceil(n / kSampleBlock)).
LLAISYS_DECLARE_PER_ISA(void sample_exp(int64_t n, const float* v, float max, float temperature, float* p,
                                        double* block_sums))
