// The plain C ABI of this backend: slots, codes and the API version come from llaisys/backend.h
// (shipped by llaisys-core); every export returns a status and never lets a C++ exception, abort() or
// exit() escape (see guard below).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "llaisys/backend.h"

// Exports that are not slots of the shared header (CPU-only introspection used by tests), named
// LLAISYS_FN(name) like the slots.
#define LLAISYS_EXPORT extern "C" __attribute__((visibility("default")))
// The SIMD path the kernels take in this process: "portable", "avx2" or "avx512" on x86-64, "portable", "neon"
// or "dotprod" on AArch64 (cpu_features.h).
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

// Thrown inside the library, turned into a status by guard() below.
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

// Graph capture (streams.cpp). CPU work is synchronous: an op runs inside its call. On a stream that is being
// captured (graph_begin_capture) the op is recorded instead, and each graph_launch replays the recorded
// calls in order, with no Python and no argument packing between them.
struct Graph;
Graph* capturing_graph(void* stream);  // the graph `stream` records into, or null (always null for stream 0)
void record_call(Graph* graph, const char* where, std::function<void()> body);
// Throws InvalidArgument naming `what` while the calling thread captures a graph (allocation, free, sync).
void refuse_while_capturing(const char* what);

// Runs an op's `body` now, or records it when `stream` is being captured. A recorded body is a copy, so it
// captures its arguments by value ([=]); the memory they point to must outlive the graph (the caller's
// contract, as for a CUDA graph), and what it reads there is read at each replay.
template <class F>
int launch(const char* where, void* stream, F&& body) noexcept {
    if (Graph* graph = capturing_graph(stream))
        return guard(where, [&] { record_call(graph, where, std::function<void()>(std::forward<F>(body))); });
    return guard(where, std::forward<F>(body));
}

[[noreturn]] inline void unsupported_dtype(int dtype) {
    throw NotSupported("unsupported dtype code " + std::to_string(dtype));
}

// The floating dtypes every op kernel implements (DESIGN: f32, f16, bf16); any other code is NOT_SUPPORTED.
inline void require_float_dtype(int dtype) {
    if (dtype != LLAISYS_F32 && dtype != LLAISYS_F16 && dtype != LLAISYS_BF16) unsupported_dtype(dtype);
}

// The numerics code of an op that takes one: true for LLAISYS_NUMERICS_HF (round where HF transformers
// rounds), false for LLAISYS_NUMERICS_EXACT; any other code is NOT_SUPPORTED.
inline bool hf_numerics(int numerics) {
    if (numerics != LLAISYS_NUMERICS_EXACT && numerics != LLAISYS_NUMERICS_HF)
        throw NotSupported("numerics mode " + std::to_string(numerics) + " is not implemented by this backend");
    return numerics == LLAISYS_NUMERICS_HF;
}

}  // namespace llaisys
