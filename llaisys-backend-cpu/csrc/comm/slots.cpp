// The collectives slots of backend.h over the shared-memory communicator (shm_comm.h). The collectives go
// through launch() like operators: on a stream being captured they are recorded and run at each replay.
#include <chrono>
#include <string>

#include "../common/api.h"
#include "shm_comm.h"

namespace {

using llaisys::InvalidArgument;
using llaisys::cpu::ShmComm;

void check_device(int device) {
    if (device != 0) throw InvalidArgument("cpu has one device (index 0), got " + std::to_string(device));
}

ShmComm* as_comm(void* comm) {
    if (!comm) throw InvalidArgument("comm is null");
    return static_cast<ShmComm*>(comm);
}

}  // namespace

int LLAISYS_FN(comm_unique_id)(int device, char* id) {
    return llaisys::guard("comm_unique_id", [&] {
        check_device(device);
        if (!id) throw InvalidArgument("id is null");
        ShmComm::unique_id(id);
    });
}

int LLAISYS_FN(comm_create)(int device, const char* id, int rank, int world_size, int64_t timeout_ms, void** comm) {
    return llaisys::guard("comm_create", [&] {
        check_device(device);
        if (!id || !comm) throw InvalidArgument("id and comm must not be null");
        if (world_size < 1 || rank < 0 || rank >= world_size)
            throw InvalidArgument("rank " + std::to_string(rank) + " is not in [0, world_size = " +
                                  std::to_string(world_size) + ")");
        if (timeout_ms <= 0) throw InvalidArgument("timeout_ms must be > 0, got " + std::to_string(timeout_ms));
        llaisys::refuse_while_capturing("comm_create");
        *comm = new ShmComm(id, rank, world_size, std::chrono::milliseconds(timeout_ms));
    });
}

int LLAISYS_FN(comm_destroy)(void* comm) {
    return llaisys::guard("comm_destroy", [&] { delete static_cast<ShmComm*>(comm); });
}

int LLAISYS_FN(comm_abort)(void* comm, const char* reason) {
    return llaisys::guard("comm_abort", [&] { as_comm(comm)->abort(reason ? reason : ""); });
}

int LLAISYS_FN(comm_all_reduce)(int device, void* stream, void* comm, int dtype, int64_t n, void* out,
                                const void* in) {
    return llaisys::launch("comm_all_reduce", stream, [=] {
        check_device(device);
        as_comm(comm)->all_reduce(dtype, n, out, in);
    });
}

int LLAISYS_FN(comm_all_gather)(int device, void* stream, void* comm, int64_t nbytes, void* out, const void* in) {
    return llaisys::launch("comm_all_gather", stream, [=] {
        check_device(device);
        as_comm(comm)->all_gather(nbytes, out, in);
    });
}

int LLAISYS_FN(comm_broadcast)(int device, void* stream, void* comm, int64_t nbytes, void* data, int root) {
    return llaisys::launch("comm_broadcast", stream, [=] {
        check_device(device);
        as_comm(comm)->broadcast(nbytes, data, root);
    });
}
