// The plain C ABI of this backend (see llaisys/native.py in llaisys-core for the contract):
// every export returns a Status and never lets a C++ exception, abort() or exit() escape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#define LLAISYS_EXPORT extern "C" __attribute__((visibility("default")))

namespace llaisys {

constexpr int kApiVersion = 1;

enum Status : int {
    kOk = 0,
    kInvalidArgument = 1,
    kRuntimeError = 2,
    kOutOfMemory = 3,
    kNotSupported = 4,
};

// dtype codes, as llaisys.DType.code
enum DType : int {
    kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3, kI8 = 4, kI32 = 5, kI64 = 6, kU8 = 7, kBool = 8,
};

// Thrown inside the library, turned into a status by LLAISYS_GUARD.
struct InvalidArgument : std::runtime_error { using std::runtime_error::runtime_error; };
struct NotSupported : std::runtime_error { using std::runtime_error::runtime_error; };

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

}  // namespace llaisys
