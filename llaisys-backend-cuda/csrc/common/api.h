// The plain C ABI of this backend: slots, codes and the API version come from llaisys/backend.h (shipped by
// llaisys-core). Every export runs its body through guard(), which turns any exception into a status plus a
// last-error message, so no C++ exception, abort() or exit() crosses the boundary.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

#include "llaisys/backend.h"

namespace llaisys::cuda {

enum Status : int {
    kOk = LLAISYS_OK,
    kInvalidArgument = LLAISYS_INVALID_ARGUMENT,
    kRuntimeError = LLAISYS_RUNTIME_ERROR,
    kOutOfMemory = LLAISYS_OUT_OF_MEMORY,
    kNotSupported = LLAISYS_NOT_SUPPORTED,
};

enum DType : int { kF32 = LLAISYS_F32, kF16 = LLAISYS_F16, kBF16 = LLAISYS_BF16 };

// Thrown inside the library, turned into a status by guard(). Anything else is a runtime error.
struct InvalidArgument : std::runtime_error { using std::runtime_error::runtime_error; };
struct NotSupported : std::runtime_error { using std::runtime_error::runtime_error; };
struct OutOfMemory : std::runtime_error { using std::runtime_error::runtime_error; };

void set_last_error(const std::string& message);
const char* last_error();

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
        set_last_error(std::string(where) + ": out of host memory");
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
    throw NotSupported("unsupported dtype code " + std::to_string(dtype) + " (f32, f16 and bf16 are)");
}

// The numerics code of an op that takes one: true for LLAISYS_NUMERICS_HF (round where HF transformers
// rounds), false for LLAISYS_NUMERICS_EXACT; any other code is NOT_SUPPORTED.
inline bool hf_numerics(int numerics) {
    if (numerics != LLAISYS_NUMERICS_EXACT && numerics != LLAISYS_NUMERICS_HF)
        throw NotSupported("numerics mode " + std::to_string(numerics) + " is not implemented by this backend");
    return numerics == LLAISYS_NUMERICS_HF;
}

}  // namespace llaisys::cuda
