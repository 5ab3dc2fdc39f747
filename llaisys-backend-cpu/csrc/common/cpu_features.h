// Which SIMD path the kernels take: detected once, capped by LLAISYS_CPU_SIMD=portable|avx2|avx512.
#pragma once

namespace llaisys::cpu {

enum class Simd : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// Best level both the CPU and LLAISYS_CPU_SIMD allow (read once per process).
Simd simd_level();
const char* simd_name(Simd level);

}  // namespace llaisys::cpu
