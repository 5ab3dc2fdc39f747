// What the CPU can run: the SIMD level the kernels take (detected once, capped by
// LLAISYS_CPU_SIMD=portable|avx2|avx512 on x86-64, portable|neon|dotprod on AArch64) and single features that
// some kernels use when present.
#pragma once

namespace llaisys::cpu {

// The levels of x86-64 (portable < avx2 < avx512) and of AArch64 (portable < neon < dotprod); a process only
// ever sees its own architecture's. AArch64: neon is Advanced SIMD (every armv8-a CPU: Cortex-A53 on); dotprod
// adds sdot / udot (armv8.2-a's FEAT_DotProd: Cortex-A55 / A76 and later, Neoverse N1 / V1 / N2, Graviton 2 to
// 4, Apple M1 on), which the int8 and block-quantized linears use for their byte dot products.
enum class Simd : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kNeon = 3, kDotprod = 4 };

// Best level both the CPU and LLAISYS_CPU_SIMD allow (read once per process; a level above the CPU's is
// capped to the CPU's; an unknown value of LLAISYS_CPU_SIMD, such as another architecture's level, is
// reported on stderr once and ignored).
Simd simd_level();
const char* simd_name(Simd level);

// Extensions beyond a SIMD level, used by kernels that check them at run time (e.g. linear's bf16 dot
// products). Each answer is cached.
enum class Feature : int {
    kBf16Pairs,   // bf16 pair dot products into f32 lanes: AVX512-BF16 (vdpbf16ps), AArch64 FEAT_BF16 (bfdot)
    kAvx512Vnni,  // vpdpbusd (int8 dot products)
};
bool has_feature(Feature feature);

// A run-time switch that is on unless the environment variable `name` is "0" (read by the caller once).
bool env_switch_on(const char* name);

}  // namespace llaisys::cpu
