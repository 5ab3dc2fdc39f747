// llaisys_host_exec.h — TEST ONLY, never shipped: runs the CUDA backend's kernel bodies on CPU threads.
//
// compat.h includes this header instead of the CUDA headers when LLAISYS_HOST_EXEC is defined; g++ then
// compiles the backend's own .cu sources (runtime, contexts, every kernel) into a library with the same C
// ABI, which tests/backends/cuda drives against torch references, at LLAISYS_WARP_SIZE 32 and 64, under
// AddressSanitizer and UBSan.
//
// Model: one std::thread per CUDA thread of a block; the blocks of a grid run one after another and grids
// one at a time (so that `__shared__`, defined here as `static`, is the running block's shared memory); __syncthreads is a
// barrier of the block's threads and warp shuffles go through a per-warp exchange between two barriers of
// the warp's threads. A barrier reached from two different places (a divergent __syncthreads, a thread that
// returned early while others wait, a shuffle outside full warps) aborts with a message, and so does one
// that waits for more than a minute (a deadlock). Dynamic shared memory is filled with 0xff bytes (NaN as
// floats) before every block, so reads of unwritten shared memory show.
//
// The runtime API is emulated for one device with this build's warp size: memory is host memory, every
// stream runs its work at once (in order), and stream capture records launches and copies into a graph
// that graph launches replay. Calls that CUDA forbids during a capture (synchronize, cudaMalloc, a
// synchronous copy) fail with cudaErrorStreamCaptureUnsupported, so the tests see an operator that would
// break a CUDA graph. cuBLAS is one reference GEMM (double accumulation, one rounding).
//
// What this cannot show: warp lockstep (threads of a warp run independently here), the GPU's memory
// ordering and caches, bank conflicts, occupancy, register or shared-memory limits beyond the sizes
// checked, and anything about speed.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#ifndef LLAISYS_WARP_SIZE
#error "host execution needs -DLLAISYS_WARP_SIZE=32 or 64"
#endif

// ---- CUDA C++ keywords ---------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define __restrict__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};

namespace llaisys_host_exec {

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "llaisys host execution: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

// A reusable barrier for a fixed number of threads that checks that every arrival comes from the same
// place (`site`) and that nobody waits forever.
class Barrier {
public:
    explicit Barrier(int count) : count_(count) {}
    void wait(const void* site) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (arrived_ == 0) site_ = site;
        else if (site_ != site) fail("threads of one block / warp reached different barriers (divergent __syncthreads, "
                                     "an early return before a barrier, or a shuffle in a partial warp)");
        const unsigned long generation = generation_;
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++generation_;
            cv_.notify_all();
            return;
        }
        if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation; }))
            fail("a barrier waited for more than 60 s: deadlock (some thread never reached it)");
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    int count_;
    int arrived_ = 0;
    unsigned long generation_ = 0;
    const void* site_ = nullptr;
};

struct Warp {
    explicit Warp(int n) : barrier(n) {}
    Barrier barrier;
    // shuffles alternate between two sets of slots, so that one barrier per shuffle suffices: a lane can write
    // the set of shuffle i + 2 only after every lane passed the barrier of shuffle i + 1, i.e. read shuffle i
    alignas(16) unsigned char slot[2][LLAISYS_WARP_SIZE][16];
    unsigned parity[LLAISYS_WARP_SIZE] = {};  // per lane: its next shuffle's set
    double mma[3][256];  // WMMA emulation: the A, B and C matrices of one mma_sync (16 x 16 each)
};

struct Block {
    Block(int threads, size_t shared_bytes) : barrier(threads), shared((shared_bytes + 15) / 16 + 1) {
        for (int w = 0; w < threads / LLAISYS_WARP_SIZE; ++w) warps.emplace_back(new Warp(LLAISYS_WARP_SIZE));
    }
    Barrier barrier;
    std::vector<std::unique_ptr<Warp>> warps;
    struct alignas(16) Chunk { unsigned char b[16]; };
    std::vector<Chunk> shared;  // dynamic shared memory
};

struct ThreadState {
    uint3 thread_idx{0, 0, 0}, block_idx{0, 0, 0};
    dim3 block_dim, grid_dim;
    Block* block = nullptr;
    int linear = 0;
};
inline thread_local ThreadState tls;

template <class T>
T* dynamic_shared() {
    return reinterpret_cast<T*>(tls.block->shared.data());
}

inline char g_site_syncthreads, g_site_block_end, g_site_block_start;

inline void syncthreads() { tls.block->barrier.wait(&g_site_syncthreads); }

inline Warp& my_warp() { return *tls.block->warps[size_t(tls.linear / LLAISYS_WARP_SIZE)]; }

template <class T>
T exchange(unsigned long long mask, T value, int (*source)(int lane, int arg, int width), int arg, int width) {
    static_assert(sizeof(T) <= 16 && std::is_trivially_copyable<T>::value, "shuffled values are up to 16 bytes");
    using full_t = std::conditional_t<(LLAISYS_WARP_SIZE == 64), unsigned long long, unsigned int>;
    if (full_t(mask) != full_t(~0ull)) fail("a shuffle with a partial lane mask (only full warps are emulated)");
    if (width <= 0 || width > LLAISYS_WARP_SIZE || (width & (width - 1))) fail("shuffle width not a power of 2 <= WARP_SIZE");
    Warp& w = my_warp();
    const int lane = tls.linear % LLAISYS_WARP_SIZE;
    const unsigned set = w.parity[lane]++ & 1u;
    std::memcpy(w.slot[set][lane], &value, sizeof(T));
    static char site;
    w.barrier.wait(&site);
    const int src = source(lane, arg, width);
    T result;
    std::memcpy(&result, w.slot[set][src], sizeof(T));
    return result;
}

inline int src_xor(int lane, int mask, int width) {
    const int src = lane ^ mask;
    return (src / width == lane / width) ? src : lane;
}
inline int src_up(int lane, int delta, int width) { return (lane % width) >= delta ? lane - delta : lane; }
inline int src_down(int lane, int delta, int width) { return (lane % width) + delta < width ? lane + delta : lane; }
inline int src_idx(int lane, int src, int width) { return (lane / width) * width + ((src % width) + width) % width; }

}  // namespace llaisys_host_exec

#define threadIdx (::llaisys_host_exec::tls.thread_idx)
#define blockIdx (::llaisys_host_exec::tls.block_idx)
#define blockDim (::llaisys_host_exec::tls.block_dim)
#define gridDim (::llaisys_host_exec::tls.grid_dim)

inline void __syncthreads() { llaisys_host_exec::syncthreads(); }
inline void __syncwarp(unsigned long long mask = ~0ull) {
    (void)mask;
    static char site;
    llaisys_host_exec::my_warp().barrier.wait(&site);
}
template <class T> T __shfl_xor_sync(unsigned long long m, T v, int lane_mask, int width = LLAISYS_WARP_SIZE) {
    return llaisys_host_exec::exchange(m, v, llaisys_host_exec::src_xor, lane_mask, width);
}
template <class T> T __shfl_up_sync(unsigned long long m, T v, unsigned delta, int width = LLAISYS_WARP_SIZE) {
    return llaisys_host_exec::exchange(m, v, llaisys_host_exec::src_up, int(delta), width);
}
template <class T> T __shfl_down_sync(unsigned long long m, T v, unsigned delta, int width = LLAISYS_WARP_SIZE) {
    return llaisys_host_exec::exchange(m, v, llaisys_host_exec::src_down, int(delta), width);
}
template <class T> T __shfl_sync(unsigned long long m, T v, int src, int width = LLAISYS_WARP_SIZE) {
    return llaisys_host_exec::exchange(m, v, llaisys_host_exec::src_idx, src, width);
}

// ---- atomics (sequentially consistent, stronger than CUDA's relaxed ones) --------------------------------
template <class T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
inline float atomicAdd(float* p, float v) {
    std::atomic_ref<float> a(*p);
    float old = a.load();
    while (!a.compare_exchange_weak(old, old + v)) {}
    return old;
}
template <class T> T atomicCAS(T* p, T expected, T desired) {
    std::atomic_ref<T>(*p).compare_exchange_strong(expected, desired);
    return expected;
}
template <class T> T atomicMax(T* p, T v) {
    std::atomic_ref<T> a(*p);
    T old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {}
    return old;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- math and bit intrinsics ----------------------------------------------------------------------------
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// The four signed byte products of a and b added to c (sm_61+ hardware does the same exact integer sum).
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int(int8_t(unsigned(a) >> (8 * i))) * int(int8_t(unsigned(b) >> (8 * i)));
    return c;
}

struct __half { unsigned short bits; };
struct __nv_bfloat16 { unsigned short bits; };  // (WMMA fragments' element type)
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __half2float(__half h) {
    const unsigned sign = (h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        const float v = float(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}
inline __half __float2half_rn(float f) {
    const unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return __half{(unsigned short)(sign | 0x7e00u)};
    if (a >= 0x477ff000u) return __half{(unsigned short)(sign | 0x7c00u)};  // rounds to inf
    if (a < 0x38800000u) {  // f16 subnormal or zero: value * 2^24 rounded to nearest even
        const float v = __uint_as_float(a) * 16777216.0f;
        unsigned m = unsigned(v);
        const float rem = v - float(m);
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
        return __half{(unsigned short)(sign | m)};
    }
    const unsigned r = a + 0x0fffu + ((a >> 13) & 1u);
    return __half{(unsigned short)(sign | ((r - 0x38000000u) >> 13))};
}

// ---- runtime API -------------------------------------------------------------------------------------
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaDataType { CUDA_R_16F = 2, CUDA_R_32F = 0, CUDA_R_16BF = 14 };
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostAllocMapped = 2;

struct cudaDeviceProp {
    char name[256];
};

namespace llaisys_host_exec {

constexpr int kSmCount = 4;  // small, so that grids sized by the device stay small on the CPU
constexpr int kSharedPerBlock = 48 * 1024, kSharedOptin = 99 * 1024;

struct Stream {
    bool capturing = false;
    std::vector<std::function<void()>> captured;
};
struct Graph {
    std::vector<std::function<void()>> work;
};

struct State {
    std::mutex mutex;
    Stream* capturing = nullptr;  // at most one capture at a time here
    cudaError_t last_error = cudaSuccess;
    size_t allocated = 0;
};
inline State& state() {
    static State s;
    return s;
}

inline bool capturing() { return state().capturing != nullptr; }

// Work for `stream`: run now, or record it while the stream is being captured.
inline cudaError_t enqueue(void* stream, std::function<void()> work) {
    auto* s = static_cast<Stream*>(stream);
    if (s && s->capturing) {
        s->captured.push_back(std::move(work));
        return cudaSuccess;
    }
    if (!s && capturing()) return cudaErrorStreamCaptureUnsupported;  // legacy stream during a capture
    work();
    return cudaSuccess;
}

template <class... Params, size_t... I>
void call_kernel(void (*kernel)(Params...), std::tuple<Params...>& args, std::index_sequence<I...>) {
    kernel(std::get<I>(args)...);
}

// One grid at a time in the process (any kernel): `__shared__` statics belong to the running block.
inline std::mutex g_one_grid_at_a_time;

// Runs every block of the grid, one block at a time, with one thread per CUDA thread.
template <class... Params>
void run_grid(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, std::tuple<Params...> args) {
    std::lock_guard<std::mutex> lock(g_one_grid_at_a_time);
    const int threads = int(block.x * block.y * block.z);
    if (threads % LLAISYS_WARP_SIZE) fail("blocks must be whole warps here (blockDim a multiple of WARP_SIZE)");
    Block state_block(threads, shared_bytes);
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    auto body = [&](int linear) {
        tls.block = &state_block;
        tls.linear = linear;
        tls.block_dim = block;
        tls.grid_dim = grid;
        tls.thread_idx = uint3{unsigned(linear) % block.x, (unsigned(linear) / block.x) % block.y,
                               unsigned(linear) / (block.x * block.y)};
        for (unsigned long long b = 0; b < blocks; ++b) {
            tls.block_idx = uint3{unsigned(b % grid.x), unsigned((b / grid.x) % grid.y), unsigned(b / (grid.x * grid.y))};
            if (linear == 0) std::memset(state_block.shared.data(), 0xff, state_block.shared.size() * 16);
            state_block.barrier.wait(&g_site_block_start);
            call_kernel(kernel, args, std::index_sequence_for<Params...>{});
            state_block.barrier.wait(&g_site_block_end);
        }
        tls = ThreadState{};
    };
    std::vector<std::thread> pool;
    pool.reserve(size_t(threads));
    for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
    for (auto& t : pool) t.join();
}

// LLAISYS_LAUNCH under host execution.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, void* stream, const char* name,
            Args&&... args) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    if (block.x * block.y * block.z > 1024) {
        std::fprintf(stderr, "%s: ", name);
        fail("more than 1024 threads per block");
    }
    if (grid.y > 65535 || grid.z > 65535) fail("grid y / z above 65535");
    if (shared_bytes > size_t(kSharedOptin)) fail("more dynamic shared memory than the emulated device has");
    std::tuple<Params...> values(Params(std::forward<Args>(args))...);  // copied now, as CUDA copies arguments
    const cudaError_t err = enqueue(stream, [=] { run_grid(kernel, grid, block, shared_bytes, values); });
    if (err != cudaSuccess) state().last_error = err;
}

}  // namespace llaisys_host_exec

using cudaStream_t = llaisys_host_exec::Stream*;
struct CUevent_st { std::chrono::steady_clock::time_point at; bool recorded = false; };
using cudaEvent_t = CUevent_st*;
using cudaGraph_t = llaisys_host_exec::Graph*;
using cudaGraphExec_t = llaisys_host_exec::Graph*;

inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorNotSupported: return "cudaErrorNotSupported";
        default: return "cudaError";
    }
}
inline const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaErrorStreamCaptureUnsupported ? "operation not permitted when stream is capturing" : "host-exec error";
}
inline cudaError_t cudaGetLastError() {
    const cudaError_t e = llaisys_host_exec::state().last_error;
    llaisys_host_exec::state().last_error = cudaSuccess;
    return e;
}
namespace llaisys_host_exec {
// The emulated machine; the tests change it through the environment to see what the backend makes of
// devices it must refuse and of runtimes that lack a feature:
//   LLAISYS_HOST_EXEC_DEVICES=0          no device: cudaGetDeviceCount fails with cudaErrorNoDevice (what
//                                        CoreX's runtime does without /dev/iluvatar* nodes)
//   LLAISYS_HOST_EXEC_WARP, _CC          the device's warp size and compute capability (x10)
//   LLAISYS_HOST_EXEC_BINARY             the architecture (x10) of the kernels' code for it (default: _CC)
//   LLAISYS_HOST_EXEC_MAX_THREADS        its threads-per-block limit
//   LLAISYS_HOST_EXEC_UNSUPPORTED        "graphs", "wait_event": those calls answer cudaErrorNotSupported
inline int env_int(const char* name, int fallback) {
    const char* text = std::getenv(name);
    return text && *text ? std::atoi(text) : fallback;
}
inline bool unsupported(const char* feature) {
    const char* text = std::getenv("LLAISYS_HOST_EXEC_UNSUPPORTED");
    return text && std::strstr(text, feature);
}
}  // namespace llaisys_host_exec
inline cudaError_t cudaRuntimeGetVersion(int* v) { *v = 13000; return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* count) {
    if (llaisys_host_exec::env_int("LLAISYS_HOST_EXEC_DEVICES", 1) == 0) return cudaErrorNoDevice;
    *count = 1;
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    const int capability = llaisys_host_exec::env_int("LLAISYS_HOST_EXEC_CC", 80);
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = llaisys_host_exec::env_int("LLAISYS_HOST_EXEC_MAX_THREADS", 1024); break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = llaisys_host_exec::kSharedPerBlock; break;
        case cudaDevAttrWarpSize: *value = llaisys_host_exec::env_int("LLAISYS_HOST_EXEC_WARP", LLAISYS_WARP_SIZE); break;
        case cudaDevAttrMultiProcessorCount: *value = llaisys_host_exec::kSmCount; break;
        case cudaDevAttrComputeCapabilityMajor: *value = capability / 10; break;
        case cudaDevAttrComputeCapabilityMinor: *value = capability % 10; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = llaisys_host_exec::kSharedOptin; break;
        default: return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    std::snprintf(p->name, sizeof(p->name), "host execution (warp %d)", LLAISYS_WARP_SIZE);
    return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *total = size_t(1) << 32;
    *free_bytes = *total - std::min(*total, llaisys_host_exec::state().allocated);
    return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
    if (llaisys_host_exec::capturing()) return cudaErrorStreamCaptureUnsupported;
    *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
inline cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) { return cudaMalloc(p, n); }
inline cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) { *d = h; return cudaSuccess; }
inline cudaError_t cudaFreeHost(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
    return llaisys_host_exec::enqueue(s, [=] { std::memset(p, v, n); });
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    if (llaisys_host_exec::capturing()) return cudaErrorStreamCaptureUnsupported;
    std::memset(p, v, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t stream) {
    return llaisys_host_exec::enqueue(stream, [=] { std::memmove(d, s, n); });
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
    if (llaisys_host_exec::capturing()) return cudaErrorStreamCaptureUnsupported;
    std::memmove(d, s, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyPeerAsync(void* d, int, const void* s, int, size_t n, cudaStream_t stream) {
    return cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, stream);
}
inline cudaError_t cudaDeviceSynchronize() {
    return llaisys_host_exec::capturing() ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = new llaisys_host_exec::Stream; return cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) { delete s; return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new CUevent_st; return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    return llaisys_host_exec::enqueue(s, [e] { e->at = std::chrono::steady_clock::now(); e->recorded = true; });
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaDeviceSynchronize(); }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
    return llaisys_host_exec::unsupported("wait_event") ? cudaErrorNotSupported : cudaSuccess;
}
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (llaisys_host_exec::unsupported("graphs")) return cudaErrorNotSupported;
    auto& st = llaisys_host_exec::state();
    if (!s || st.capturing) return cudaErrorStreamCaptureUnsupported;
    s->capturing = true;
    s->captured.clear();
    st.capturing = s;
    return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
    auto& st = llaisys_host_exec::state();
    if (!s || st.capturing != s) return cudaErrorStreamCaptureInvalidated;
    s->capturing = false;
    st.capturing = nullptr;
    *g = new llaisys_host_exec::Graph{std::move(s->captured)};
    s->captured.clear();
    return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
    *exec = new llaisys_host_exec::Graph{g->work};
    return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    for (auto& work : exec->work) {
        const cudaError_t e = llaisys_host_exec::enqueue(s, work);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int value) {
    return value <= llaisys_host_exec::kSharedOptin ? cudaSuccess : cudaErrorInvalidValue;
}
// The architecture of the code the runtime picks for a kernel on the device: LLAISYS_HOST_EXEC_BINARY (default:
// the device's capability), so tests can play a build whose code for the device lacks some instructions.
struct cudaFuncAttributes { int binaryVersion; int ptxVersion; };
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void*) {
    attr->binaryVersion = attr->ptxVersion = llaisys_host_exec::env_int(
        "LLAISYS_HOST_EXEC_BINARY", llaisys_host_exec::env_int("LLAISYS_HOST_EXEC_CC", 80));
    return cudaSuccess;
}

// ---- cuBLAS: one reference GEMM ------------------------------------------------------------------------
enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_ARCH_MISMATCH = 8, CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13, CUBLAS_STATUS_INTERNAL_ERROR = 14, CUBLAS_STATUS_NOT_SUPPORTED = 15
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum cublasPointerMode_t { CUBLAS_POINTER_MODE_HOST = 0 };
struct cublasContext { cudaStream_t stream = nullptr; };
using cublasHandle_t = cublasContext*;

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
    if (llaisys_host_exec::capturing()) return CUBLAS_STATUS_ALLOC_FAILED;
    *h = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->stream = s; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }

namespace llaisys_host_exec {
inline double load_element(const void* p, int64_t i, cudaDataType t) {
    switch (t) {
        case CUDA_R_32F: return static_cast<const float*>(p)[i];
        case CUDA_R_16F: return __half2float(__half{static_cast<const unsigned short*>(p)[i]});
        default: return __uint_as_float(unsigned(static_cast<const unsigned short*>(p)[i]) << 16);
    }
}
inline void store_element(void* p, int64_t i, cudaDataType t, float v) {
    switch (t) {
        case CUDA_R_32F: static_cast<float*>(p)[i] = v; break;
        case CUDA_R_16F: static_cast<unsigned short*>(p)[i] = __float2half_rn(v).bits; break;
        default: {
            unsigned u = __float_as_uint(v);
            if ((u & 0x7fffffffu) > 0x7f800000u) u = (u | 0x00400000u);
            else u += 0x7fffu + ((u >> 16) & 1u);
            static_cast<unsigned short*>(p)[i] = (unsigned short)(u >> 16);
        }
    }
}
}  // namespace llaisys_host_exec

// C (column-major, m x n) = alpha op(A) op(B) + beta C, accumulated in double, rounded once.
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                                   cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                                   cudaDataType compute, cublasGemmAlgo_t) {
    if (compute != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
    using llaisys_host_exec::load_element;
    const cudaError_t err = llaisys_host_exec::enqueue(h->stream, [=] {
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                double acc = 0;
                for (int p = 0; p < k; ++p) {
                    const double a = ta == CUBLAS_OP_N ? load_element(A, int64_t(p) * lda + i, at)
                                                       : load_element(A, int64_t(i) * lda + p, at);
                    const double b = tb == CUBLAS_OP_N ? load_element(B, int64_t(j) * ldb + p, bt)
                                                       : load_element(B, int64_t(p) * ldb + j, bt);
                    acc += a * b;
                }
                double c = al * acc;
                if (be != 0.0f) c += be * load_element(C, int64_t(j) * ldc + i, ct);
                llaisys_host_exec::store_element(C, int64_t(j) * ldc + i, ct, float(c));
            }
    });
    return err == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// ---- WMMA (nvcuda::wmma): 16 x 16 x 16 fragments, f16 / bf16 in, f32 accumulate ---------------------------
// The API's contract, and no more: a fragment's elements are spread over the warp's lanes in an order the
// API leaves opaque (here a scrambled one, different from any GPU's, so a kernel that assumed a layout would
// fail), so a kernel may only fill, load, mma and store fragments, and apply element-wise operations to
// accumulators that share one shape (their orders agree). load / store / mma_sync are warp-collective: every
// lane of the warp must call them together (a barrier of the warp checks it), and loads / stores check the
// API's requirements (a 256-bit aligned pointer, ldm a multiple of 16 bytes). mma_sync computes each
// D[i][j] = C[i][j] + sum_k A[i][k] B[k][j] with exact products summed in double and rounded to f32 once: the
// same for every element and every position, which is all that batch invariance needs. Whether a GPU's tensor
// cores round the same way (they do not: they keep fewer bits) is NOT something host execution can show;
// tools/gpu_check.sh compares rows computed at different M bit for bit on the GPU.
#if LLAISYS_WARP_SIZE == 32 && !defined(LLAISYS_COREX_CONFIG)
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "host execution emulates the 16 x 16 x 16 fragments only");
    static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                   : std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                  "f16 / bf16 inputs, f32 accumulators");

public:
    enum { num_elements = 256 / LLAISYS_WARP_SIZE };
    T x[num_elements];
};

namespace detail {

constexpr int kElements = 256 / LLAISYS_WARP_SIZE;

// Element e of lane l is matrix element position(l, e) = row * 16 + column (a bijection, deliberately scrambled).
inline int position(int lane, int e) { return e * LLAISYS_WARP_SIZE + (lane * 7 + e * 3) % LLAISYS_WARP_SIZE; }
inline int lane() { return ::llaisys_host_exec::tls.linear % LLAISYS_WARP_SIZE; }
inline void warp_sync(const void* site) { ::llaisys_host_exec::my_warp().barrier.wait(site); }

inline double value(__half h) { return __half2float(h); }
inline double value(__nv_bfloat16 b) { return __uint_as_float(unsigned(b.bits) << 16); }
inline double value(float f) { return f; }

template <class T>
void check_pointer(const T* p, unsigned ldm) {
    if (reinterpret_cast<uintptr_t>(p) % 32) ::llaisys_host_exec::fail("WMMA load / store: pointer not 256-bit aligned");
    if ((ldm * sizeof(T)) % 16) ::llaisys_host_exec::fail("WMMA load / store: ldm not a multiple of 16 bytes");
}

// Offset of element (r, c) of a 16 x 16 matrix stored row- or column-major with leading dimension ldm.
inline size_t offset(int r, int c, unsigned ldm, bool row_major) { return row_major ? size_t(r) * ldm + c : size_t(c) * ldm + r; }

template <class Frag, class T>
void load(Frag& f, const T* p, unsigned ldm, bool row_major) {
    static char site;
    warp_sync(&site);
    check_pointer(p, ldm);
    for (int e = 0; e < kElements; ++e) {
        const int pos = position(lane(), e);
        f.x[e] = p[offset(pos / 16, pos % 16, ldm, row_major)];
    }
}

}  // namespace detail

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& v) {
    for (int e = 0; e < detail::kElements; ++e) f.x[e] = v;
}

template <class T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, row_major>& f, const T* p, unsigned ldm) {
    detail::load(f, p, ldm, true);
}
template <class T>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, col_major>& f, const T* p, unsigned ldm) {
    detail::load(f, p, ldm, false);
}
template <class T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, row_major>& f, const T* p, unsigned ldm) {
    detail::load(f, p, ldm, true);
}
template <class T>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, col_major>& f, const T* p, unsigned ldm) {
    detail::load(f, p, ldm, false);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t layout) {
    detail::load(f, p, ldm, layout == mem_row_major);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
    static char site;
    detail::warp_sync(&site);
    detail::check_pointer(p, ldm);
    for (int e = 0; e < detail::kElements; ++e) {
        const int pos = detail::position(detail::lane(), e);
        p[detail::offset(pos / 16, pos % 16, ldm, layout == mem_row_major)] = f.x[e];
    }
}

// D = A B + C (d may be c): the lanes' elements go to the warp's scratch, then each lane computes its own.
template <class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    static char site;
    auto& m = ::llaisys_host_exec::my_warp().mma;
    detail::warp_sync(&site);  // every lane here, and the scratch free
    for (int e = 0; e < detail::kElements; ++e) {
        const int pos = detail::position(detail::lane(), e);
        m[0][pos] = detail::value(a.x[e]);
        m[1][pos] = detail::value(b.x[e]);
        m[2][pos] = c.x[e];
    }
    detail::warp_sync(&site);
    float result[detail::kElements];
    for (int e = 0; e < detail::kElements; ++e) {
        const int pos = detail::position(detail::lane(), e), i = pos / 16, j = pos % 16;
        double sum = 0.0;  // 16 exact products (f16 / bf16 products fit a double exactly), summed in order
        for (int k = 0; k < 16; ++k) sum += m[0][i * 16 + k] * m[1][k * 16 + j];
        result[e] = float(sum + m[2][pos]);
    }
    detail::warp_sync(&site);  // every lane has read the scratch
    for (int e = 0; e < detail::kElements; ++e) d.x[e] = result[e];
}

}  // namespace nvcuda::wmma
#endif
