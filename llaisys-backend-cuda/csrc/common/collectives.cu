// The collectives slots of backend.h over NCCL (CoreX's NCCL-compatible library on Iluvatar), opened with
// dlopen when first needed (nccl_api.h): a machine without it loads this backend all the same and reports
// the collectives as LLAISYS_NOT_SUPPORTED, naming what to install.
//
// Communicators are non-blocking (ncclConfig_t.blocking = 0), so that no call can wait forever: joining
// polls ncclCommGetAsyncError until every rank has joined or the timeout passes (then the communicator is
// aborted), and a collective that NCCL is still enqueueing is polled the same way. A collective waiting on
// the GPU for a rank that died is ended by comm_abort (ncclCommAbort), which llaisys' supervisor calls from
// another thread. The sum is NCCL's (its ring or tree order, for the sizes and topology at hand), not the
// fixed rank order of the CPU's shared-memory communicator.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "api.h"
#include "check.h"
#include "context.h"
#include "nccl_api.h"

namespace llaisys::cuda {

namespace nccl {

namespace {

std::string library_folder() {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&library_folder), &info) || !info.dli_fname) return "";
    std::string path = info.dli_fname;
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The library: $LLAISYS_NCCL_LIBRARY, else beside this package / in the SDK, else on the library path.
void* open_library(std::string& tried) {
    std::string candidates[4];
    int n = 0;
    if (const char* chosen = std::getenv("LLAISYS_NCCL_LIBRARY"); chosen && *chosen) candidates[n++] = chosen;
    if (*kNcclBesideLibrary) candidates[n++] = library_folder() + "/" + kNcclBesideLibrary;
    if (*kNcclSdkHome) {
        const char* home = std::getenv(kNcclSdkHome);
        candidates[n++] = std::string(home && *home ? home : kNcclSdkDefault) + "/" + kNcclSdkFile;
    }
    candidates[n++] = kNcclName;
    for (int i = 0; i < n; ++i) {
        if (void* handle = dlopen(candidates[i].c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
        tried += (tried.empty() ? "" : ", ") + candidates[i];
    }
    return nullptr;
}

template <class F>
void resolve(void* handle, F& fn, const char* name) {
    fn = reinterpret_cast<F>(dlsym(handle, name));
    if (!fn) throw NotSupported(std::string("the NCCL library lacks ") + name + ": " + kNcclRemedy);
}

}  // namespace

const Api& api() {
    static std::mutex lock;
    static Api table{};
    static bool loaded = false;
    std::lock_guard<std::mutex> guard_lock(lock);
    if (loaded) return table;
    std::string tried;
    void* handle = open_library(tried);
    if (!handle)
        throw NotSupported(std::string("collectives need NCCL, which was not found (tried ") + tried + "): " +
                           kNcclRemedy);
    resolve(handle, table.get_unique_id, "ncclGetUniqueId");
    resolve(handle, table.comm_init_rank_config, "ncclCommInitRankConfig");
    resolve(handle, table.comm_get_async_error, "ncclCommGetAsyncError");
    resolve(handle, table.comm_abort, "ncclCommAbort");
    resolve(handle, table.comm_destroy, "ncclCommDestroy");
    resolve(handle, table.all_reduce, "ncclAllReduce");
    resolve(handle, table.all_gather, "ncclAllGather");
    resolve(handle, table.broadcast, "ncclBroadcast");
    resolve(handle, table.get_error_string, "ncclGetErrorString");
    loaded = true;
    return table;
}

}  // namespace nccl

namespace {

struct Communicator {
    nccl::Comm comm = nullptr;
    int device = 0, rank = 0, world = 0;
    std::chrono::milliseconds timeout{0};
    std::atomic<bool> aborted{false};  // set by comm_abort, possibly from another thread
    std::string reason;                // why (written before `aborted`)
};

Communicator* as_comm(void* comm) {
    if (!comm) throw InvalidArgument("comm is null");
    return static_cast<Communicator*>(comm);
}

[[noreturn]] void throw_nccl(nccl::Result result, const std::string& what) {
    throw std::runtime_error(what + ": " + nccl::api().get_error_string(result));
}

// Waits while the non-blocking communicator's last call is in progress (at most its timeout), then throws
// on any error it reports.
void settle(Communicator& c, nccl::Result result, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + c.timeout;
    while (result == nccl::kInProgress) {
        if (c.aborted) throw std::runtime_error(what + ": the communicator was aborted: " + c.reason);
        if (std::chrono::steady_clock::now() > deadline) {
            c.reason = what + " did not complete within the timeout";
            c.aborted = true;
            (void)nccl::api().comm_abort(c.comm);
            throw std::runtime_error(what + ": not done within " + std::to_string(c.timeout.count()) +
                                     " ms (a rank is late or gone); the communicator is aborted");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        if (nccl::api().comm_get_async_error(c.comm, &result) != nccl::kSuccess) break;
    }
    if (result != nccl::kSuccess) throw_nccl(result, what);
}

Communicator& usable(void* comm, const char* what) {
    Communicator& c = *as_comm(comm);
    if (c.aborted) throw std::runtime_error(std::string(what) + ": the communicator was aborted: " + c.reason);
    return c;
}

int data_type(int dtype) {
    switch (dtype) {
        case LLAISYS_F32: return nccl::kFloat32;
        case LLAISYS_F16: return nccl::kFloat16;
        case LLAISYS_BF16: return nccl::kBfloat16;
        default: unsupported_dtype(dtype);
    }
}

}  // namespace

}  // namespace llaisys::cuda

using namespace llaisys::cuda;

int LLAISYS_FN(comm_unique_id)(int device, char* id) {
    return guard("comm_unique_id", [&] {
        if (!id) throw InvalidArgument("id is null");
        device_context(device);  // a valid device index
        static_assert(nccl::kUniqueIdBytes == LLAISYS_UNIQUE_ID_BYTES, "an NCCL unique id fills a llaisys one");
        nccl::UniqueId unique{};
        const nccl::Result result = nccl::api().get_unique_id(&unique);
        if (result != nccl::kSuccess) throw std::runtime_error(std::string("ncclGetUniqueId: ") +
                                                               nccl::api().get_error_string(result));
        std::memcpy(id, unique.internal, LLAISYS_UNIQUE_ID_BYTES);
    });
}

int LLAISYS_FN(comm_create)(int device, const char* id, int rank, int world_size, int64_t timeout_ms, void** comm) {
    return guard("comm_create", [&] {
        if (!id || !comm) throw InvalidArgument("id and comm must not be null");
        if (world_size < 1 || rank < 0 || rank >= world_size)
            throw InvalidArgument("rank " + std::to_string(rank) + " is not in [0, world_size = " +
                                  std::to_string(world_size) + ")");
        if (timeout_ms <= 0) throw InvalidArgument("timeout_ms must be > 0, got " + std::to_string(timeout_ms));
        device_context(device);  // makes the device current: NCCL binds the communicator to it
        const nccl::Api& api = nccl::api();
        nccl::UniqueId unique{};
        std::memcpy(unique.internal, id, LLAISYS_UNIQUE_ID_BYTES);
        auto* c = new Communicator();
        c->device = device;
        c->rank = rank;
        c->world = world_size;
        c->timeout = std::chrono::milliseconds(timeout_ms);
        nccl::Config config;
        const nccl::Result started = api.comm_init_rank_config(&c->comm, world_size, unique, rank, &config);
        try {
            if (started != nccl::kSuccess && started != nccl::kInProgress) throw_nccl(started, "ncclCommInitRankConfig");
            settle(*c, started, "joining the communicator (rank " + std::to_string(rank) + " of " +
                                    std::to_string(world_size) + ")");
        } catch (...) {
            if (c->comm && !c->aborted) (void)api.comm_abort(c->comm);
            delete c;
            throw;
        }
        *comm = c;
    });
}

int LLAISYS_FN(comm_destroy)(void* comm) {
    return guard("comm_destroy", [&] {
        if (!comm) return;
        Communicator* c = static_cast<Communicator*>(comm);
        const bool aborted = c->aborted;
        nccl::Comm handle = c->comm;
        delete c;
        if (handle && !aborted) {  // (an aborted communicator was freed by ncclCommAbort)
            const nccl::Result result = nccl::api().comm_destroy(handle);
            if (result != nccl::kSuccess && result != nccl::kInProgress) throw_nccl(result, "ncclCommDestroy");
        }
    });
}

int LLAISYS_FN(comm_abort)(void* comm, const char* reason) {
    return guard("comm_abort", [&] {
        Communicator& c = *as_comm(comm);
        if (c.aborted) return;
        c.reason = reason ? reason : "";
        c.aborted = true;
        (void)nccl::api().comm_abort(c.comm);  // the GPU work waiting for other ranks ends
    });
}

int LLAISYS_FN(comm_all_reduce)(int device, void* stream, void* comm, int dtype, int64_t n, void* out,
                                const void* in) {
    return guard("comm_all_reduce", [&] {
        Communicator& c = usable(comm, "all_reduce");
        const int type = data_type(dtype);
        StreamContext& s = stream_context(device, stream);
        settle(c, nccl::api().all_reduce(in, out, size_t(n), type, nccl::kSum, c.comm, s.stream), "ncclAllReduce");
    });
}

int LLAISYS_FN(comm_all_gather)(int device, void* stream, void* comm, int64_t nbytes, void* out, const void* in) {
    return guard("comm_all_gather", [&] {
        Communicator& c = usable(comm, "all_gather");
        StreamContext& s = stream_context(device, stream);
        settle(c, nccl::api().all_gather(in, out, size_t(nbytes), nccl::kUint8, c.comm, s.stream), "ncclAllGather");
    });
}

int LLAISYS_FN(comm_broadcast)(int device, void* stream, void* comm, int64_t nbytes, void* data, int root) {
    return guard("comm_broadcast", [&] {
        Communicator& c = usable(comm, "broadcast");
        if (root < 0 || root >= c.world)
            throw InvalidArgument("root " + std::to_string(root) + " is not a rank of this communicator (world size " +
                                  std::to_string(c.world) + ")");
        StreamContext& s = stream_context(device, stream);
        settle(c, nccl::api().broadcast(data, data, size_t(nbytes), nccl::kUint8, root, c.comm, s.stream),
               "ncclBroadcast");
    });
}
