// Host "device" runtime: 64-byte aligned memory, copies, device attributes, events. Every call is
// synchronous (work queued on a stream has finished when the call returns); streams and graph capture are
// in streams.cpp.
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/api.h"
#include "common/cpu_features.h"

using namespace llaisys;

namespace {
constexpr size_t kAlignment = 64;
constexpr size_t kHugePage = size_t(2) << 20;

// Buffers of 4 MiB and more (weights, KV caches) are 2 MiB aligned and asked to live on transparent huge
// pages: kernels stream through them, and with 4 KiB pages a weight read from memory would miss the TLB
// every 4 KiB. (Where THP is off, madvise is a no-op; its failure is ignored. LLAISYS_CPU_HUGE_PAGES=0:
// never ask, read once.)
bool huge_pages_allowed() {
    static const bool allowed = cpu::env_switch_on("LLAISYS_CPU_HUGE_PAGES");
    return allowed;
}

void* aligned_malloc(size_t nbytes) {
    const size_t align = nbytes >= 2 * kHugePage ? kHugePage : kAlignment;
    if (nbytes > SIZE_MAX - align) throw std::bad_alloc();
    size_t rounded = (nbytes + align - 1) / align * align;
    void* ptr = std::aligned_alloc(align, rounded ? rounded : align);
    if (!ptr) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)  // Linux (x86-64 and arm64); macOS has no transparent huge pages
    if (align == kHugePage && huge_pages_allowed()) madvise(ptr, rounded, MADV_HUGEPAGE);
#endif
    return ptr;
}

void check_device(int device) {
    if (device != 0) throw InvalidArgument("cpu has one device (index 0), got " + std::to_string(device));
}

int g_event_token;  // events are distinct non-null handles, complete when recorded
}  // namespace

const char* LLAISYS_FN(build_info)(void) {
#if defined(__aarch64__)
    return "llaisys CPU kernels: AArch64 portable + NEON + NEON dotprod paths, own thread team";
#else
    return "llaisys CPU kernels: x86-64 baseline + AVX2 + AVX-512 paths, own thread team";
#endif
}

int LLAISYS_FN(device_count)(int* count) {
    return guard("device_count", [&] { *count = 1; });
}

int LLAISYS_FN(device_attribute)(int device, int attr, int64_t* value) {
    return guard("device_attribute", [&] {
        check_device(device);
        switch (attr) {
            case LLAISYS_ATTR_HOST_ADDRESSABLE: *value = 1; break;
            case LLAISYS_ATTR_WARP_SIZE: *value = 1; break;
            case LLAISYS_ATTR_MULTIPROCESSOR_COUNT: *value = omp_get_max_threads(); break;
            case LLAISYS_ATTR_TOTAL_MEMORY: *value = int64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE); break;
            default: throw NotSupported("device attribute " + std::to_string(attr) + " has no meaning on the CPU");
        }
    });
}

int LLAISYS_FN(device_name)(int device, char* name, size_t size) {
    return guard("device_name", [&] {
        check_device(device);
#if defined(__aarch64__)
        if (size) std::snprintf(name, size, "AArch64 CPU (%s kernels, %d threads)",
                                cpu::simd_name(cpu::simd_level()), omp_get_max_threads());
#else
        if (size) std::snprintf(name, size, "x86-64 CPU (%s kernels, %d threads)",
                                cpu::simd_name(cpu::simd_level()), omp_get_max_threads());
#endif
    });
}

int LLAISYS_FN(mem_info)(int device, size_t* free_bytes, size_t* total_bytes) {
    return guard("mem_info", [&] {
        check_device(device);
        *free_bytes = size_t(sysconf(_SC_AVPHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
        *total_bytes = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE));
    });
}

int LLAISYS_FN(device_synchronize)(int device) {
    return guard("device_synchronize", [&] { check_device(device); refuse_while_capturing("device_synchronize"); });
}

int LLAISYS_FN(malloc)(int device, size_t nbytes, void** ptr) {
    return guard("malloc", [&] {
        check_device(device);
        refuse_while_capturing("malloc");
        try {
            *ptr = aligned_malloc(nbytes);
        } catch (const std::bad_alloc&) {
            throw OutOfMemory("out of memory allocating " + std::to_string(nbytes) + " bytes");
        }
    });
}

int LLAISYS_FN(free)(int device, void* ptr) {
    return guard("free", [&] { check_device(device); refuse_while_capturing("free"); std::free(ptr); });
}

int LLAISYS_FN(malloc_host)(size_t nbytes, void** ptr) {
    return guard("malloc_host", [&] { *ptr = aligned_malloc(nbytes); });
}

int LLAISYS_FN(free_host)(void* ptr) {
    return guard("free_host", [&] { std::free(ptr); });
}

int LLAISYS_FN(memcpy)(int device, void* dst, const void* src, size_t nbytes, int kind) {
    return guard("memcpy", [&] {
        check_device(device);
        refuse_while_capturing("a synchronous memcpy");
        if (kind < LLAISYS_MEMCPY_H2H || kind > LLAISYS_MEMCPY_D2D)
            throw InvalidArgument("unknown memcpy kind " + std::to_string(kind));
        std::memmove(dst, src, nbytes);
    });
}

int LLAISYS_FN(event_create)(int device, void** event) {
    return guard("event_create", [&] { check_device(device); *event = &g_event_token; });
}

int LLAISYS_FN(event_destroy)(int device, void* event) {
    (void)event;
    return guard("event_destroy", [&] { check_device(device); });
}

int LLAISYS_FN(event_record)(int device, void* event, void* stream) {
    (void)event; (void)stream;
    return guard("event_record", [&] { check_device(device); });
}

int LLAISYS_FN(event_synchronize)(int device, void* event) {
    (void)event;
    return guard("event_synchronize", [&] { check_device(device); });
}

int LLAISYS_FN(stream_wait_event)(int device, void* stream, void* event) {
    (void)stream; (void)event;
    return guard("stream_wait_event", [&] { check_device(device); });
}
