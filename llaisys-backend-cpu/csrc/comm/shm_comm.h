// A communicator of processes on one host (backend.h "collectives"): POSIX shared memory that every rank
// maps, per-rank sequence numbers as futex words, and one data slot per rank in each of two buffers.
//
// Collective k (a large one is cut into several, each one "step" of the protocol) uses buffer k % 2:
//   1. wait until every rank has finished reading step k - 2 (the last use of that buffer);
//   2. write this rank's contribution into its slot, then publish arrived = k;
//   3. wait for the ranks whose data the step reads (all of them; a broadcast's root alone);
//   4. read: the sum of the slots in rank order (all-reduce), every slot (all-gather), the root's slot;
//   5. publish done = k.
// A rank reads other ranks' slots only after seeing their `arrived` (acquire), and a slot is overwritten
// only after its readers published `done`, so no step ever sees a half-written buffer. Waits spin briefly,
// then sleep on the futex word in slices, checking on each wake whether the communicator was aborted,
// whether the rank waited for is still alive, and whether the deadline (the communicator's timeout,
// counted from this rank's arrival) has passed; each failure names the rank and the collective. Each step
// also carries its kind and size, so ranks that call different collectives are told so, not handed each
// other's data.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace llaisys::cpu {

struct ShmHeader;

class ShmComm {
  public:
    // Joins (rank 0: creates) the segment named in `id` (LLAISYS_UNIQUE_ID_BYTES from unique_id()), waiting at
    // most `timeout` for all ranks to join.
    ShmComm(const char* id, int rank, int world_size, std::chrono::milliseconds timeout);
    ~ShmComm();
    ShmComm(const ShmComm&) = delete;
    ShmComm& operator=(const ShmComm&) = delete;

    // A fresh id: a random segment name (see backend.h comm_unique_id).
    static void unique_id(char* id);

    int rank() const { return rank_; }
    int world_size() const { return world_; }

    // The collectives of backend.h; `where` names the slot in error messages.
    void all_reduce(int dtype, int64_t n, void* out, const void* in);
    void all_gather(int64_t nbytes, void* out, const void* in);
    void broadcast(int64_t nbytes, void* data, int root);
    // Fails every pending and later collective of every rank with `reason`.
    void abort(const std::string& reason);

  private:
    // One protocol step of `what`: this rank's `contribute` bytes (null: none) into its slot, the wait for
    // the ranks it reads (root < 0: all of them), then read() over the slots.
    template <class Read>
    void step(const char* what, int kind, const void* contribute, size_t bytes, int root, Read&& read);
    unsigned char* slot(uint32_t step, int rank) const;
    // Waits until word >= target (wrap-around order); `peer` is the rank whose word it is (named on failure).
    void wait_for(std::atomic<uint32_t>& word, uint32_t target, int peer, bool bounded, const char* what);
    void check_aborted() const;
    void wake(std::atomic<uint32_t>& word);
    std::string describe(const char* what) const;

    ShmHeader* header_ = nullptr;
    size_t mapped_bytes_ = 0;
    int rank_, world_;
    uint32_t step_ = 0;  // this rank's last step
    uint64_t collectives_ = 0;  // collectives this rank started (numbered in messages)
    std::chrono::milliseconds timeout_;
    std::string name_;
};

}  // namespace llaisys::cpu
