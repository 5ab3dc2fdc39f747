// Op conformance driver for a cross-built CPU backend library, run under user-mode emulation (qemu-aarch64) by
// tests/backends/cpu/test_aarch64.py. It goes through the library's plain C ABI only (llaisys/backend.h), so it
// needs no Python for the target architecture.
//
//     driver LIB REF_LIB EXPECTED_LEVEL     run every case; exit status 0 iff all pass and LIB runs EXPECTED_LEVEL
//     driver --level LIB                     print the SIMD level LIB picks in this process (LLAISYS_CPU_SIMD applies)
//
// REF_LIB is a copy of LIB under another name (dlopen loads a path once): it is loaded with LLAISYS_CPU_SIMD=portable,
// so its kernels are the portable build (lane loops, no fused products, the x86-64 portable arithmetic), and LIB,
// loaded after the variable is restored, runs the level the CPU (qemu's -cpu) reports. Every case draws random inputs
// (fixed seeds), runs the op in both libraries and compares each output within a per-dtype tolerance (integer outputs
// exactly); add, swiglu, rms_norm and linear are also compared with a double-precision reference computed here, so a
// fault shared by both builds shows too. First, the shared-memory collectives run between this process and a forked
// one. Output: one line per case, then a summary line.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#define LLAISYS_PREFIX llaisys_cpu
#include "llaisys/backend.h"

namespace {

// ---- the two libraries ------------------------------------------------------------------------------------

struct Lib {
    void* handle = nullptr;
    std::string path;
    void* sym(const char* name) const {
        void* p = dlsym(handle, name);
        if (!p) {
            std::fprintf(stderr, "driver: %s has no symbol %s\n", path.c_str(), name);
            std::exit(2);
        }
        return p;
    }
    std::string level() const {
        return reinterpret_cast<const char* (*)()>(sym("llaisys_cpu_simd_level"))();
    }
    std::string last_error() const { return reinterpret_cast<const char* (*)()>(sym("llaisys_cpu_last_error"))(); }
};

Lib open_lib(const char* path) {
    Lib lib;
    lib.path = path;
    lib.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib.handle) {
        std::fprintf(stderr, "driver: cannot load %s: %s\n", path, dlerror());
        std::exit(2);
    }
    return lib;
}

// The slot `name` of lib, typed as backend.h declares it.
#define FN(lib, name) reinterpret_cast<decltype(&llaisys_cpu_##name)>((lib).sym("llaisys_cpu_" #name))

// ---- numbers ----------------------------------------------------------------------------------------------

uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint16_t to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
    return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
float from_bf16(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
uint16_t to_f16(float f) {  // round to nearest even (inputs here are normal, in range)
    const uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
    if (a < 0x38800000u) {
        const float v = bits_f32(a) * 16777216.0f;
        uint32_t m = uint32_t(v);
        const float rem = v - float(m);
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
        return uint16_t(sign | m);
    }
    const uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
}
float from_f16(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, em = h & 0x7fffu;
    float mag;
    if (em >= 0x7c00u) mag = bits_f32((em << 13) | 0x7f800000u);
    else if (em >= 0x0400u) mag = bits_f32((em << 13) + (112u << 23));
    else mag = float(em) * 0x1p-24f;
    return bits_f32(f32_bits(mag) | sign);
}

size_t dtype_size(int dtype) {
    switch (dtype) {
        case LLAISYS_F32: case LLAISYS_I32: return 4;
        case LLAISYS_F16: case LLAISYS_BF16: return 2;
        case LLAISYS_I64: case LLAISYS_F64: return 8;
        default: return 1;
    }
}
const char* dtype_name(int dtype) {
    switch (dtype) {
        case LLAISYS_F32: return "f32";
        case LLAISYS_F16: return "f16";
        case LLAISYS_BF16: return "bf16";
        case LLAISYS_I64: return "i64";
        case LLAISYS_I32: return "i32";
        default: return "?";
    }
}

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1p-53; }
    int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

using Bytes = std::vector<uint8_t>;

// n floating values in dtype, uniform in [lo, hi) (then rounded to dtype)
Bytes floats(int dtype, size_t n, Rng& rng, double lo = -1.0, double hi = 1.0) {
    Bytes b(n * dtype_size(dtype));
    for (size_t i = 0; i < n; ++i) {
        const float v = float(rng.uniform(lo, hi));
        if (dtype == LLAISYS_F32) std::memcpy(&b[i * 4], &v, 4);
        else {
            const uint16_t h = dtype == LLAISYS_F16 ? to_f16(v) : to_bf16(v);
            std::memcpy(&b[i * 2], &h, 2);
        }
    }
    return b;
}
double value_at(int dtype, const Bytes& b, size_t i) {
    switch (dtype) {
        case LLAISYS_F32: { float f; std::memcpy(&f, &b[i * 4], 4); return f; }
        case LLAISYS_F16: { uint16_t h; std::memcpy(&h, &b[i * 2], 2); return from_f16(h); }
        case LLAISYS_BF16: { uint16_t h; std::memcpy(&h, &b[i * 2], 2); return from_bf16(h); }
        case LLAISYS_I64: { int64_t v; std::memcpy(&v, &b[i * 8], 8); return double(v); }
        case LLAISYS_I32: { int32_t v; std::memcpy(&v, &b[i * 4], 4); return double(v); }
        default: return double(b[i]);
    }
}
std::vector<double> values(int dtype, const Bytes& b) {
    std::vector<double> v(b.size() / dtype_size(dtype));
    for (size_t i = 0; i < v.size(); ++i) v[i] = value_at(dtype, b, i);
    return v;
}
template <class T>
Bytes pod(const std::vector<T>& v) {
    Bytes b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}
Bytes f16_values(size_t n, Rng& rng, double lo, double hi) { return floats(LLAISYS_F16, n, rng, lo, hi); }
Bytes random_bytes(size_t n, Rng& rng) {
    Bytes b(n);
    for (auto& x : b) x = uint8_t(rng.next());
    return b;
}

// ---- cases ------------------------------------------------------------------------------------------------

// One output of an op: its dtype, element count, the initial contents (NaN-filled when empty) and the tolerance
// against the reference library: |got - ref| <= atol * max|ref| + rtol * |ref| (integer outputs: equal).
struct Out {
    int dtype;
    size_t n;
    Bytes init = {};
    double rtol = -1, atol = -1;  // < 0: by dtype
};

void tolerance(int dtype, double& rtol, double& atol) {
    switch (dtype) {
        case LLAISYS_F32: rtol = 2e-5, atol = 2e-5; break;
        case LLAISYS_F16: rtol = 2e-3, atol = 1e-3; break;
        case LLAISYS_BF16: rtol = 1.6e-2, atol = 8e-3; break;
        default: rtol = 0, atol = 0;
    }
}

int g_cases = 0, g_failed = 0;
Lib g_ref, g_test;

Bytes filled(const Out& o) {
    if (!o.init.empty()) return o.init;
    Bytes b(o.n * dtype_size(o.dtype));
    if (o.dtype == LLAISYS_F32) for (size_t i = 0; i < o.n; ++i) { const float q = NAN; std::memcpy(&b[i * 4], &q, 4); }
    else if (o.dtype == LLAISYS_F16) for (size_t i = 0; i < o.n; ++i) { const uint16_t q = 0x7e00; std::memcpy(&b[i * 2], &q, 2); }
    else if (o.dtype == LLAISYS_BF16) for (size_t i = 0; i < o.n; ++i) { const uint16_t q = 0x7fc0; std::memcpy(&b[i * 2], &q, 2); }
    else std::memset(b.data(), 0x5a, b.size());
    return b;
}

bool compare(const std::string& what, int dtype, const std::vector<double>& got, const std::vector<double>& ref,
             double rtol, double atol, std::string& detail) {
    double scale = 0;
    for (double r : ref) if (std::isfinite(r)) scale = std::fmax(scale, std::fabs(r));
    for (size_t i = 0; i < ref.size(); ++i) {
        const double g = got[i], r = ref[i];
        if (std::isnan(r) && std::isnan(g)) continue;
        if (g == r) continue;
        if (std::fabs(g - r) <= atol * scale + rtol * std::fabs(r)) continue;
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s (%s) element %zu of %zu: got %.9g, expected %.9g (max |ref| %.3g)",
                      what.c_str(), dtype_name(dtype), i, ref.size(), g, r, scale);
        detail = buf;
        return false;
    }
    return true;
}

// Runs `run` (which calls the op of the library it is given on the output buffers) in both libraries and
// compares; `exact` (optional) gives a double-precision reference for output 0, compared with the same rule.
using Run = std::function<int(const Lib&, std::vector<Bytes>&)>;
using Exact = std::function<std::vector<double>()>;

void check(const std::string& name, const std::vector<Out>& outs, const Run& run, const Exact& exact = nullptr,
           double exact_rtol = -1, double exact_atol = -1) {
    ++g_cases;
    std::vector<Bytes> ref_out, test_out;
    for (const Out& o : outs) ref_out.push_back(filled(o)), test_out.push_back(filled(o));
    std::string detail;
    bool ok = true;
    if (int st = run(g_ref, ref_out)) {
        ok = false, detail = "reference library: status " + std::to_string(st) + ": " + g_ref.last_error();
    } else if (int st2 = run(g_test, test_out)) {
        ok = false, detail = "status " + std::to_string(st2) + ": " + g_test.last_error();
    }
    for (size_t i = 0; ok && i < outs.size(); ++i) {
        double rtol, atol;
        tolerance(outs[i].dtype, rtol, atol);
        if (outs[i].rtol >= 0) rtol = outs[i].rtol, atol = outs[i].atol;
        const auto got = values(outs[i].dtype, test_out[i]), ref = values(outs[i].dtype, ref_out[i]);
        ok = compare("output " + std::to_string(i) + " vs the portable build", outs[i].dtype, got, ref, rtol, atol, detail);
    }
    if (ok && exact) {
        const std::vector<double> want = exact();
        double rtol, atol;
        tolerance(outs[0].dtype, rtol, atol);
        if (exact_rtol >= 0) rtol = exact_rtol, atol = exact_atol;
        for (auto* out : {&test_out, &ref_out}) {
            const auto got = values(outs[0].dtype, (*out)[0]);
            if (!(ok = compare(out == &test_out ? "output 0 vs float64" : "portable output 0 vs float64", outs[0].dtype,
                               got, want, rtol, atol, detail)))
                break;
        }
    }
    if (!ok) ++g_failed;
    std::printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name.c_str(), ok ? "" : ": ", detail.c_str());
    std::fflush(stdout);
}

std::string tag(const char* op, int dtype, const std::string& rest = "") {
    return std::string(op) + " " + dtype_name(dtype) + (rest.empty() ? "" : " " + rest);
}
std::string dims(std::initializer_list<int64_t> v) {
    std::string s;
    for (int64_t x : v) s += (s.empty() ? "" : "x") + std::to_string(x);
    return s;
}

const int kFloat[] = {LLAISYS_F32, LLAISYS_F16, LLAISYS_BF16};

// ---- the ops ----------------------------------------------------------------------------------------------

void elementwise() {
    for (int dt : kFloat)
        for (int64_t n : {1, 3, 17, 4097}) {
            Rng rng(uint64_t(n) * 7 + dt);
            const Bytes a = floats(dt, n, rng), b = floats(dt, n, rng);
            check(tag("add", dt, std::to_string(n)), {{dt, size_t(n)}},
                  [&](const Lib& l, std::vector<Bytes>& o) { return FN(l, add)(0, nullptr, dt, n, o[0].data(), a.data(), b.data()); },
                  [&] {
                      std::vector<double> r(n);
                      for (int64_t i = 0; i < n; ++i) r[i] = value_at(dt, a, i) + value_at(dt, b, i);
                      return r;
                  }, dt == LLAISYS_F32 ? 1e-7 : dt == LLAISYS_F16 ? 1e-3 : 4e-3, 0);
            check(tag("scale", dt, std::to_string(n)), {{dt, size_t(n)}},
                  [&](const Lib& l, std::vector<Bytes>& o) { return FN(l, scale)(0, nullptr, dt, n, 1.7, o[0].data(), a.data()); });
            for (int num : {LLAISYS_NUMERICS_EXACT, LLAISYS_NUMERICS_HF}) {
                const std::string mode = num ? " hf" : "";
                const Bytes g = floats(dt, n, rng, -8, 8);
                check(tag("swiglu", dt, std::to_string(n) + mode), {{dt, size_t(n)}},
                      [&](const Lib& l, std::vector<Bytes>& o) { return FN(l, swiglu)(0, nullptr, dt, num, n, o[0].data(), g.data(), a.data()); },
                      [&] {
                          std::vector<double> r(n);
                          for (int64_t i = 0; i < n; ++i) {
                              const double x = value_at(dt, g, i);
                              r[i] = value_at(dt, a, i) * x / (1 + std::exp(-x));
                          }
                          return r;
                      }, num ? 2e-2 : -1, num ? 1e-2 : -1);
                check(tag("geglu_tanh", dt, std::to_string(n) + mode), {{dt, size_t(n)}},
                      [&](const Lib& l, std::vector<Bytes>& o) { return FN(l, geglu_tanh)(0, nullptr, dt, num, n, o[0].data(), g.data(), a.data()); });
            }
        }
}

void norms_and_rope() {
    for (int dt : kFloat)
        for (int num : {LLAISYS_NUMERICS_EXACT, LLAISYS_NUMERICS_HF})
            for (int64_t dim : {17, 300}) {
                const int64_t rows = 3;
                Rng rng(uint64_t(dim) + dt * 31 + num);
                const Bytes x = floats(dt, rows * dim, rng, -3, 3), w = floats(dt, dim, rng, 0.5, 1.5);
                check(tag("rms_norm", dt, dims({rows, dim}) + (num ? " hf" : "")), {{dt, size_t(rows * dim)}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, rms_norm)(0, nullptr, dt, num, dt, rows, dim, 1e-6, o[0].data(), x.data(), w.data());
                      },
                      [&] {
                          std::vector<double> r(rows * dim);
                          for (int64_t i = 0; i < rows; ++i) {
                              double ss = 0;
                              for (int64_t j = 0; j < dim; ++j) ss += value_at(dt, x, i * dim + j) * value_at(dt, x, i * dim + j);
                              const double inv = 1 / std::sqrt(ss / dim + 1e-6);
                              for (int64_t j = 0; j < dim; ++j) r[i * dim + j] = value_at(dt, x, i * dim + j) * inv * value_at(dt, w, j);
                          }
                          return r;
                      }, num && dt != LLAISYS_F32 ? 2e-2 : -1, num && dt != LLAISYS_F32 ? 1e-2 : -1);
                const int64_t seq = 5, heads = 3, hd = dim == 17 ? 8 : 64;
                const Bytes xr = floats(dt, seq * heads * hd, rng);
                std::vector<int64_t> pos(seq);
                for (auto& p : pos) p = rng.below(4096);
                std::vector<float> inv(hd / 2);
                for (int64_t j = 0; j < hd / 2; ++j) inv[j] = float(std::pow(10000.0, -2.0 * j / hd));
                check(tag("rope", dt, dims({seq, heads, hd}) + (num ? " hf" : "")), {{dt, size_t(seq * heads * hd), {}, dt == LLAISYS_F32 ? 1e-4 : -1, dt == LLAISYS_F32 ? 1e-4 : -1}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, rope)(0, nullptr, dt, num, seq, heads, hd, 1.0, o[0].data(), xr.data(), pos.data(), inv.data());
                      });
            }
}

void reductions() {
    for (int dt : kFloat)
        for (int64_t n : {1, 17, 4097, 40000}) {
            Rng rng(uint64_t(n) + 99 * dt);
            Bytes v = floats(dt, n, rng, -10, 10);
            check(tag("argmax", dt, std::to_string(n)), {{LLAISYS_I64, 1}, {dt, 1}},
                  [&](const Lib& l, std::vector<Bytes>& o) { return FN(l, argmax)(0, nullptr, dt, n, o[0].data(), o[1].data(), v.data()); });
            check(tag("logprobs", dt, std::to_string(n)), {{LLAISYS_I64, size_t(std::min<int64_t>(n, 5))}, {LLAISYS_F32, size_t(std::min<int64_t>(n, 5) + 1), {}, 1e-5, 1e-5}},
                  [&](const Lib& l, std::vector<Bytes>& o) {
                      return FN(l, logprobs)(0, nullptr, dt, n, v.data(), n / 2, 0.8, std::min<int64_t>(n, 5), o[0].data(), o[1].data());
                  });
            for (uint64_t seed : {1u, 2u, 3u})
                check(tag("sample", dt, std::to_string(n) + " seed " + std::to_string(seed)), {{LLAISYS_I64, 1}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, sample)(0, nullptr, dt, n, o[0].data(), v.data(), 1.0, seed == 3 ? 0 : 40, 0.9, seed);
                      });
        }
}

void linears() {
    for (int dt : kFloat)
        for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 17, 17}, {3, 33, 130}, {9, 40, 257}, {1, 64, 1024}}) {
            Rng rng(uint64_t(M * 1000 + N * 10 + K) + dt);
            const Bytes x = floats(dt, M * K, rng), w = floats(dt, N * K, rng), b = floats(dt, N, rng);
            check(tag("linear", dt, dims({M, N, K})), {{dt, size_t(M * N)}},
                  [&](const Lib& l, std::vector<Bytes>& o) {
                      return FN(l, linear)(0, nullptr, dt, M, N, K, o[0].data(), x.data(), w.data(), b.data());
                  },
                  [&] {
                      std::vector<double> r(M * N);
                      for (int64_t m = 0; m < M; ++m)
                          for (int64_t n = 0; n < N; ++n) {
                              double s = value_at(dt, b, n);
                              for (int64_t k = 0; k < K; ++k) s += value_at(dt, x, m * K + k) * value_at(dt, w, n * K + k);
                              r[m * N + n] = s;
                          }
                      return r;
                  }, dt == LLAISYS_F32 ? 1e-5 : -1, dt == LLAISYS_F32 ? 1e-5 : -1);
            // lora: h = scales[s] * x a[s]^T, then out += h b[s]
            const int64_t R = 8, S = 2;
            const Bytes a = floats(dt, S * R * K, rng), bb = floats(dt, S * R * N, rng);
            std::vector<int64_t> ad(M);
            for (auto& s : ad) s = rng.below(S + 1) - 1;
            const std::vector<float> sc = {0.5f, 2.0f};
            check(tag("lora_shrink", dt, dims({M, K, R})), {{LLAISYS_F32, size_t(M * R), {}, 1e-5, 1e-5}},
                  [&](const Lib& l, std::vector<Bytes>& o) {
                      return FN(l, lora_shrink)(0, nullptr, dt, M, K, R, S, o[0].data(), x.data(), a.data(), ad.data(), sc.data());
                  });
            const Bytes h = floats(LLAISYS_F32, M * R, rng);
            check(tag("lora_expand", dt, dims({M, R, N})), {{dt, size_t(M * N), floats(dt, M * N, rng)}},
                  [&](const Lib& l, std::vector<Bytes>& o) {
                      return FN(l, lora_expand)(0, nullptr, dt, M, R, N, S, o[0].data(), h.data(), bb.data(), ad.data());
                  });
        }
}

// linear_i8 / moe_linear_i8 blocks from q [N, K] (int8 in [-127, 127]) and bf16 scales [N, G]
struct I8Blocks {
    Bytes weight, scales;
};
I8Blocks i8_blocks(int64_t N, int64_t K, Rng& rng) {
    const int64_t NB = (N + 15) / 16, G = (K + 31) / 32;
    I8Blocks r{Bytes(NB * G * 512, 0), Bytes(NB * G * 16 * 2, 0)};
    for (int64_t n = 0; n < N; ++n) {
        const int64_t b = n / 16, row = n % 16;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t g = k / 32, s = (k % 32) / 4, i = k % 4;
            r.weight[(((b * G + g) * 8 + s) * 16 + row) * 4 + i] = uint8_t(int8_t(rng.below(255) - 127));
        }
        for (int64_t g = 0; g < G; ++g) {
            const uint16_t h = to_bf16(float(rng.uniform(0.001, 0.02)));
            std::memcpy(&r.scales[((b * G + g) * 16 + row) * 2], &h, 2);
        }
    }
    return r;
}

void quantized() {
    for (int dt : kFloat)
        for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 17, 40}, {5, 33, 100}, {2, 64, 512}}) {
            Rng rng(uint64_t(M + N + K) * 13 + dt);
            const I8Blocks q = i8_blocks(N, K, rng);
            const Bytes x = floats(dt, M * K, rng), b = floats(dt, N, rng);
            check(tag("linear_i8", dt, dims({M, N, K})), {{dt, size_t(M * N)}},
                  [&](const Lib& l, std::vector<Bytes>& o) {
                      return FN(l, linear_i8)(0, nullptr, dt, M, N, K, o[0].data(), x.data(), q.weight.data(), q.scales.data(), b.data());
                  });
        }
    // block formats: N a multiple of 16 and K of 256, so every byte is a real weight or scale
    struct Fmt { int code; const char* name; int64_t wbytes, sbytes; };
    const Fmt fmts[] = {{LLAISYS_QFORMAT_Q8_0, "q8_0", 512, 32}, {LLAISYS_QFORMAT_Q4_0, "q4_0", 256, 32},
                        {LLAISYS_QFORMAT_Q4_1, "q4_1", 256, 64}, {LLAISYS_QFORMAT_Q4_K, "q4_k", 256, 40},
                        {LLAISYS_QFORMAT_Q6_K, "q6_k", 384, 36}};
    for (const Fmt& f : fmts)
        for (int dt : kFloat)
            for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 32, 256}, {7, 48, 512}}) {
                Rng rng(uint64_t(f.code * 100 + M) + dt);
                // E experts' blocks, stacked (the blocks of an [E N, K] matrix): linear_q and embedding_q read
                // the first expert's
                const int64_t E = 3, NB = N / 16, G = K / 32;
                const Bytes w = random_bytes(E * NB * G * f.wbytes, rng);
                Bytes s;
                if (f.code == LLAISYS_QFORMAT_Q4_K || f.code == LLAISYS_QFORMAT_Q6_K) {
                    const int64_t rec = f.code == LLAISYS_QFORMAT_Q4_K ? 320 : 288, head = f.code == LLAISYS_QFORMAT_Q4_K ? 64 : 32;
                    for (int64_t r = 0; r < E * NB * (K / 256); ++r) {
                        const Bytes d = f16_values(head / 2, rng, 0.0005, 0.004);
                        s.insert(s.end(), d.begin(), d.end());
                        for (int64_t i = head; i < rec; ++i)
                            s.push_back(f.code == LLAISYS_QFORMAT_Q4_K ? uint8_t(rng.below(64)) : uint8_t(int8_t(rng.below(127) - 63)));
                    }
                } else {
                    s = f16_values(E * NB * G * f.sbytes / 2, rng, -0.01, 0.01);
                }
                const Bytes x = floats(dt, M * K, rng), b = floats(dt, N, rng);
                check(tag("linear_q", dt, std::string(f.name) + " " + dims({M, N, K})), {{dt, size_t(M * N)}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, linear_q)(0, nullptr, dt, f.code, M, N, K, o[0].data(), x.data(), w.data(), s.data(), b.data());
                      });
                std::vector<int64_t> idx = {0, N - 1, 5, 17};
                check(tag("embedding_q", dt, std::string(f.name) + " " + dims({N, K})), {{dt, size_t(4 * K)}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, embedding_q)(0, nullptr, dt, f.code, 4, K, N, o[0].data(), idx.data(), w.data(), s.data());
                      });
                std::vector<int64_t> experts;
                for (int64_t i = 0; i < M * 2; ++i) experts.push_back(rng.below(E));
                check(tag("moe_linear_q", dt, std::string(f.name) + " " + dims({M, 2, E, N, K})), {{dt, size_t(M * 2 * N)}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, moe_linear_q)(0, nullptr, dt, f.code, M, 2, E, N, K, 0, o[0].data(), x.data(), w.data(),
                                                     s.data(), experts.data());
                      });
            }
    // GPTQ / AWQ groups
    for (int bits : {4, 8})
        for (int dt : kFloat)
            for (auto [M, N, K, gs] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 32, 128, 32}, {6, 40, 256, 64}}) {
                Rng rng(uint64_t(bits * 1000 + M) + dt);
                const int64_t NB = (N + 15) / 16, G = K / gs, P = 32 / bits;
                Bytes w = random_bytes(NB * (K / P) * 64, rng), z(NB * G * 16);
                Bytes sc = f16_values(NB * G * 16, rng, 0.001, 0.02);
                for (auto& v : z) v = uint8_t(rng.below(int64_t(1) << bits));
                std::vector<int32_t> perm(K);
                for (int64_t k = 0; k < K; ++k) perm[k] = int32_t(k);
                for (int64_t k = K - 1; k > 0; --k) std::swap(perm[k], perm[rng.below(k + 1)]);
                const Bytes x = floats(dt, M * K, rng), b = floats(dt, N, rng);
                if (N % 16) {  // rows past N: q, z and s zero
                    for (int64_t r = N % 16; r < 16; ++r) {
                        for (int64_t j = 0; j < K / P; ++j) std::memset(&w[((NB - 1) * (K / P) + j) * 64 + r * 4], 0, 4);
                        for (int64_t g = 0; g < G; ++g) {
                            z[((NB - 1) * G + g) * 16 + r] = 0;
                            std::memset(&sc[(((NB - 1) * G + g) * 16 + r) * 2], 0, 2);
                        }
                    }
                }
                for (bool use_perm : {false, true})
                    check(tag("linear_gq", dt, std::to_string(bits) + "-bit gs " + std::to_string(gs) + (use_perm ? " perm " : " ") + dims({M, N, K})),
                          {{dt, size_t(M * N)}},
                          [&](const Lib& l, std::vector<Bytes>& o) {
                              return FN(l, linear_gq)(0, nullptr, dt, bits, gs, LLAISYS_I32, M, N, K, o[0].data(), x.data(), w.data(),
                                                      sc.data(), z.data(), b.data(), use_perm ? perm.data() : nullptr);
                          });
            }
    // experts
    for (int dt : kFloat) {
        const int64_t M = 3, k = 2, E = 4, N = 24, K = 96;
        Rng rng(777 + dt);
        const Bytes x = floats(dt, M * K, rng), w = floats(dt, E * N * K, rng);
        const std::vector<int64_t> experts = {0, 3, 3, 1, 2, 0};
        check(tag("moe_linear", dt, dims({M, k, E, N, K})), {{dt, size_t(M * k * N)}},
              [&](const Lib& l, std::vector<Bytes>& o) {
                  return FN(l, moe_linear)(0, nullptr, dt, M, k, E, N, K, 0, o[0].data(), x.data(), w.data(), experts.data());
              });
        Bytes wq, sq;
        for (int64_t e = 0; e < E; ++e) {
            const I8Blocks q = i8_blocks(N, K, rng);
            wq.insert(wq.end(), q.weight.begin(), q.weight.end());
            sq.insert(sq.end(), q.scales.begin(), q.scales.end());
        }
        check(tag("moe_linear_i8", dt, dims({M, k, E, N, K})), {{dt, size_t(M * k * N)}},
              [&](const Lib& l, std::vector<Bytes>& o) {
                  return FN(l, moe_linear_i8)(0, nullptr, dt, M, k, E, N, K, 0, o[0].data(), x.data(), wq.data(), sq.data(), experts.data());
              });
        const Bytes logits = floats(dt, M * E, rng, -4, 4);
        check(tag("moe_router", dt, dims({M, E, k})), {{dt, size_t(M * k)}, {LLAISYS_I64, size_t(M * k)}},
              [&](const Lib& l, std::vector<Bytes>& o) {
                  return FN(l, moe_router)(0, nullptr, dt, M, E, k, 1, o[0].data(), o[1].data(), logits.data());
              });
        const Bytes y = floats(dt, M * k * N, rng), wts = floats(dt, M * k, rng, 0, 1);
        check(tag("moe_combine", dt, dims({M, k, N})), {{dt, size_t(M * N)}},
              [&](const Lib& l, std::vector<Bytes>& o) {
                  return FN(l, moe_combine)(0, nullptr, dt, M, k, N, o[0].data(), y.data(), wts.data());
              });
    }
}

void attention() {
    struct Shape { int64_t L, S, H, Hkv, d, dv; };
    const Shape shapes[] = {{1, 7, 4, 2, 16, 16}, {3, 9, 4, 1, 32, 32}, {9, 9, 8, 1, 16, 8}, {17, 20, 12, 2, 12, 20}};
    for (int dt : kFloat)
        for (int num : {LLAISYS_NUMERICS_EXACT, LLAISYS_NUMERICS_HF})
            for (const Shape& s : shapes) {
                Rng rng(uint64_t(s.L * 100 + s.H) + dt * 7 + num);
                const Bytes q = floats(dt, s.L * s.H * s.d, rng, -2, 2), k = floats(dt, s.S * s.Hkv * s.d, rng, -2, 2),
                            v = floats(dt, s.S * s.Hkv * s.dv, rng);
                check(tag("self_attention", dt, dims({s.L, s.S, s.H, s.Hkv, s.d, s.dv}) + (num ? " hf" : "")),
                      {{dt, size_t(s.L * s.H * s.dv), {}, dt == LLAISYS_F32 ? 1e-4 : -1, dt == LLAISYS_F32 ? 1e-4 : -1}},
                      [&](const Lib& l, std::vector<Bytes>& o) {
                          return FN(l, self_attention)(0, nullptr, dt, num, s.L, s.S, s.H, s.Hkv, s.d, s.dv, 1 / std::sqrt(double(s.d)),
                                                       o[0].data(), q.data(), k.data(), v.data());
                      });
            }
    // paged: 2 sequences (1 and 2 query rows) over blocks of 4 positions, in shuffled blocks of the pool
    for (int dt : kFloat)
        for (int64_t window : {0, 3}) {
            const int64_t H = 4, Hkv = 2, d = 16, dv = 16, num_blocks = 6, bs = 4, max_blocks = 3, T = 3;
            Rng rng(4242 + dt + window);
            const Bytes q = floats(dt, T * H * d, rng), kc = floats(dt, num_blocks * bs * Hkv * d, rng),
                        vc = floats(dt, num_blocks * bs * Hkv * dv, rng);
            const std::vector<int32_t> tables = {4, 1, 0, 2, 5, 3}, lens = {5, 10}, starts = {0, 1, 3};
            check(tag("paged_attention", dt, "window " + std::to_string(window)),
                  {{dt, size_t(T * H * dv), {}, dt == LLAISYS_F32 ? 1e-4 : -1, dt == LLAISYS_F32 ? 1e-4 : -1}},
                  [&](const Lib& l, std::vector<Bytes>& o) {
                      return FN(l, paged_attention)(0, nullptr, dt, LLAISYS_NUMERICS_EXACT, T, 2, H, Hkv, d, dv, num_blocks, bs,
                                                    max_blocks, window, 0.25, o[0].data(), q.data(), kc.data(), vc.data(),
                                                    tables.data(), lens.data(), starts.data());
                  });
        }
}

// The shared-memory collectives between two processes (this one as rank 0, a forked child as rank 1), on LIB:
// all_reduce (f32 exact; bf16 and f16 rounded once from the f32 sum), all_gather and broadcast. Run before any
// op, so that the child starts with no thread team to inherit. (The futex waits, the shared segment and the
// sequence numbers' atomics run under emulation; qemu runs the guest's atomics on the x86-64 host's, so this says
// nothing about a weakly ordered ARM memory system.)
void collectives() {
    const Lib& l = g_test;
    char id[LLAISYS_UNIQUE_ID_BYTES];
    if (FN(l, comm_unique_id)(0, id)) {
        ++g_cases, ++g_failed;
        std::printf("FAIL collectives: comm_unique_id: %s\n", l.last_error().c_str());
        return;
    }
    std::fflush(stdout);
    const pid_t child = fork();
    const int rank = child == 0 ? 1 : 0;
    std::string error;
    void* comm = nullptr;
    auto fail = [&](const std::string& what) {
        if (error.empty()) error = what;
    };
    if (FN(l, comm_create)(0, id, rank, 2, 60000, &comm)) fail("comm_create: " + l.last_error());
    // rank r holds value(r, i); the sum of both ranks' is what every rank must get
    auto value = [](int r, int64_t i) { return float((i * 7 + r * 3) % 101) * 0.03125f - 1.5f + float(r) * 0.25f; };
    for (int dt : kFloat) {
        for (int64_t n : {int64_t(37), int64_t(300000)}) {
            if (!error.empty()) break;
            std::vector<float> in_f(n);
            for (int64_t i = 0; i < n; ++i) in_f[i] = value(rank, i);
            Bytes in(n * dtype_size(dt)), out(n * dtype_size(dt));
            for (int64_t i = 0; i < n; ++i) {
                if (dt == LLAISYS_F32) std::memcpy(&in[i * 4], &in_f[i], 4);
                else {
                    const uint16_t h = dt == LLAISYS_F16 ? to_f16(in_f[i]) : to_bf16(in_f[i]);
                    std::memcpy(&in[i * 2], &h, 2);
                }
            }
            if (FN(l, comm_all_reduce)(0, nullptr, comm, dt, n, out.data(), in.data())) {
                fail("all_reduce: " + l.last_error());
                break;
            }
            for (int64_t i = 0; i < n; ++i) {
                float sum = 0;  // both ranks' inputs as stored (rounded to dt), summed in f32, rounded once
                for (int r = 0; r < 2; ++r) {
                    const float v = value(r, i);
                    sum += dt == LLAISYS_F32 ? v : dt == LLAISYS_F16 ? from_f16(to_f16(v)) : from_bf16(to_bf16(v));
                }
                const double want = dt == LLAISYS_F32 ? sum : dt == LLAISYS_F16 ? from_f16(to_f16(sum)) : from_bf16(to_bf16(sum));
                if (value_at(dt, out, i) != want) {
                    fail("all_reduce " + std::string(dtype_name(dt)) + " n " + std::to_string(n) + " element " +
                         std::to_string(i) + ": got " + std::to_string(value_at(dt, out, i)) + ", expected " +
                         std::to_string(want));
                    break;
                }
            }
        }
    }
    if (error.empty()) {
        Bytes in(1000), out(2000), data(999);
        for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i * 13 + rank * 7);
        for (size_t i = 0; i < data.size(); ++i) data[i] = rank == 1 ? uint8_t(i * 5 + 1) : 0;
        if (FN(l, comm_all_gather)(0, nullptr, comm, 1000, out.data(), in.data())) fail("all_gather: " + l.last_error());
        else
            for (size_t i = 0; i < out.size(); ++i)
                if (out[i] != uint8_t((i % 1000) * 13 + (i / 1000) * 7)) {
                    fail("all_gather: byte " + std::to_string(i) + " differs");
                    break;
                }
        if (error.empty() && FN(l, comm_broadcast)(0, nullptr, comm, 999, data.data(), 1)) fail("broadcast: " + l.last_error());
        for (size_t i = 0; error.empty() && i < data.size(); ++i)
            if (data[i] != uint8_t(i * 5 + 1)) fail("broadcast: byte " + std::to_string(i) + " differs");
    }
    if (comm && FN(l, comm_destroy)(comm)) fail("comm_destroy: " + l.last_error());
    if (child == 0) {  // rank 1 reports through its exit status (and stderr)
        if (!error.empty()) std::fprintf(stderr, "rank 1: %s\n", error.c_str());
        std::fflush(stderr);
        _exit(error.empty() ? 0 : 1);
    }
    int status = 0;
    if (child < 0) fail("fork failed");
    else if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("rank 1 (the child process) failed: status " + std::to_string(status));
    ++g_cases;
    if (!error.empty()) ++g_failed;
    std::printf("%s collectives (2 processes: all_reduce f32 / f16 / bf16, all_gather, broadcast)%s%s\n",
                error.empty() ? "ok" : "FAIL", error.empty() ? "" : ": ", error.c_str());
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && !std::strcmp(argv[1], "--level")) {
        std::printf("%s\n", open_lib(argv[2]).level().c_str());
        return 0;
    }
    if (argc != 4) {
        std::fprintf(stderr, "usage: driver LIB REF_LIB EXPECTED_LEVEL | driver --level LIB\n");
        return 2;
    }
    // the reference: the same library pinned to its portable build; then LIB with the caller's environment
    const char* env = std::getenv("LLAISYS_CPU_SIMD");
    const std::string saved = env ? env : "";
    setenv("LLAISYS_CPU_SIMD", "portable", 1);
    g_ref = open_lib(argv[2]);
    if (g_ref.level() != "portable") {
        std::fprintf(stderr, "driver: the reference library runs %s, not portable\n", g_ref.level().c_str());
        return 2;
    }
    if (env) setenv("LLAISYS_CPU_SIMD", saved.c_str(), 1);
    else unsetenv("LLAISYS_CPU_SIMD");
    g_test = open_lib(argv[1]);
    const std::string level = g_test.level();
    std::printf("level %s\n", level.c_str());
    std::fflush(stdout);

    collectives();  // first: it forks
    elementwise();
    norms_and_rope();
    reductions();
    linears();
    quantized();
    attention();

    const bool level_ok = level == argv[3];
    std::printf("summary: level %s (expected %s), %d cases, %d failed\n", level.c_str(), argv[3], g_cases, g_failed);
    return g_failed || !level_ok ? 1 : 0;
}
