// The plain C ABI of this backend: slots, codes and the API version come from llaisys/backend.h
// (shipped by llaisys-core); every export returns a status and never lets a C++ exception, abort() or
// exit() escape (see guard below).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "llaisys/backend.h"

// Exports that are not slots of the shared header (CPU-only introspection used by tests), named
// LLAISYS_FN(name) like the slots.
#define LLAISYS_EXPORT extern "C" __attribute__((visibility("default")))
// The SIMD path the kernels take in this process: "portable", "avx2" or "avx512" (cpu_features.h).
LLAISYS_EXPORT const char* LLAISYS_FN(simd_level)(void);

namespace llaisys {

constexpr int kApiVersion = LLAISYS_API_VERSION;

enum Status : int {
    kOk = LLAISYS_OK,
    kInvalidArgument = LLAISYS_INVALID_ARGUMENT,
    kRuntimeError = LLAISYS_RUNTIME_ERROR,
    kOutOfMemory = LLAISYS_OUT_OF_MEMORY,
    kNotSupported = LLAISYS_NOT_SUPPORTED,
};

// Thrown inside the library, turned into a status by LLAISYS_GUARD.
struct InvalidArgument : std::runtime_error { using std::runtime_error::runtime_error; };
struct NotSupported : std::runtime_error { using std::runtime_error::runtime_error; };
struct OutOfMemory : std::runtime_error { using std::runtime_error::runtime_error; };

void set_last_error(const std::string& message);
const char* last_error();

// Runs `body` and converts any exception into a status plus a last-error message.
template <class F>
int guard(const char* where, F&& body) noexcept {
    try {
        body();
        return kOk;
    } catch (const InvalidArgument& e) {
        set_last_error(std::string(where) + ": " + e.what());
        return kInvalidArgument;
    } catch (const NotSupported& e) {
        set_last_error(std::string(where) + ": " + e.what());
        return kNotSupported;
    } catch (const OutOfMemory& e) {
        set_last_error(std::string(where) + ": " + e.what());
        return kOutOfMemory;
    } catch (const std::bad_alloc&) {
        set_last_error(std::string(where) + ": out of memory");
        return kOutOfMemory;
    } catch (const std::exception& e) {
        set_last_error(std::string(where) + ": " + e.what());
        return kRuntimeError;
    } catch (...) {
        set_last_error(std::string(where) + ": unknown error");
        return kRuntimeError;
    }
}

[[noreturn]] inline void unsupported_dtype(int dtype) {
    throw NotSupported("unsupported dtype code " + std::to_string(dtype));
}

// The floating dtypes every op kernel implements (DESIGN: f32, f16, bf16); any other code is NOT_SUPPORTED.
inline void require_float_dtype(int dtype) {
    if (dtype != LLAISYS_F32 && dtype != LLAISYS_F16 && dtype != LLAISYS_BF16) unsupported_dtype(dtype);
}

// Only LLAISYS_NUMERICS_EXACT is implemented so far.
inline void require_exact_numerics(int numerics) {
    if (numerics != LLAISYS_NUMERICS_EXACT)
        throw NotSupported("numerics mode " + std::to_string(numerics) + " is not implemented by this backend");
}

}  // namespace llaisys
