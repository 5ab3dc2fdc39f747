// What the CPU can run: the SIMD level the kernels take (detected once, capped by
// LLAISYS_CPU_SIMD=portable|avx2|avx512) and single features that some kernels use when present.
#pragma once

namespace llaisys::cpu {

enum class Simd : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// Best level both the CPU and LLAISYS_CPU_SIMD allow (read once per process; an unknown value of
// LLAISYS_CPU_SIMD is reported on stderr once and ignored).
Simd simd_level();
const char* simd_name(Simd level);

// Extensions beyond a SIMD level, used by kernels that check them at run time (e.g. linear's bf16 dot
// products). Each answer is cached.
enum class Feature : int {
    kAvx512Bf16,  // vdpbf16ps, vcvtne2ps2bf16
    kAvx512Vnni,  // vpdpbusd (int8 dot products)
};
bool has_feature(Feature feature);

// A run-time switch that is on unless the environment variable `name` is "0" (read by the caller once).
bool env_switch_on(const char* name);

}  // namespace llaisys::cpu
