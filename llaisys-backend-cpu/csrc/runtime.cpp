// Host "device" runtime: 64-byte aligned memory; streams exist but every call is synchronous.
#include <cstdlib>
#include <cstring>

#include "common/api.h"

using namespace llaisys;

namespace {
constexpr size_t kAlignment = 64;

void* aligned_malloc(size_t nbytes) {
    size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* ptr = std::aligned_alloc(kAlignment, rounded ? rounded : kAlignment);
    if (!ptr) throw std::bad_alloc();
    return ptr;
}

void check_device(int device) {
    if (device != 0) throw InvalidArgument("cpu has one device (index 0), got " + std::to_string(device));
}

int g_stream_token;  // CPU streams are just distinct non-null handles
}  // namespace

LLAISYS_EXPORT int llaisys_cpu_device_count(int* count) {
    return guard("device_count", [&] { *count = 1; });
}

LLAISYS_EXPORT int llaisys_cpu_malloc(int device, size_t nbytes, void** ptr) {
    return guard("malloc", [&] { check_device(device); *ptr = aligned_malloc(nbytes); });
}

LLAISYS_EXPORT int llaisys_cpu_free(int device, void* ptr) {
    return guard("free", [&] { check_device(device); std::free(ptr); });
}

LLAISYS_EXPORT int llaisys_cpu_malloc_host(size_t nbytes, void** ptr) {
    return guard("malloc_host", [&] { *ptr = aligned_malloc(nbytes); });
}

LLAISYS_EXPORT int llaisys_cpu_free_host(void* ptr) {
    return guard("free_host", [&] { std::free(ptr); });
}

LLAISYS_EXPORT int llaisys_cpu_memset(int device, void* ptr, int value, size_t nbytes) {
    return guard("memset", [&] { check_device(device); std::memset(ptr, value, nbytes); });
}

LLAISYS_EXPORT int llaisys_cpu_memcpy(int device, void* dst, const void* src, size_t nbytes, int kind) {
    return guard("memcpy", [&] {
        check_device(device);
        if (kind < 0 || kind > 3) throw InvalidArgument("unknown memcpy kind " + std::to_string(kind));
        std::memcpy(dst, src, nbytes);
    });
}

LLAISYS_EXPORT int llaisys_cpu_memcpy_async(int device, void* dst, const void* src, size_t nbytes, int kind,
                                            void* stream) {
    (void)stream;
    return llaisys_cpu_memcpy(device, dst, src, nbytes, kind);
}

LLAISYS_EXPORT int llaisys_cpu_stream_create(int device, void** stream) {
    return guard("stream_create", [&] { check_device(device); *stream = &g_stream_token; });
}

LLAISYS_EXPORT int llaisys_cpu_stream_destroy(int device, void* stream) {
    (void)stream;
    return guard("stream_destroy", [&] { check_device(device); });
}

LLAISYS_EXPORT int llaisys_cpu_stream_synchronize(int device, void* stream) {
    (void)stream;
    return guard("stream_synchronize", [&] { check_device(device); });
}

LLAISYS_EXPORT int llaisys_cpu_device_synchronize(int device) {
    return guard("device_synchronize", [&] { check_device(device); });
}
