// The 16-bit floating element types as they sit in memory. Conversions to and from f32 are part of the
// SIMD vocabulary (simd/scalar.h), compiled once per instruction set.
#pragma once

#include <cstdint>

namespace llaisys {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

}  // namespace llaisys
