#include "cpu_features.h"

#include <cstdio>
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
    for (Simd level : {Simd::kPortable, Simd::kAvx2, Simd::kAvx512})
        if (!std::strcmp(env, simd_name(level))) return int(level) < int(best) ? level : best;
    std::fprintf(stderr, "llaisys-backend-cpu: ignoring LLAISYS_CPU_SIMD=%s (valid: portable, avx2, avx512); using %s\n",
                 env, simd_name(best));
    return best;
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

bool has_feature(Feature feature) {
#if defined(__x86_64__) || defined(__i386__)
    static const bool avx512bf16 = [] { __builtin_cpu_init(); return __builtin_cpu_supports("avx512bf16") != 0; }();
    static const bool avx512vnni = [] { __builtin_cpu_init(); return __builtin_cpu_supports("avx512vnni") != 0; }();
    switch (feature) {
        case Feature::kAvx512Bf16: return avx512bf16;
        case Feature::kAvx512Vnni: return avx512vnni;
    }
#endif
    (void)feature;
    return false;
}

bool env_switch_on(const char* name) {
    const char* v = std::getenv(name);
    return !(v && !std::strcmp(v, "0"));
}

}  // namespace llaisys::cpu

LLAISYS_EXPORT const char* LLAISYS_FN(simd_level)(void) {
    return llaisys::cpu::simd_name(llaisys::cpu::simd_level());
}
