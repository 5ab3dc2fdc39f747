// Per-device and per-stream state, created once and reused so that operators allocate nothing:
//   DeviceContext: the device's properties, the kernel-error record and the default stream's context.
//   StreamContext: a stream with its own cuBLAS handle (and cuBLAS workspace) and an operator workspace
//   (split-K partial results). The opaque stream handle handed to core IS the StreamContext pointer;
//   NULL means the device's default stream.
// Kernel errors: kernels that find bad data only they read (an embedding index out of range, NaN logits)
// record it in a small host-mapped record; the next synchronizing call (stream/device/event synchronize,
// a synchronous copy) reports it as LLAISYS_INVALID_ARGUMENT, as backend.h allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../compat.h"
#include "check.h"

namespace llaisys::cuda {

enum KernelErrorCode : int {
    kNoKernelError = 0,
    kEmbeddingIndexOutOfRange = 1,  // a = index value, b = position, c = vocab
    kSampleNaN = 2,                 // a = position
    kSampleAllNegInf = 3,
    kPagedSlotOutOfRange = 4,  // a = slot, b = token, c = num_slots
    kPagedQueryStart = 5,      // a = value, b = index, c = T
    kPagedSeqLen = 6,          // a = seq_lens[s], b = s, c = max_blocks * block_size
    kPagedBlockId = 7,         // a = block id, b = index in block_tables (s * max_blocks + j), c = num_blocks
    kPenaltyIdOutOfRange = 8,      // a = id, b = position, c = vocab
    kPenaltyIdsNotIncreasing = 9,  // a = id, b = position, c = the id before it
    kPenaltyNegativeCount = 10,    // a, c = the counts, b = position
    kMoeExpertOutOfRange = 11,  // a = expert id, b = row, c = slot
    kLogprobsNoDistribution = 12,  // a = 0 (NaN), 1 (+inf) or 2 (all -inf), b = position of the maximum
    kGqPermOutOfRange = 13,        // a = perm value, b = position, c = K
    kLoraShrinkAdapterOutOfRange = 14,  // a = adapter slot, b = row, c = S
    kLoraExpandAdapterOutOfRange = 15,  // a = adapter slot, b = row, c = S
    // paged_kv_write_q / paged_attention_q: as kPagedSlotOutOfRange ... kPagedBlockId (the op named differs)
    kPagedQSlotOutOfRange = 16,
    kPagedQQueryStart = 17,
    kPagedQSeqLen = 18,
    kPagedQBlockId = 19,
    // paged_latent_attention: as kPagedQueryStart ... kPagedBlockId (the op named differs)
    kPagedLatentQueryStart = 20,
    kPagedLatentSeqLen = 21,
    kPagedLatentBlockId = 22,
};

struct KernelErrorRecord {
    int code;  // KernelErrorCode; the first error wins (atomicCAS from 0)
    int unused;
    long long a, b, c;
};

// Device side: record an error unless one is pending already.
__device__ __forceinline__ void report_kernel_error(KernelErrorRecord* record, int code, long long a, long long b,
                                                    long long c) {
    if (atomicCAS(&record->code, 0, code) == 0) {
        record->a = a;
        record->b = b;
        record->c = c;
    }
}

// The positive integer in environment variable `name`; 0 when it is unset, not a number or not positive.
int64_t env_positive(const char* name);

// Per stream: split-K partials of self_attention; LLAISYS_CUDA_WORKSPACE_BYTES overrides it (read once;
// the tests shrink it to reach the chunked paths).
size_t op_workspace_bytes();
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // per stream: cuBLAS (its recommendation for Hopper)

struct StreamContext {
    int device = -1;                // llaisys device index
    cudaStream_t stream = nullptr;  // nullptr: the legacy default stream
    cublasHandle_t cublas = nullptr;
    void* cublas_workspace = nullptr;
    void* workspace = nullptr;  // op_workspace_bytes(), 256-byte aligned
    size_t workspace_bytes = 0;
    int* capturing_thread = nullptr;  // while a graph capture runs: the capturing thread's count (runtime.cu)
};

struct DeviceContext {
    int index = -1;    // llaisys device index
    int ordinal = -1;  // CUDA device ordinal
    int sm_count = 0;
    int max_threads_per_block = 0;
    size_t max_shared_per_block = 0;        // without opt-in
    size_t max_shared_per_block_optin = 0;  // with cudaFuncAttributeMaxDynamicSharedMemorySize
    KernelErrorRecord* error_host = nullptr;    // host view (mapped) or host copy
    KernelErrorRecord* error_device = nullptr;  // what kernels write
    bool error_mapped = false;                  // false: error_device is device memory, copied on check
    StreamContext default_stream;
};

// Usable devices: the CUDA ordinals that run this build's kernels (warp size, architecture). The reason
// the others (or all) are unusable is in usable_devices_reason().
const std::vector<int>& usable_devices();
const std::string& usable_devices_reason();

// The context of llaisys device `device` (created on first use), made current on this thread.
// InvalidArgument for an index out of range.
DeviceContext& device_context(int device);

// The context behind a stream handle (NULL: the device's default stream), with its device made current.
StreamContext& stream_context(int device, void* stream);

StreamContext* create_stream_context(int device);
void destroy_stream_context(StreamContext* ctx);

// After a synchronizing call: throws InvalidArgument for an error a kernel recorded (and clears it).
void check_kernel_errors(DeviceContext& ctx);

// The build's architectures, e.g. "sm_80 sm_86 ... compute_120" (LLAISYS_CUDA_SASS / _PTX) or "ivcore20"
// (CoreX: LLAISYS_COREX_ARCHS).
const char* built_architectures();

}  // namespace llaisys::cuda
