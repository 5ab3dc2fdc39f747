// The part of NCCL's C API that the collectives slots call (collectives.cu), declared here so that the build
// needs no NCCL header: the library is opened with dlopen when a communicator is first made, and a
// machine without it reports the collectives as not supported (backend.h) instead of failing to load.
// Every type below is the ABI NCCL keeps stable across 2.x (checked against the nccl.h of NVIDIA's
// nvidia-nccl-cu13 2.32.3 wheel: see tests/backends/cuda/test_nccl_api.py, which compiles a copy of these
// declarations against a real nccl.h where one is installed). CoreX's NCCL-compatible library (Iluvatar)
// exports the same names.
#pragma once

#include <cstddef>

#include "../compat.h"

namespace llaisys::cuda::nccl {

enum Result : int {  // ncclResult_t
    kSuccess = 0,
    kInProgress = 7,  // a non-blocking communicator's call still runs (ncclCommGetAsyncError says when done)
};

enum DataType : int {  // ncclDataType_t
    kUint8 = 1,
    kFloat16 = 6,
    kFloat32 = 7,
    kBfloat16 = 9,
};

enum RedOp : int { kSum = 0 };  // ncclRedOp_t

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {                       // ncclUniqueId
    char internal[kUniqueIdBytes];
};

// ncclConfig_t as NCCL 2.14 defined it (version 21400): NCCL reads `size` bytes of it and defaults every
// field a later version added, so this older, shorter form configures any NCCL >= 2.14.
struct Config {
    size_t size = sizeof(Config);
    unsigned int magic = 0xcafebeef;  // NCCL_API_MAGIC
    unsigned int version = 21400;     // NCCL_VERSION(2, 14, 0)
    int blocking = 0;                 // 0: calls return at once; ncclCommGetAsyncError reports progress
    int cga_cluster_size = kUndefined;
    int min_ctas = kUndefined;
    int max_ctas = kUndefined;
    const char* net_name = nullptr;
    static constexpr int kUndefined = static_cast<int>(0x80000000u);  // NCCL_CONFIG_UNDEF_INT (INT_MIN)
};

using Comm = struct ncclComm*;  // ncclComm_t

// The functions, resolved by name from the opened library.
struct Api {
    Result (*get_unique_id)(UniqueId* id);
    Result (*comm_init_rank_config)(Comm* comm, int nranks, UniqueId id, int rank, Config* config);
    Result (*comm_get_async_error)(Comm comm, Result* async_error);
    Result (*comm_abort)(Comm comm);
    Result (*comm_destroy)(Comm comm);
    Result (*all_reduce)(const void* send, void* recv, size_t count, int datatype, int op, Comm comm,
                         cudaStream_t stream);
    Result (*all_gather)(const void* send, void* recv, size_t send_count, int datatype, Comm comm,
                         cudaStream_t stream);
    Result (*broadcast)(const void* send, void* recv, size_t count, int datatype, int root, Comm comm,
                        cudaStream_t stream);
    const char* (*get_error_string)(Result result);
};

// The library's functions, opened on first use; NotSupported, naming what to install, when it is missing.
const Api& api();

}  // namespace llaisys::cuda::nccl
