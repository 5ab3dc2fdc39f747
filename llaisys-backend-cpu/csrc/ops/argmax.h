// The argmax of each SIMD build, shared by argmax.cpp's entry point and sample.cpp (its greedy path).
#pragma once

#include <cstdint>

#include "../simd/simd.h"

// Index of the maximum of vals [n] (f32 / f16 / bf16 by dtype), n >= 1: torch.argmax's rules (the first
// index among equal maxima, -0 == +0; NaN counts as the maximum, the first NaN wins).
LLAISYS_DECLARE_PER_ISA(int64_t argmax(int dtype, int64_t n, const void* vals))
