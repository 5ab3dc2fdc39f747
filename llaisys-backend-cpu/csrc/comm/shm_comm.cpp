// The shared-memory communicator of shm_comm.h.
#include "shm_comm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../common/api.h"
#include "../common/thread_pool.h"
#include "../ops/reduce_sum.h"
#include "llaisys/backend.h"

namespace llaisys::cpu {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x314d485353594c4cull;  // "LLSYSHM1"
constexpr char kIdTag[] = "llaisys-shm-v1:";
constexpr size_t kDefaultSlotBytes = size_t(4) << 20;  // per rank and buffer: a prefill's activations fit in one step
constexpr auto kSleepSlice = std::chrono::milliseconds(20);  // how often a sleeping wait checks its peer
constexpr size_t kReasonBytes = 240;

// One rank's words, on a cache line of its own (only that rank writes them).
struct alignas(64) RankState {
    std::atomic<uint32_t> arrived;  // futex word: the last step whose data this rank has put in its slot
    std::atomic<uint32_t> done;     // futex word: the last step this rank has finished reading
    std::atomic<int32_t> pid;       // 0 until the rank joins
    std::atomic<uint64_t> what[2];  // what step k is (kind, root, bytes: tag()), at [k % 2], before `arrived`
    char reason[kReasonBytes];      // why this rank aborted the communicator (if it did)
};

// A step's kind, root and size in one word, so that a rank can tell when its peers are in another collective
// (ranks out of step: a caller's bug, reported instead of mixing unrelated data).
uint64_t tag(int kind, int root, size_t bytes) {
    return uint64_t(kind) << 56 | uint64_t(uint8_t(root + 1)) << 48 | (uint64_t(bytes) & ((uint64_t(1) << 48) - 1));
}

std::string describe_tag(uint64_t t) {
    static const char* const kinds[] = {"?", "all_reduce", "all_gather", "broadcast"};
    const int kind = int(t >> 56), root = int((t >> 48) & 0xff) - 1;
    return std::string(kinds[kind < 4 ? kind : 0]) + (root >= 0 ? " from root " + std::to_string(root) : "") +
           " of " + std::to_string(t & ((uint64_t(1) << 48) - 1)) + " bytes";
}

}  // namespace

struct ShmHeader {
    std::atomic<uint64_t> magic;  // kMagic once rank 0 has laid the segment out
    uint32_t world_size;
    uint32_t reserved;
    uint64_t slot_bytes;
    uint64_t data_offset;
    std::atomic<uint32_t> joined;    // ranks that have mapped the segment
    std::atomic<uint32_t> sleepers;  // waits asleep on a futex word of this segment
    std::atomic<uint32_t> aborted;   // 0, else 1 + the rank that aborted (its RankState::reason says why)

    RankState* ranks() { return reinterpret_cast<RankState*>(reinterpret_cast<unsigned char*>(this) + kRanksOffset); }
    static constexpr size_t kRanksOffset = 128;
};

namespace {

static_assert(sizeof(ShmHeader) <= ShmHeader::kRanksOffset, "the header fits before the rank states");
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free (address-free)");

int futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
    // not FUTEX_*_PRIVATE: the word lives in memory that other processes map
    return int(syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0));
}

bool reached(uint32_t value, uint32_t target) { return int32_t(value - target) >= 0; }  // wrap-around order

size_t slot_bytes_from_environment() {
    const char* text = std::getenv("LLAISYS_CPU_COMM_SLOT_BYTES");  // tests shrink it to reach the chunked steps
    if (!text || !*text) return kDefaultSlotBytes;
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (*end || value < 64) throw InvalidArgument("LLAISYS_CPU_COMM_SLOT_BYTES must be an integer >= 64, got '" +
                                                  std::string(text) + "'");
    return size_t(value) / 64 * 64;
}

// Whether process `pid` still runs (a zombie, dead but not yet reaped by its parent, does not).
bool process_alive(int32_t pid) {
    if (pid <= 0) return true;  // not joined yet: the join's own timeout covers it
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!stat || !std::getline(stat, line)) return false;
    const size_t close = line.rfind(')');
    return close == std::string::npos || close + 2 >= line.size() || (line[close + 2] != 'Z' && line[close + 2] != 'X');
}

std::string seconds(std::chrono::milliseconds ms) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g s", double(ms.count()) / 1000.0);
    return text;
}

std::string segment_name(const char* id) {
    const size_t tag = sizeof(kIdTag) - 1;
    const char* end = static_cast<const char*>(std::memchr(id, '\0', LLAISYS_UNIQUE_ID_BYTES));
    if (!end || std::strncmp(id, kIdTag, tag) != 0 || size_t(end - id) <= tag + 1 || id[tag] != '/')
        throw InvalidArgument("not a unique id of the cpu backend's communicator (make it with comm_unique_id)");
    return std::string(id + tag, end);
}

}  // namespace

void ShmComm::unique_id(char* id) {
    std::random_device entropy;
    char name[64];
    std::snprintf(name, sizeof(name), "/llaisys-%d-%08x%08x", int(getpid()), unsigned(entropy()), unsigned(entropy()));
    std::memset(id, 0, LLAISYS_UNIQUE_ID_BYTES);
    std::snprintf(id, LLAISYS_UNIQUE_ID_BYTES, "%s%s", kIdTag, name);
}

ShmComm::ShmComm(const char* id, int rank, int world_size, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world_size), timeout_(timeout), name_(segment_name(id)) {
    const auto deadline = Clock::now() + timeout;
    int fd = -1;
    if (rank == 0) {
        const size_t slot = slot_bytes_from_environment();
        const size_t data_offset = (ShmHeader::kRanksOffset + sizeof(RankState) * size_t(world_size) + 4095) / 4096 * 4096;
        mapped_bytes_ = data_offset + 2 * size_t(world_size) * slot;
        fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) throw std::runtime_error("shm_open(" + name_ + "): " + std::strerror(errno));
        if (ftruncate(fd, off_t(mapped_bytes_)) != 0) {
            const int err = errno;
            close(fd);
            shm_unlink(name_.c_str());
            throw OutOfMemory("cannot size the shared segment " + name_ + " to " + std::to_string(mapped_bytes_) +
                              " bytes: " + std::strerror(err));
        }
        void* base = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
            shm_unlink(name_.c_str());
            throw std::runtime_error("mmap of the shared segment " + name_ + ": " + std::strerror(errno));
        }
        header_ = static_cast<ShmHeader*>(base);  // (fresh pages are zeros: every word starts at 0)
        header_->world_size = uint32_t(world_size);
        header_->slot_bytes = slot;
        header_->data_offset = data_offset;
        header_->magic.store(kMagic, std::memory_order_release);
    } else {
        while (header_ == nullptr) {  // rank 0 may not have made (or laid out) the segment yet
            fd = shm_open(name_.c_str(), O_RDWR, 0);
            struct stat st {};
            if (fd >= 0 && fstat(fd, &st) == 0 && size_t(st.st_size) >= ShmHeader::kRanksOffset) {
                void* base = mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (base != MAP_FAILED) {
                    auto* header = static_cast<ShmHeader*>(base);
                    if (header->magic.load(std::memory_order_acquire) == kMagic) {
                        header_ = header;
                        mapped_bytes_ = size_t(st.st_size);
                    } else {
                        munmap(base, size_t(st.st_size));
                    }
                }
            }
            if (fd >= 0) close(fd);
            if (header_) break;
            if (Clock::now() > deadline)
                throw std::runtime_error("rank " + std::to_string(rank) + " found no communicator " + name_ +
                                         " made by rank 0 within " + seconds(timeout));
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (int(header_->world_size) != world_size) {
            const int made_for = int(header_->world_size);
            munmap(header_, mapped_bytes_);
            header_ = nullptr;
            throw InvalidArgument("rank 0 made this communicator for " + std::to_string(made_for) +
                                  " ranks; rank " + std::to_string(rank) + " says world_size " + std::to_string(world_size));
        }
    }
    RankState& me = header_->ranks()[rank];
    int32_t expected = 0;
    if (!me.pid.compare_exchange_strong(expected, int32_t(getpid()))) {
        munmap(header_, mapped_bytes_);
        header_ = nullptr;
        throw InvalidArgument("rank " + std::to_string(rank) + " joined the communicator twice (pid " +
                              std::to_string(expected) + " has it)");
    }
    header_->joined.fetch_add(1, std::memory_order_acq_rel);
    while (header_->joined.load(std::memory_order_acquire) < uint32_t(world_size)) {
        if (Clock::now() > deadline) {
            std::string missing;
            for (int r = 0; r < world_size; ++r)
                if (header_->ranks()[r].pid.load(std::memory_order_acquire) == 0)
                    missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            if (rank == 0) shm_unlink(name_.c_str());
            munmap(header_, mapped_bytes_);
            header_ = nullptr;
            throw std::runtime_error("rank(s) " + missing + " did not join the communicator within " + seconds(timeout));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (rank == 0) shm_unlink(name_.c_str());  // everyone has it mapped: the name is no longer needed
}

ShmComm::~ShmComm() {
    if (header_) munmap(header_, mapped_bytes_);
}

unsigned char* ShmComm::slot(uint32_t step, int rank) const {
    const size_t index = size_t(step & 1u) * size_t(world_) + size_t(rank);
    return reinterpret_cast<unsigned char*>(header_) + header_->data_offset + index * header_->slot_bytes;
}

std::string ShmComm::describe(const char* what) const {
    return std::string(what) + " #" + std::to_string(collectives_);
}

void ShmComm::check_aborted() const {
    const uint32_t by = header_->aborted.load(std::memory_order_acquire);
    if (by)
        throw std::runtime_error("the communicator was aborted by rank " + std::to_string(by - 1) + ": " +
                                 header_->ranks()[by - 1].reason);
}

void ShmComm::wake(std::atomic<uint32_t>& word) {
    if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

void ShmComm::wait_for(std::atomic<uint32_t>& word, uint32_t target, int peer, bool bounded, const char* what) {
    if (reached(word.load(std::memory_order_acquire), target)) return;
    const auto start = Clock::now();
    const auto spin = std::chrono::microseconds(spin_microseconds());
    for (unsigned i = 1; Clock::now() - start < spin; ++i) {  // the peer is usually a few microseconds away
        if (reached(word.load(std::memory_order_acquire), target)) return;
        if (i % 64 == 0) std::this_thread::yield();
    }
    const auto deadline = start + timeout_;
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    struct Awake {
        std::atomic<uint32_t>& sleepers;
        ~Awake() { sleepers.fetch_sub(1, std::memory_order_seq_cst); }
    } awake{header_->sleepers};
    for (;;) {
        const uint32_t seen = word.load(std::memory_order_seq_cst);
        if (reached(seen, target)) return;
        check_aborted();
        const auto now = Clock::now();
        if (bounded && now >= deadline)
            throw std::runtime_error(describe(what) + ": rank " + std::to_string(peer) + " is late: it did not arrive within " +
                                     seconds(timeout_));
        const int32_t pid = header_->ranks()[peer].pid.load(std::memory_order_relaxed);
        if (!process_alive(pid))
            throw std::runtime_error(describe(what) + ": rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                                     ") has exited");
        auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(kSleepSlice);
        if (bounded) slice = std::min(slice, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now));
        const timespec ts{time_t(slice.count() / 1000000000), long(slice.count() % 1000000000)};
        futex(word, FUTEX_WAIT, seen, &ts);
    }
}

template <class Read>
void ShmComm::step(const char* what, int kind, const void* contribute, size_t bytes, int root, Read&& read) {
    RankState* ranks = header_->ranks();
    const uint32_t k = ++step_;
    const uint64_t mine = tag(kind, root, bytes);
    for (int r = 0; r < world_; ++r)  // 1. the last readers of this buffer (step k - 2) are done with it
        if (r != rank_) wait_for(ranks[r].done, k - 2, r, true, what);
    if (contribute) std::memcpy(slot(k, rank_), contribute, bytes);  // 2. this rank's data, then its arrival
    ranks[rank_].what[k & 1u].store(mine, std::memory_order_relaxed);
    ranks[rank_].arrived.store(k, std::memory_order_seq_cst);
    wake(ranks[rank_].arrived);
    auto same_step = [&](int r) {  // (read after its `arrived`: its step k's tag, which it cannot change yet)
        const uint64_t theirs = ranks[r].what[k & 1u].load(std::memory_order_relaxed);
        if (theirs != mine)
            throw std::runtime_error(describe(what) + ": the ranks are out of step: rank " + std::to_string(r) +
                                     " is in a " + describe_tag(theirs) + ", rank " + std::to_string(rank_) +
                                     " in a " + describe_tag(mine));
    };
    if (root < 0) {  // 3. the ranks whose data this step reads
        for (int r = 0; r < world_; ++r)
            if (r != rank_) {
                wait_for(ranks[r].arrived, k, r, true, what);
                same_step(r);
            }
    } else if (root != rank_) {
        wait_for(ranks[root].arrived, k, root, false, what);  // a follower waits for its leader (backend.h)
        same_step(root);
    }
    read(k);  // 4.
    ranks[rank_].done.store(k, std::memory_order_seq_cst);  // 5.
    wake(ranks[rank_].done);
}

void ShmComm::all_reduce(int dtype, int64_t n, void* out, const void* in) {
    const size_t elem = dtype == LLAISYS_F32 ? 4 : (dtype == LLAISYS_F16 || dtype == LLAISYS_BF16) ? 2 : 0;
    if (!elem) unsupported_dtype(dtype);
    check_aborted();
    ++collectives_;
    const int64_t per_step = int64_t(header_->slot_bytes / elem);
    std::vector<const void*> sources(size_t(world_), nullptr);
    for (int64_t first = 0; first < n; first += per_step) {
        const int64_t count = std::min(per_step, n - first);
        const size_t offset = size_t(first) * elem;
        step("all_reduce", 1, static_cast<const unsigned char*>(in) + offset, size_t(count) * elem, -1, [&](uint32_t k) {
            for (int r = 0; r < world_; ++r) sources[size_t(r)] = slot(k, r);
            reduce_sum(dtype, count, static_cast<unsigned char*>(out) + offset, sources.data(), world_);
        });
    }
}

void ShmComm::all_gather(int64_t nbytes, void* out, const void* in) {
    check_aborted();
    ++collectives_;
    const int64_t per_step = int64_t(header_->slot_bytes);
    for (int64_t first = 0; first < nbytes; first += per_step) {
        const size_t count = size_t(std::min(per_step, nbytes - first));
        step("all_gather", 2, static_cast<const unsigned char*>(in) + first, count, -1, [&](uint32_t k) {
            for (int r = 0; r < world_; ++r)
                std::memcpy(static_cast<unsigned char*>(out) + size_t(r) * size_t(nbytes) + size_t(first), slot(k, r), count);
        });
    }
}

void ShmComm::broadcast(int64_t nbytes, void* data, int root) {
    if (root < 0 || root >= world_)
        throw InvalidArgument("root " + std::to_string(root) + " is not a rank of this communicator (world size " +
                              std::to_string(world_) + ")");
    check_aborted();
    ++collectives_;
    const int64_t per_step = int64_t(header_->slot_bytes);
    for (int64_t first = 0; first < nbytes; first += per_step) {
        const size_t count = size_t(std::min(per_step, nbytes - first));
        unsigned char* part = static_cast<unsigned char*>(data) + first;
        step("broadcast", 3, rank_ == root ? part : nullptr, count, root, [&](uint32_t k) {
            if (rank_ != root) std::memcpy(part, slot(k, root), count);
        });
    }
}

void ShmComm::abort(const std::string& reason) {
    RankState& me = header_->ranks()[rank_];
    if (header_->aborted.load(std::memory_order_acquire) == 0) {
        std::snprintf(me.reason, kReasonBytes, "%s", reason.c_str());
        uint32_t expected = 0;
        header_->aborted.compare_exchange_strong(expected, uint32_t(rank_ + 1), std::memory_order_acq_rel);
    }
    for (int r = 0; r < world_; ++r) {  // every sleeping wait wakes up and finds the flag
        futex(header_->ranks()[r].arrived, FUTEX_WAKE, INT_MAX, nullptr);
        futex(header_->ranks()[r].done, FUTEX_WAKE, INT_MAX, nullptr);
    }
}

}  // namespace llaisys::cpu
