#include "cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include "api.h"

namespace llaisys::cpu {

// Per architecture: detect() (the best level of this CPU) and kLevels (the architecture's levels, lowest first).
#if defined(__aarch64__)
#if defined(__linux__)
// Bits of the kernel's AT_HWCAP and AT_HWCAP2 (<asm/hwcap.h>: HWCAP_ASIMD, HWCAP_ASIMDDP, HWCAP2_BF16; spelt out
// for older C libraries).
static constexpr unsigned long kHwcapAsimd = 1ul << 1, kHwcapAsimdDp = 1ul << 20, kHwcap2Bf16 = 1ul << 14;
#elif defined(__APPLE__)
static bool sysctl_flag(const char* name) {  // hw.optional.* (absent: 0)
    int value = 0;
    size_t size = sizeof(value);
    return sysctlbyname(name, &value, &size, nullptr, 0) == 0 && value != 0;
}
#endif

static Simd detect() {
#if defined(__linux__)
    const unsigned long hwcap = getauxval(AT_HWCAP);
    if (!(hwcap & kHwcapAsimd)) return Simd::kPortable;
    return hwcap & kHwcapAsimdDp ? Simd::kDotprod : Simd::kNeon;
#elif defined(__APPLE__)
    // every Apple arm64 CPU has Advanced SIMD; M1 and later also FEAT_DotProd (hw.optional.arm.*: macOS 12 on)
    return sysctl_flag("hw.optional.arm.FEAT_DotProd") ? Simd::kDotprod : Simd::kNeon;
#else
    return Simd::kNeon;  // Advanced SIMD is part of every armv8-a application profile CPU
#endif
}

// this architecture's levels, lowest first
static constexpr Simd kLevels[] = {Simd::kPortable, Simd::kNeon, Simd::kDotprod};
#else
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

static constexpr Simd kLevels[] = {Simd::kPortable, Simd::kAvx2, Simd::kAvx512};
#endif

// LLAISYS_CPU_SIMD applied to ``best``: one of this architecture's levels up to ``best`` runs; a level above it
// (this CPU lacks it) or another name is reported in one line, and ``best`` runs.
static Simd from_env(Simd best) {
    const char* env = std::getenv("LLAISYS_CPU_SIMD");
    if (!env || !*env) return best;
    char valid[64] = "";
    for (Simd level : kLevels) {
        if (!std::strcmp(env, simd_name(level))) {
            if (int(level) <= int(best)) return level;
            std::fprintf(stderr, "llaisys-backend-cpu: LLAISYS_CPU_SIMD=%s: this CPU lacks it; using %s\n", env,
                         simd_name(best));
            return best;
        }
        std::snprintf(valid + std::strlen(valid), sizeof(valid) - std::strlen(valid), "%s%s", *valid ? ", " : "",
                      simd_name(level));
    }
    std::fprintf(stderr, "llaisys-backend-cpu: ignoring LLAISYS_CPU_SIMD=%s (valid: %s); using %s\n", env, valid,
                 simd_name(best));
    return best;
}

Simd simd_level() {
    static const Simd level = from_env(detect());
    return level;
}

const char* simd_name(Simd level) {
    switch (level) {
#if defined(__aarch64__)
        case Simd::kDotprod: return "dotprod";
        case Simd::kNeon: return "neon";
#else
        case Simd::kAvx512: return "avx512";
        case Simd::kAvx2: return "avx2";
#endif
        default: return "portable";
    }
}

bool has_feature(Feature feature) {
#if defined(__x86_64__) || defined(__i386__)
    static const bool avx512bf16 = [] { __builtin_cpu_init(); return __builtin_cpu_supports("avx512bf16") != 0; }();
    static const bool avx512vnni = [] { __builtin_cpu_init(); return __builtin_cpu_supports("avx512vnni") != 0; }();
    switch (feature) {
        case Feature::kBf16Pairs: return avx512bf16;
        case Feature::kAvx512Vnni: return avx512vnni;
    }
#elif defined(__aarch64__) && defined(__linux__)
    if (feature == Feature::kBf16Pairs) {  // (read once, as the x86-64 answers are: linear asks every call)
        static const bool bf16 = (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
        return bf16;
    }
#elif defined(__aarch64__) && defined(__APPLE__)
    if (feature == Feature::kBf16Pairs) {  // (M2 and later: hw.optional.arm.FEAT_BF16, macOS 12 on)
        static const bool bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
        return bf16;
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
