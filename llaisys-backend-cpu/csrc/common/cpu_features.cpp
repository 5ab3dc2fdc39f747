#include "cpu_features.h"

#include <cstdlib>
#include <cstring>

#include "api.h"

namespace llaisys::cpu {

static Simd detect() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma"))
        return Simd::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return Simd::kAvx2;
#endif
    return Simd::kPortable;
}

static Simd from_env(Simd best) {
    const char* env = std::getenv("LLAISYS_CPU_SIMD");
    if (!env || !*env) return best;
    Simd asked = best;
    if (!std::strcmp(env, "portable")) asked = Simd::kPortable;
    else if (!std::strcmp(env, "avx2")) asked = Simd::kAvx2;
    else if (!std::strcmp(env, "avx512")) asked = Simd::kAvx512;
    return int(asked) < int(best) ? asked : best;
}

Simd simd_level() {
    static const Simd level = from_env(detect());
    return level;
}

const char* simd_name(Simd level) {
    switch (level) {
        case Simd::kAvx512: return "avx512";
        case Simd::kAvx2: return "avx2";
        default: return "portable";
    }
}

}  // namespace llaisys::cpu

LLAISYS_EXPORT const char* llaisys_cpu_simd_level(void) {
    return llaisys::cpu::simd_name(llaisys::cpu::simd_level());
}
